"""pytest plugin, registered through the ``pytest11`` entry point: installing cl-audit is enough.

- the ``cl_audit`` fixture: ``cl_audit.check(model, x)`` audits a model (converted to
  channels_last, compared with NCHW) and fails the test when its channels_last-only cost
  reaches the gate (1% of the bytes written and 1 MiB at batch 32, projected from the test's
  batch as ``assert_keeps_channels_last`` does; ``--cl-audit-strict``: any cost, any
  offender); ``with cl_audit.block(): ...`` audits the torch operations of a block as they
  run, in whatever format the test gives them;
- the ``cl_audit`` marker: ``@pytest.mark.cl_audit(train=False, amp=None, allow=())`` audits,
  after the test passed, every model the test ran (each module called from outside any other
  module, with the first input it got), converted to channels_last;
- ``--cl-audit-baseline FILE``: offences recorded in FILE (a ``cl-audit.sweep`` JSON, one row per
  audited model, keyed ``test id::model``) pass, anything new fails: the CLI's ``--baseline``
  semantics. ``--cl-audit-update`` writes what this run found to FILE instead of failing (rows
  of tests that did not run are kept).

``allow`` takes op patterns or ``(op, call-site)`` pattern pairs (see ``cl_audit.testing``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["ClAudit"]

_STATE = pytest.StashKey["_Session"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cl-audit", "channels_last audits (cl-audit)")
    group.addoption(
        "--cl-audit-baseline",
        metavar="FILE",
        help="Sweep JSON of known offences: they pass, new ones fail.",
    )
    group.addoption(
        "--cl-audit-strict",
        action="store_true",
        # argparse formats help with %: a literal one is written %%
        help="Fail on any channels_last-only cost and any offender, not only on a cost that "
        "reaches the gate (1%% of the bytes written and 1 MiB, at batch 32).",
    )
    group.addoption(
        "--cl-audit-update",
        action="store_true",
        help="Write this run's offences to --cl-audit-baseline instead of failing on them.",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cl_audit(train=False, amp=None, allow=()): audit in channels_last every model the "
        "test ran, after it passed",
    )
    baseline = config.getoption("--cl-audit-baseline")
    update = config.getoption("--cl-audit-update")
    if update and not baseline:
        raise pytest.UsageError("--cl-audit-update needs --cl-audit-baseline FILE")
    strict = config.getoption("--cl-audit-strict")
    config.stash[_STATE] = _Session(None if baseline is None else Path(baseline), update, strict)


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is not None:
        state.write()


def _op_id(found: Any) -> str:
    """The op of an offender (``Finding.op_id``) or of a cost site (its aten name)."""
    return found.op_id if hasattr(found, "op_id") else found.aten_op or found.op


class _Session:
    """The baseline read once, and the rows of this run (written back with --cl-audit-update)."""

    def __init__(self, path: Path | None, update: bool, strict: bool = False) -> None:
        self.path, self.update, self.strict = path, update, strict
        self.rows: dict[str, Any] = {}
        self._known: dict[str, set[str]] | None = None
        self._old_rows: list[Any] = []

    def _load(self) -> dict[str, set[str]]:
        """The baseline's offending op ids by key (read once; none when updating a new file)."""
        if self._known is None:
            self._known = {}
            if self.path is not None and (self.path.exists() or not self.update):
                from cl_audit.errors import UsageError
                from cl_audit.report.files import read_sweep

                try:
                    baseline = read_sweep(self.path)
                except UsageError as e:
                    raise pytest.UsageError(f"--cl-audit-baseline: {e}") from None
                self._old_rows = list(baseline.models)
                for row in baseline.models:
                    sites = row.cost.sites if row.cost is not None else ()
                    self._known[row.name] = {f.op_id for f in row.offenders} | {
                        s.aten_op or s.op for s in sites if s.extra
                    }
        return self._known

    def check(self, key: str, report: Any, allow: Iterable[Any], label: str) -> None:
        """Record ``report`` under ``key``; raise ``AssertionError`` on offenders that neither
        ``allow`` nor the baseline (unless updating it) accounts for."""
        from cl_audit.enums import Mode, ModelSource
        from cl_audit.integrations.assertion import offender_table, unexpected
        from cl_audit.render.wording import plural
        from cl_audit.report import ModelRow

        self.rows[key] = ModelRow.from_report(report, key, ModelSource.USER, Mode.EAGER)
        found = unexpected(report, allow, self.strict)
        if self.path is not None:
            known = self._load().get(key, set())
            if self.update:
                return
            found = tuple(f for f in found if _op_id(f) not in known)
        if found:
            where = " (not in the baseline)" if self.path is not None else ""
            raise AssertionError(
                f"{label} loses channels_last: {plural(len(found), 'site')} not "
                f"allowed{where}\n{offender_table(found, train=report.environment.train)}"
            )

    def write(self) -> None:
        if not (self.update and self.path is not None and self.rows):
            return
        from cl_audit.enums import Engine
        from cl_audit.execution.assemble import environment_of
        from cl_audit.report import SweepReport
        from cl_audit.report.files import write_json
        from cl_audit.report.sections import Conditions

        self._load()  # the old rows: those of tests that did not run are kept
        rows = {row.name: row for row in self._old_rows}
        rows.update(self.rows)
        environment = environment_of(Conditions(engine=Engine.DISPATCH))
        report = SweepReport.build(environment, {"pytest": True}, list(rows.values()))
        write_json(self.path, report, "--cl-audit-baseline")


