"""The public context manager: ``with cl_audit.audit() as a: model(x)``, then ``a.report()``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from cl_audit.enums import CallLabels, DifferentialStatus, Engine, Phase, Provenance
from cl_audit.errors import AuditError
from cl_audit.execution.assemble import assemble
from cl_audit.execution.settings import check_engine, parse_engine
from cl_audit.intercept.dispatch import DispatchEngine
from cl_audit.intercept.ledger import Ledger
from cl_audit.intercept.observer import Observer, Tee
from cl_audit.intercept.patch import PatchEngine
from cl_audit.intercept.recorder import Recorder
from cl_audit.report import DifferentialRun, ModelReport
from cl_audit.report.environment import autocast_in_effect, dtype_name
from cl_audit.report.sections import Conditions, Observed, Training
from cl_audit.rule.attribution import ModuleNames

__all__ = ["Audit", "audit", "watching"]

_ENGINES: dict[Engine, type[DispatchEngine | PatchEngine]] = {
    Engine.DISPATCH: DispatchEngine,
    Engine.PATCH: PatchEngine,
}
_active_lock = threading.Lock()
_active: object = None  # the audit or watcher whose engine is installed
_NOT_COMPARED = DifferentialRun(
    DifferentialStatus.SKIPPED, "the audit() context manager runs no NCHW comparison"
)
_NO_NCHW_STEP = DifferentialRun(DifferentialStatus.SKIPPED, "no NCHW step was run")


def _claim(claimant: object) -> None:
    global _active
    with _active_lock:
        if _active is not None:
            raise AuditError("an audit is already active; cl-audit audits cannot be nested")
        _active = claimant


def _release() -> None:
    global _active
    with _active_lock:
        _active = None


@contextlib.contextmanager
def watching(engine: Engine, observer: Observer) -> Iterator[None]:
    """``observer`` sees every torch operation run inside, with an audit's guarantees: no
    nesting, torch restored on exit. The NCHW run of a differential audit uses it."""
    impl = _ENGINES[engine](observer)
    _claim(impl)
    try:
        impl.install()
        yield
    finally:
        try:
            impl.uninstall()
        finally:
            _release()


class Audit:
    """Checks every torch operation run inside ``with`` and builds a report afterwards.

    Audits do not nest: entering one while another is active raises ``AuditError``. Whatever
    happens inside, torch is restored on exit. Nothing is printed: render ``report()`` yourself.
    ``parameters`` adds tensors that count as parameters beside ``model``'s own (the fake
    copies of a functional call); ``timeline`` records every operation with a 4D/5D output
    for the HTML report's format timeline (a stack walk each: slower); ``training`` attributes
    backward events to the module whose forward made them (see ``enter_phase``);
    ``label_calls`` runs each operation in a profiler range named by its call number, so that
    ``report(call_times=...)`` can give each finding its profiled time (``CallLabels.FIRST``:
    only the first call of each signature, the others listed in ``repeats``); ``ledger`` (dispatch
    engine) counts the bytes written and copied, for a cost comparison; ``also`` is another
    observer of every operation (the NCHW run's counterpart watcher); ``findings=False`` keeps
    the ledger alone (the NCHW run, which is weighed, never reported): no rule is applied, and
    ``observed()`` and ``report()`` refuse.
    """

    def __init__(
        self,
        engine: Engine | str = Engine.DISPATCH,
        model: nn.Module | None = None,
        parameters: Iterable[torch.Tensor] = (),
        timeline: bool = False,
        training: bool = False,
        label_calls: bool | CallLabels = False,
        ledger: Ledger | None = None,
        also: Observer | None = None,
        findings: bool = True,
    ) -> None:
        self.engine = parse_engine(engine)
        labels = CallLabels.of(label_calls)
        check_engine(self.engine, train=training, time=labels is not CallLabels.NONE)
        self._recorder = Recorder(
            ModuleNames(model),
            parameters=parameters,
            timeline=timeline,
            training=training,
            ledger=ledger,
            rule=findings,
        )
        recorder = self._recorder
        self._impl = _ENGINES[self.engine](
            recorder if also is None else Tee(recorder, also),
            label_calls=labels,
            on_python_result=recorder.python_result if training else None,
        )
        self._entered = False
        self._autocast: str | None = None

    def __enter__(self) -> Audit:
        if self._entered:
            raise AuditError("this audit was already used; create a new one")
        _claim(self)
        self._entered = True
        try:
            self._autocast = autocast_in_effect()
            self._impl.install()
        except BaseException:
            _release()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._impl.uninstall()
        finally:
            _release()

    @property
    def repeats(self) -> dict[int, int]:
        """Each call left unlabelled (``CallLabels.FIRST``) -> the first call of its
        signature, whose measured copies stand for its own."""
        impl = self._impl
        return impl.repeats if isinstance(impl, DispatchEngine) else {}

    def enter_phase(self, phase: Phase) -> None:
        """What the operations from now on belong to: a training step's forward, backward or
        optimizer step (``training=True``)."""
        self._recorder.phase = phase

    def observed(self, call_times: dict[int, float] | None = None) -> Observed:
        """What ran so far, as the audited run's section: losses of parameter-derived data
        apart from the offenders; ``call_times`` (milliseconds by call number) times each
        finding."""
        if not self._entered:
            raise AuditError("nothing audited yet: run the model inside 'with audit:' first")
        if not self._recorder.rule:
            raise AuditError("this audit kept its ledger alone (findings=False): no findings")
        device, dtype = self._recorder.first_spatial or (None, None)
        losses, regains = self._recorder.findings(call_times)
        return Observed(
            calls_checked=self._recorder.calls_checked,
            distinct_ops=self._recorder.distinct_ops,
            offenders=tuple(f for f in losses if f.provenance is Provenance.BATCH),
            regains=tuple(regains),
            parameter_conversions=tuple(f for f in losses if f.provenance is Provenance.PARAMETER),
            unwrapped=self._impl.unwrapped,
            timeline=tuple(self._recorder.timeline or ()),
            device=device,
            dtype=dtype,
        )

    def running(self, node: object | None) -> None:
        """The autograd node whose backward runs from now on, for a backward run node by node
        (``cl_audit.fake.backward``; None: none); torch's engine needs no telling."""
        self._recorder.running(node)

    def report(
        self,
        *,
        model: str | None = None,
        input_shape: tuple[int, ...] | None = None,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        autocast: str | None = None,
        training: Training | None = None,
    ) -> ModelReport:
        """The findings so far, as a report with no NCHW comparison. Device and dtype default
        to those of the first 4D/5D input seen, ``autocast`` to the state when the audit began;
        ``training`` (a training step's optimizer and gradient layouts) makes it a training
        step's report."""
        conditions = Conditions(
            engine=self.engine,
            device=device,
            dtype=None if dtype is None else dtype_name(dtype),
            autocast=autocast or self._autocast,
        )
        return assemble(
            self.observed(),
            conditions,
            model=model,
            input_shape=input_shape,
            differential=_NOT_COMPARED if training is None else _NO_NCHW_STEP,
            training=training,
        )


def audit(
    engine: Engine | str = Engine.DISPATCH,
    *,
    model: nn.Module | None = None,
    parameters: Iterable[torch.Tensor] = (),
    timeline: bool = False,
    training: bool = False,
    label_calls: bool | CallLabels = False,
    ledger: Ledger | None = None,
    also: Observer | None = None,
    findings: bool = True,
) -> Audit:
    """``with cl_audit.audit() as a: model(x)`` then ``a.report()``.

    Passing ``model`` names modules from it and tells its parameters and buffers apart from
    activations; without it modules are learned from the call stack.
    """
    return Audit(engine, model, parameters, timeline, training, label_calls, ledger, also, findings)
