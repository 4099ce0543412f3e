"""The checker shared by both engines: applies the rule (``rule.conversions``) and keeps summaries.

An engine calls ``Recorder.observe`` once per intercepted operation, after it ran. The recorder
keeps counts and tensor metadata, never tensors: storages are tracked by identity only, to link a
loss to the regain that undoes it, a mixed-format operation to the producer of its contiguous
input, and a conversion to the parameters it was computed from. Every new output evicts its
storage identity from all tracking, so a storage address reused by an unrelated tensor is
forgotten, not confused.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Any

import torch

from cl_audit.compat.autograd import current_autograd_node
from cl_audit.compat.fake_base import is_fake
from cl_audit.compat.operators import aten_op_name
from cl_audit.compat.storage import storage_key as _storage_key
from cl_audit.compat.storage import view_base
from cl_audit.enums import Conversion, Phase
from cl_audit.intercept.ledger import Ledger, OpRecord
from cl_audit.intercept.naming import is_copy, python_op_name
from cl_audit.intercept.origins import Origins
from cl_audit.intercept.tracking import tensor_arguments
from cl_audit.report import Finding, TimelineEvent
from cl_audit.report.environment import dtype_name
from cl_audit.rule.attribution import Location, ModuleNames, locate
from cl_audit.rule.conversions import (
    SPATIAL_RANKS,
    is_loss,
    is_regain,
)
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = ["TIMELINE_LIMIT", "Recorder"]

TIMELINE_LIMIT = 20_000  # events kept in a report's format timeline
_NODE_KEY = "cl_audit.location"  # where a forward operation leaves its location on its node

_CL = MemoryLayout.CHANNELS_LAST
_CONTIGUOUS = MemoryLayout.CONTIGUOUS
_OTHER = MemoryLayout.OTHER
_SPATIAL_RANKS = SPATIAL_RANKS
_Tensor = torch.Tensor
_SEQUENCES = (list, tuple)


def _operands(
    args: Any, kwargs: Any, result: Any
) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """An operation's tensor inputs and outputs; None where it gave no tensor (an operation
    writing its inputs in place and returning nothing, ``_foreach_add_``, has no outputs)."""
    inputs = tensor_arguments(args)
    if kwargs:
        inputs.extend(tensor_arguments(kwargs.values()))
    if isinstance(result, _Tensor):
        return inputs, [result]
    if type(result) in _SEQUENCES:
        return inputs, tensor_arguments(result)
    if result is None and inputs:
        return inputs, []
    return None


class Recorder:
    """Applies the rule to each operation and accumulates findings.

    ``parameters``: the model's parameters and buffers (real or fake tensors), the seed of
    parameter provenance; those of every root module ``names`` learns are added as it learns them.
    ``rule=False``: the ledger alone is fed (provenance kept, nothing tracked for findings).
    """

    def __init__(
        self,
        names: ModuleNames,
        parameters: Iterable[torch.Tensor] = (),
        timeline: bool = False,
        training: bool = False,
        ledger: Ledger | None = None,
        rule: bool = True,
    ) -> None:
        self._names = names
        self.ledger = ledger  # the cost ledger of this run, fed every operation
        # The format timeline: each operation with a 4D/5D output, in order, with its module
        # (a stack walk per such operation, so only when asked for).
        self.timeline: list[TimelineEvent] | None = [] if timeline else None
        self._mark: Conversion | None = None
        # Training: the step's phase, set by the caller; forward operations leave their location
        # on their autograd node, where the backward finds it (the module whose forward made it).
        self.phase = Phase.FORWARD
        self.training = training
        self._node: object | None = None  # the node a node-by-node backward runs
        # The observe this run needs, chosen once for the engines to call on every operation:
        # the ledger's alone (no rule), the rule (the common case), or the rule with the
        # timeline and a training step's naming around it (``_observe_more``). One attribute
        # lookup either way; per-operation tests of ``rule`` and ``timeline`` stay out of the
        # common path, and each variant reads as the steps it takes.
        if not rule:
            self.observe = self._observe_ledger  # type: ignore[method-assign]
        elif timeline or training:
            self.observe = self._observe_more  # type: ignore[method-assign]
        self.rule = rule
        self.calls_checked = 0
        self.first_spatial: tuple[str, str] | None = None  # (device, dtype), first 4D/5D input
        self._ops_seen: set[object] = set()
        self._cl_ordered: set[int] = set()  # new storages of channels_last data in another shape
        self._parameters: set[int] = set()  # parameter-derived storages
        self._tracked = Origins(self.locate, self._parameters)
        self._origins = self._tracked.by_storage  # the same dict, read on every operation
        self._held: list[object] = []  # storages of fake parameter-derived outputs, kept
        self._roots_seen = 0
        self._add_parameters(parameters)
        self._learn_roots()

    @property
    def distinct_ops(self) -> int:
        return len(self._op_names())

    def observe(
        self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any
    ) -> None:
        """Check one finished operation. ``python_op`` is a callable or a name, or None.

        Runs on every operation, so its steps are handed locals, and the common case (no
        contiguous data appeared, none is tracked) returns before the rule is applied."""
        self.calls_checked += 1
        self._ops_seen.add(aten_op if aten_op is not None else python_op)
        operands = _operands(args, kwargs, result)
        if operands is None:
            return
        inputs, outputs = operands
        out_keys, in_keys = self._provenance(inputs, outputs)
        sources: list[torch.Tensor] = []  # channels_last-ordered inputs
        reshaped: list[torch.Tensor] = []  # channels_last storage read in another shape
        contiguous: list[torch.Tensor] = []  # contiguous-ordered 4D/5D inputs
        self._sort_inputs(inputs, sources, reshaped, contiguous)
        if self.first_spatial is None and (sources or contiguous):
            first = (sources or contiguous)[0]
            self.first_spatial = (str(first.device), dtype_name(first.dtype))
        # Origins of the tracked contiguous data read, first first.
        found = self._tracked.read(inputs, in_keys) if in_keys is not None and self._origins else []
        ledger = self.ledger
        if ledger is not None and aten_op is not None:
            if in_keys is None:
                in_keys = [_storage_key(t) for t in inputs]
            cause = found[0].cause if found else None
            # By position, in OpRecord's order: keywords cost more (reports/pages/overhead.md).
            ledger.observe(
                OpRecord(self.calls_checked, self.phase, aten_op, python_op, inputs, outputs,
                         in_keys, out_keys, self._parameters, self.locate, cause)
            )  # fmt: skip
        if not (found or self._outputs_may_convert(outputs, sources, reshaped, contiguous)):
            return  # the common case: no contiguous data appeared, none is tracked
        if in_keys is None:
            in_keys = [_storage_key(t) for t in inputs]
        new = [  # outputs that own a new storage, with their keys
            (t, key)
            for t, key in zip(outputs, out_keys, strict=True)
            if key not in in_keys and t.numel()
        ]
        copy = is_copy(aten_op, python_op)
        lost = [(t, key) for t, key in new if is_loss(t, sources, reshaped, copy)]
        if lost:
            self._tracked.record_loss(
                self.phase, self.calls_checked, aten_op, python_op,
                inputs, outputs, lost, sources, reshaped, contiguous, found,
            )  # fmt: skip
            self._mark = Conversion.LOSS
            return
        regained = [t for t, _ in new if is_regain(t, contiguous)]
        if regained:
            self._tracked.record_regain(
                self.phase, self.calls_checked, aten_op, python_op,
                inputs, outputs, regained, contiguous,
            )  # fmt: skip
            self._mark = Conversion.REGAIN
            return
        if sources or reshaped:  # channels_last data written in another order (torch.stack)
            self._cl_ordered.update(key for t, key in new if layout_of(t) is _OTHER)
        if found:
            self._tracked.carry(aten_op, python_op, inputs, contiguous, found, new)
        elif not contiguous:  # else derived from data from outside the audit: untracked (OUTSIDE)
            self._tracked.start(aten_op, python_op, outputs, out_keys, new, sources)

    def _observe_ledger(
        self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any
    ) -> None:
        """``observe`` for a run whose ledger alone is read (``rule=False``): provenance and
        the bytes, no rule, nothing tracked for findings."""
        self.calls_checked += 1
        ledger = self.ledger
        if ledger is None or aten_op is None:
            return
        if self.training:
            python_op = self.python_op(python_op)
        operands = _operands(args, kwargs, result)
        if operands is None:
            return
        inputs, outputs = operands
        out_keys, in_keys = self._provenance(inputs, outputs)
        if in_keys is None:
            in_keys = [_storage_key(t) for t in inputs]
        ledger.observe(
            OpRecord(self.calls_checked, self.phase, aten_op, python_op, inputs, outputs,
                     in_keys, out_keys, self._parameters, self.locate, None)
        )  # fmt: skip

    def _provenance(
        self, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
    ) -> tuple[list[int], list[int] | None]:
        """The outputs' storage keys, their provenance and any storage reuse settled (on every
        operation, so each key is taken once); the inputs' keys where they were needed
        (``_forget_reused_storages``), else None."""
        out_keys = [_storage_key(t) for t in outputs]
        from_parameters = self._outputs_from_parameters(inputs, outputs)
        return out_keys, self._forget_reused_storages(inputs, outputs, out_keys, from_parameters)

    def _outputs_from_parameters(
        self, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
    ) -> bool:
        """Whether the outputs are parameter-derived: every input is. Made from no data, they
        are a constant when the model's own code makes them (an index, a grid), the batch when
        the caller does (an input made inside ``with audit():``); empty outputs hold no data
        (batch norm's inner ``empty``): no stack walk for them."""
        if not inputs:
            return not any(t.numel() for t in outputs) or self.locate().module_class is not None
        parameters = self._parameters
        for tensor in inputs:
            if _storage_key(tensor) not in parameters:
                return False
        return True

    def _forget_reused_storages(
        self,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        out_keys: list[int],
        from_parameters: bool,
    ) -> list[int] | None:
        """Forget what is tracked of an output's storage that no input holds (its identity
        reused by an unrelated tensor), and mark the outputs parameter-derived when they are:
        a fake one's storage is held until the audit ends, so that no tensor made where no
        operation is seen (an index torch makes from a Python list) can take a dropped one's
        identity. Only the storage (holding the fake tensor itself changed which operations
        torch's fake mode ran for convit's constants), and never a real one's (a gradient held
        is cloned by torch's engine rather than stolen, and its memory is real). Returns the
        inputs' storage keys where they were needed (always while contiguous data is tracked:
        it flows on through whatever reads it), else None."""
        origins = self._origins
        cl_ordered = self._cl_ordered
        parameters = self._parameters
        in_keys = [_storage_key(t) for t in inputs] if origins else None
        for key in out_keys:
            if key in origins or key in cl_ordered or (not from_parameters and key in parameters):
                if in_keys is None:
                    in_keys = [_storage_key(t) for t in inputs]
                if key not in in_keys:  # a storage identity reused: forget its past
                    origins.pop(key, None)
                    cl_ordered.discard(key)
                    parameters.discard(key)
        if from_parameters:
            parameters.update(out_keys)
            self._held.extend(t.untyped_storage() for t in outputs if is_fake(t))
        return in_keys

    def _sort_inputs(
        self,
        inputs: list[torch.Tensor],
        sources: list[torch.Tensor],
        reshaped: list[torch.Tensor],
        contiguous: list[torch.Tensor],
    ) -> None:
        """Sort the inputs by the order of their data into the lists given (empty): channels_last
        ``sources``, channels_last storage ``reshaped`` (a view of it in another shape, or data
        written in another order), and ``contiguous`` 4D/5D data (not a map permuted to NHWC)."""
        cl_ordered = self._cl_ordered
        for tensor in inputs:
            layout = layout_of(tensor)
            if layout is _CL:
                sources.append(tensor)
            elif layout is _CONTIGUOUS:
                if tensor.dim() in _SPATIAL_RANKS:
                    base = view_base(tensor)
                    if base is None or layout_of(base) is not _CL:
                        contiguous.append(tensor)
            elif layout is _OTHER:
                base = view_base(tensor)
                if (base is not None and layout_of(base) is _CL) or (
                    cl_ordered and _storage_key(tensor) in cl_ordered
                ):
                    reshaped.append(tensor)

    def _outputs_may_convert(
        self,
        outputs: list[torch.Tensor],
        sources: list[torch.Tensor],
        reshaped: list[torch.Tensor],
        contiguous: list[torch.Tensor],
    ) -> bool:
        """Whether the rule has anything to look at among the outputs (tracked data read aside):
        one may be a loss, a regain, channels_last data written in another order, or contiguous
        4D/5D data to track."""
        for tensor in outputs:
            layout = layout_of(tensor)
            if layout is _CONTIGUOUS:
                if sources or reshaped or tensor.dim() in _SPATIAL_RANKS:
                    return True
            elif layout is _CL:
                if contiguous:
                    return True
            elif layout is _OTHER and (sources or reshaped):  # maybe a stack of channels_last maps
                return True
        return False

    def _observe_more(
        self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any
    ) -> None:
        """``observe``, plus the timeline and the attribution of a training step's phases."""
        self._mark = None
        python_op = self.python_op(python_op)
        Recorder.observe(self, aten_op, python_op, args, kwargs, result)
        timeline = self.timeline
        if timeline is None or len(timeline) >= TIMELINE_LIMIT:
            return
        if isinstance(result, _Tensor):
            outputs = [result]
        else:
            outputs = tensor_arguments(result) if type(result) in _SEQUENCES else []
        spatial = next((t for t in outputs if t.dim() in _SPATIAL_RANKS), None)
        if spatial is None:
            return
        name = python_op_name(python_op) if python_op is not None else aten_op_name(aten_op)
        event = TimelineEvent(
            op=name,
            module_path=self.locate().module_path,
            shape=tuple(spatial.shape),
            strides=tuple(spatial.stride()),
            layout=layout_of(spatial),
            mark=self._mark,
        )
        timeline.append(event)

    def python_result(self, result: Any) -> None:
        """A training audit's forward: leave this Python-level call's location on every new
        autograd node behind its result (the call's own and those of the operations inside
        it), where the backward finds it: the module whose forward made the node."""
        if not self.training or self.phase is not Phase.FORWARD:
            return
        if isinstance(result, _Tensor):
            stack = [result.grad_fn]
        elif type(result) in _SEQUENCES:
            stack = [t.grad_fn for t in tensor_arguments(result)]
        else:
            return
        location = None
        while stack:
            node = stack.pop()
            if node is None or _NODE_KEY in node.metadata:
                continue
            location = location or self.locate()
            node.metadata[_NODE_KEY] = location
            stack.extend(next_node for next_node, _ in node.next_functions)

    def _add_parameters(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            try:
                self._parameters.add(_storage_key(tensor))
            except (RuntimeError, NotImplementedError):  # no storage (sparse, nested)
                continue

    def _learn_roots(self) -> None:
        """Seed parameter provenance with the parameters and buffers of roots ``names`` holds."""
        roots = self._names.roots
        while self._roots_seen < len(roots):
            root = roots[self._roots_seen]
            self._roots_seen += 1
            self._add_parameters(chain(root.parameters(), root.buffers()))

    def running(self, node: object | None) -> None:
        """The autograd node a backward run node by node is running (None: between nodes);
        torch's engine tells ``current_autograd_node`` instead."""
        self._node = node

    def _backward_node(self) -> Any:
        return self._node if self._node is not None else current_autograd_node()

    def python_op(self, python_op: object) -> object:
        """What names an operation: its Python-level call, in a backward the autograd node
        running (the backward of the call that made it)."""
        if self.phase is Phase.BACKWARD:
            node = self._backward_node()
            return None if node is None else node.name()
        return python_op

    def locate(self) -> Location:
        """Where an operation belongs (see ``python_op``): module, class and call site."""
        if self.phase is Phase.BACKWARD:
            node = self._backward_node()
            left = None if node is None else node.metadata.get(_NODE_KEY)
            if left is not None:
                return left
        location = locate(self._names)
        self._learn_roots()  # an audit without a model learns it from the stack
        return location

    def findings(
        self, call_times: dict[int, float] | None = None
    ) -> tuple[list[Finding], list[Finding]]:
        """(losses, regains), most bytes first (``Origins.findings``)."""
        return self._tracked.findings(call_times)

    def _op_names(self) -> set[str]:
        return {
            aten_op_name(op) if hasattr(op, "overloadpacket") else python_op_name(op)
            for op in self._ops_seen
            if op is not None
        }