class ClAudit:
    """The ``cl_audit`` fixture of one test."""

    def __init__(self, node_id: str, session: _Session) -> None:
        self._node_id, self._session = node_id, session
        self.reports: list[Any] = []

    def check(
        self,
        model: Any,
        example_input: Any,
        *,
        name: str | None = None,
        train: bool = False,
        amp: str | None = None,
        allow: Iterable[Any] = (),
        convert: bool | str = True,
    ) -> Any:
        """Audit ``model`` on ``example_input`` (see ``assert_keeps_channels_last``); fail the
        test on an offender that is neither allowed nor in the baseline. Returns the report."""
        from cl_audit.phases.audit_module import audit_model

        label = name or type(model).__name__
        report = audit_model(  # a gate: remedies stay leads (cl-audit MODEL proves them)
            model, example_input, name=label, train=train, amp=amp, convert=convert, verify=False
        )
        self.reports.append(report)
        self._session.check(f"{self._node_id}::{label}", report, allow, label)
        return report

    @contextlib.contextmanager
    def block(self, name: str = "block", *, allow: Iterable[Any] = ()) -> Iterator[None]:
        """Audit the torch operations run inside, as they are (nothing converted); fail the
        test on exit on an offender that is neither allowed nor in the baseline."""
        from cl_audit.execution.audit_context import audit

        with audit() as active:
            yield
        report = active.report(model=name)
        self.reports.append(report)
        self._session.check(f"{self._node_id}::{name}", report, allow, name)


@pytest.fixture
def cl_audit(request: pytest.FixtureRequest) -> ClAudit:
    """Audits models or blocks of a test and fails it on an offender (see ``ClAudit``)."""
    return ClAudit(request.node.nodeid, request.config.stash[_STATE])


class _RootCalls:
    """Every module called from outside any other module while installed, with its first
    inputs (tensors copied), through torch's global module hooks."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        self._seen: set[int] = set()
        self._depth = 0
        self._handles: list[Any] = []

    def __enter__(self) -> _RootCalls:
        from torch.nn.modules import module

        self._handles = [
            module.register_module_forward_pre_hook(self._pre),
            module.register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._handles:
            handle.remove()

    def _pre(self, module: Any, args: tuple[Any, ...]) -> None:
        import torch

        if self._depth == 0 and id(module) not in self._seen:
            self._seen.add(id(module))
            copied = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
            self.calls.append((module, copied))
        self._depth += 1

    def _post(self, module: Any, args: Any, output: Any) -> None:
        self._depth -= 1


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("cl_audit")
    if marker is None:
        return (yield)
    with _RootCalls() as calls:
        result = yield
    _audit_marked(item, marker.kwargs, calls.calls)
    return result


def _audit_marked(item: pytest.Item, options: dict[str, Any], calls: list[Any]) -> None:
    """Audit each model the test ran, on a copy (the test's objects stay as they were)."""
    import torch

    session = item.config.stash[_STATE]
    allow = options.get("allow", ())
    audited = 0
    for module, args in calls:
        if not any(isinstance(a, torch.Tensor) and a.dim() in (4, 5) for a in args):
            continue  # not an image or clip model: nothing to keep in channels_last
        fixture = ClAudit(item.nodeid, session)
        label = f"{type(module).__name__}#{audited}"
        audited += 1
        fixture.check(
            copy.deepcopy(module),
            args,
            name=label,
            train=options.get("train", False),
            amp=options.get("amp"),
            allow=allow,
        )
    if not audited:
        raise AssertionError("@pytest.mark.cl_audit: the test ran no model on a 4D or 5D input")
