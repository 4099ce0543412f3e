"""The cost ledger of one run: the bytes every operation writes, and the bytes it copies, by
place (phase, module, call site, operation), so that a channels_last run can be compared with
the same forward or step in NCHW (``cl_audit.compare.cost_sites``).

Copies are counted three ways, by strides and storage identity only:
- an explicit copy operation (``clone``, ``_to_copy``, ``copy_``: what ``contiguous``,
  ``reshape``, ``flatten`` and ``.to`` copy with) writes its new outputs;
- a conversion inside a kernel, which the dispatch level cannot see: *predicted* when an
  operation that is neither elementwise, a reduction, a view, a strided gather, a reader of
  metadata only (``new_full``, ``empty_like``) nor a kernel that copies its input in either
  order (``slice_backward``) is handed a
  4D/5D input in the other order than its 4D/5D output (a convolution converting a contiguous
  input to its channels_last output, a softmax writing its channels_last input contiguous), or
  a channels_last input when it returns no 4D/5D tensor (``im2col``), or a strided input that
  this torch's kernel was measured to copy on this device (``KernelCopies``: a softmax of
  transposed tokens, a layer norm of a permuted map); in an eager run the bytes
  are *measured* instead: the profiler's ``aten::copy_`` events inside each operation
  (``add_measured``), placed at every such operation with a 4D/5D input or a strided input
  of another rank, and elsewhere at an unlocated place of the operation's name;
- an elementwise operation reading 4D/5D inputs of both orders copies nothing (strided reads):
  it is listed apart as mixed.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

import torch

from cl_audit.compat.operators import aten_op_name, op_traits
from cl_audit.enums import Phase
from cl_audit.intercept.naming import python_op_name
from cl_audit.intercept.tracking import nbytes
from cl_audit.predict.divergences import KernelCopies
from cl_audit.predict.speed_model import OpTimes
from cl_audit.registry import OpClass, classes_of
from cl_audit.report import Producer
from cl_audit.rule.attribution import Location
from cl_audit.rule.conversions import SPATIAL_RANKS
from cl_audit.rule.layout import MemoryLayout, Strides, layout_of, map_strides, stride_class

__all__ = ["Cause", "Ledger", "OpRecord", "Place", "Shapes"]


_CONVOLUTION = torch.ops.aten.convolution.default
# a layout mismatch converts nothing where an operation reads no data (``x.new_full((n, 1), v)``
# of a channels_last map) or makes a view
_READS_NO_DATA = frozenset({OpClass.METADATA_READ, OpClass.VIEW})
_READS_ANY_STRIDES = frozenset({OpClass.STRIDED_READ, OpClass.POINTWISE})
_CL = MemoryLayout.CHANNELS_LAST
_CONTIGUOUS = MemoryLayout.CONTIGUOUS
_ORDERED = (_CL, _CONTIGUOUS)

# (fix site, root cause) of the contiguous data an operation read: the writer of its order, and
# where its run began (``Origin.cause``)
Cause = tuple[Producer, Producer | None]
# the shape an explicit copy read, and the shape its Python call returned
Shapes = tuple[tuple[int, ...], tuple[int, ...]]


class Place(NamedTuple):
    """Where copies land: the key of the ledger's tables. Made only at operations that copy
    (a few hundred a run), so a named tuple's construction costs nothing that shows
    (reports/pages/overhead.md); it hashes and compares as a tuple."""

    phase: Phase
    parameter: bool  # every input it copied is parameter-derived
    in_kernel: bool  # a conversion inside a kernel, not an explicit copy
    module_path: str | None
    module_class: str | None
    call_site: str | None
    python_op: str | None
    aten_op: str | None


class _Kind(Enum):
    """How the ledger reads an operation (decided once per operator, ``Ledger._kind``): an
    explicit copy, a kernel that may convert its input, an elementwise or strided read (mixed
    inputs copy nothing), or anything else (reductions, views, metadata). Compared by
    identity on every operation, as fast as small ints (reports/pages/overhead.md)."""

    COPY = "copy"
    CONVERTS = "converts"
    MIXED = "mixed"
    OTHER = "other"


_COPY, _CONVERTS, _MIXED, _OTHER = _Kind.COPY, _Kind.CONVERTS, _Kind.MIXED, _Kind.OTHER


@dataclass(slots=True)
class OpRecord:
    """One operation as the ledger reads it, after it ran; the recorder builds it once per
    operation. ``call`` is its number in the run; ``in_keys`` and ``out_keys`` its tensors'
    storage identities; ``parameters`` the storages of parameter-derived data; ``locate`` finds
    its place (a stack walk, so only when asked); ``cause`` the (fix site, root cause) of the
    contiguous data among its inputs when the recorder traced one. Read only, yet not frozen: a
    frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, several
    times slower on every operation (reports/pages/overhead.md)."""

    call: int
    phase: Phase
    aten_op: object
    python_op: object
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    in_keys: list[int]
    out_keys: list[int]
    parameters: set[int]
    locate: Callable[[], Location]
    cause: Cause | None


def _strided_copy(
    strided: dict[tuple[int, int, str], float], index: int, tensor: torch.Tensor
) -> int:
    """The bytes a kernel copies of ``tensor``, its input ``index``, by the measured table."""
    kind = stride_class(tensor)
    if kind is None:
        return 0
    return round(strided.get((index, tensor.dim(), kind.value), 0.0) * nbytes([tensor]))


def _spatial_output(outputs: list[torch.Tensor]) -> tuple[MemoryLayout | None, bool]:
    """The order of the first non-empty 4D/5D output that has one, and whether any output
    is 4D/5D."""
    has_spatial_out = False
    for tensor in outputs:
        if tensor.dim() in SPATIAL_RANKS:
            has_spatial_out = True
            layout = layout_of(tensor)
            if layout in _ORDERED and tensor.numel():
                return layout, True
    return None, has_spatial_out


class Ledger:
    """Bytes written and copied in one run, by place. ``measured``: the conversions inside
    kernels will be measured (``add_measured``) rather than predicted from strides.
    ``written_fixed``: the part of ``written`` that does not grow with the batch (outputs
    derived from parameters alone, the parameters' gradients, the optimizer's step)."""

    def __init__(self, measured: bool = False, kernel_copies: KernelCopies | None = None) -> None:
        self.measured = measured
        self.kernel_copies = kernel_copies
        self._strided: dict[object, dict[tuple[int, int, str], float]] = {}  # op -> its copies
        self.written = 0
        self.written_fixed = 0  # by parameter-derived outputs and the optimizer: per step
        self.copies: dict[Place, list[int]] = {}  # place -> [count, bytes]
        self.strides: dict[Place, Strides | None] = {}  # place -> its first call's, in and out
        self.mixed: dict[Place, list[int]] = {}
        self.causes: dict[Place, Counter[Cause]] = {}
        self.unlocated = 0  # measured bytes at calls where no conversion was predicted
        self._calls: dict[int, Place] = {}  # call number -> place of a predicted conversion
        self._explicit: set[int] = set()  # call numbers of explicit copies
        self._sizes: dict[int, int] = {}  # call number -> element size of its first float input
        self._kinds: dict[object, tuple[_Kind, bool]] = {}  # op -> (kind, in place)
        self._phases: list[tuple[int, Phase]] = []
        # the backward's outputs (bytes, elements, the outputs they were made from), and the
        # latest output held by each storage (fake storages are reused within a step)
        self._backward: list[tuple[int, int, tuple[int, ...]]] = []
        self._latest: dict[int, int] = {}
        self.times = OpTimes()  # what the speed prediction prices (``predict.speed_model``)
        self.convolution_weights: set[int] = set()  # storages a convolution took as its weight
        # (call site, Python operation) of an explicit copy -> the shape it copied and the
        # shape the call returned (a reshape's copy, then its view: ``copy_shapes``)
        self.copy_shapes: dict[tuple[str | None, str | None], Shapes] = {}
        self._pending: tuple[tuple[str | None, str | None], int, object] | None = None

    def alike(self) -> Ledger:
        """An empty ledger that counts as this one does (for the NCHW run)."""
        twin = Ledger(self.measured, self.kernel_copies)
        twin.times.cut = self.times.cut
        return twin

    def _strided_copies(self, aten_op: object) -> dict[tuple[int, int, str], float]:
        """The strided inputs the kernel of ``aten_op`` copies inside, by (input position,
        rank, stride class), from the measured table; none without one."""
        known = self._strided.get(aten_op)
        if known is None:
            table = self.kernel_copies
            found = None if table is None else table.by_op.get(aten_op_name(aten_op))
            known = self._strided[aten_op] = found or {}
        return known

    def _kind(self, aten_op: object) -> tuple[_Kind, bool]:
        known = self._kinds.get(aten_op)
        if known is None:
            name = aten_op_name(aten_op)
            pointwise, reduction, view, in_place = op_traits(aten_op)
            classes = classes_of(name)
            if OpClass.COPY in classes or OpClass.COPY_INTO in classes:
                kind = _COPY
            elif pointwise or classes & _READS_ANY_STRIDES:
                kind = _MIXED
            elif reduction or view or classes & _READS_NO_DATA:
                kind = _OTHER
            elif OpClass.ALWAYS_COPIES in classes:
                kind = _CONVERTS if self.measured else _OTHER
            else:
                kind = _CONVERTS
            known = self._kinds[aten_op] = (kind, in_place or name == "aten.copy")
        return known

    def observe(self, record: OpRecord) -> None:
        """One operation, after it ran: what it wrote, then what it copied, by its kind."""
        if self._pending is not None:
            self._reshaped(record)
        times = self.times
        if times.cut is not None:  # the page's picture: the stage it ran in
            times.stage(record.phase, lambda: record.locate().module_path)
        times.observe(record.aten_op, record.inputs, record.outputs, record.phase)
        if record.aten_op is _CONVOLUTION and len(record.in_keys) > 1:
            self.convolution_weights.add(record.in_keys[1])
        if not self._phases or self._phases[-1][1] is not record.phase:
            self._phases.append((record.call, record.phase))
        kind, in_place = self._kind(record.aten_op)
        written = self._count_written(record, in_place)
        if kind is _OTHER or not record.outputs:  # no output (``_foreach_add_``): no copy
            return
        if kind is _COPY:
            if written:
                self._count_copy(record, written)
            return
        spatial_out, has_spatial_out = _spatial_output(record.outputs)
        if kind is _MIXED:
            if spatial_out is not None:
                self._count_mixed(record, spatial_out)
            return
        self._count_converted(record, spatial_out, has_spatial_out)

    def _count_written(self, record: OpRecord, in_place: bool) -> int:
        """The bytes the operation wrote (its new storages, or its inputs written in place),
        fixed where they are paid once per step, and the backward outputs followed."""
        phase, outputs, out_keys, in_keys = (
            record.phase,
            record.outputs,
            record.out_keys,
            record.in_keys,
        )
        written = nbytes(
            [t for t, key in zip(outputs, out_keys, strict=True) if in_place or key not in in_keys]
        )
        self.written += written
        if self._latest:  # a new storage: the freed backward output whose identity it took is gone
            for key in out_keys:
                if key not in in_keys:
                    self._latest.pop(key, None)
        if written:
            if phase is Phase.OPTIMIZER or (
                all(key in record.parameters for key in out_keys)
                and not self._writes_backward_output(in_place, in_keys, out_keys)
            ):
                self.written_fixed += written
                for key in out_keys:  # settled: a backward output's storage no longer
                    self._latest.pop(key, None)
            elif phase is Phase.BACKWARD:
                self._backward_outputs(outputs, out_keys, in_keys, in_place)
        if phase is Phase.OPTIMIZER and self._latest:
            self._gradients(in_keys)
        return written

    def _count_copy(self, record: OpRecord, written: int) -> None:
        """An explicit copy: what it wrote is copied, placed with its shapes."""
        self._explicit.add(record.call)
        parameter = all(key in record.parameters for key in record.in_keys)
        place = self._place(record, parameter, False)
        self._add(self.copies, place, written, record.cause)
        self._shapes(place, record)

    def _count_mixed(self, record: OpRecord, spatial_out: MemoryLayout) -> None:
        """An elementwise operation that wrote ``spatial_out``: the inputs it read in the other
        order."""
        other = _CONTIGUOUS if spatial_out is _CL else _CL
        read = nbytes(
            [t for t in record.inputs
             if t.dim() in SPATIAL_RANKS and t.numel() > 1 and layout_of(t) is other]
        )  # fmt: skip
        if read:
            self._add(self.mixed, self._place(record, False, True), read, None)

    def _count_converted(
        self, record: OpRecord, spatial_out: MemoryLayout | None, has_spatial_out: bool
    ) -> None:
        """A kernel's conversions of its inputs: a map in the order its output does not have,
        or a strided read that the kernel copies (predicted); measured, the profiler's copies
        are placed at the kernel instead."""
        inputs, in_keys, parameters = record.inputs, record.in_keys, record.parameters
        measured = self.measured
        strided = None if measured else self._strided_copies(record.aten_op)
        converted = 0
        parameter = True
        floating_in = False
        for index, (tensor, key) in enumerate(zip(inputs, in_keys, strict=True)):
            if not tensor.is_floating_point():
                continue
            floating_in = True
            if tensor.dim() in SPATIAL_RANKS:
                layout = layout_of(tensor)
                if (
                    layout in _ORDERED and layout is not spatial_out
                    if spatial_out is not None
                    else not has_spatial_out and layout is _CL
                ):
                    copied = nbytes([tensor])
                elif strided and layout is MemoryLayout.OTHER:  # a permuted map (attention)
                    copied = _strided_copy(strided, index, tensor)
                else:
                    continue
            elif strided:
                copied = _strided_copy(strided, index, tensor)
            else:
                continue
            if copied:
                converted += copied
                parameter = parameter and key in parameters
        # Measured, every kernel with a floating-point input is placed whatever its strides, in
        # both runs alike, so that the copies the profiler finds inside it land at one place in
        # both (convolution_backward copies inside on the CPU with every input channels_last;
        # the CPU softmax makes a strided 3-D input contiguous first; slice_backward copies its
        # gradient into zeros, contiguous or not).
        if converted or (measured and floating_in):
            place = self._place(record, parameter and bool(converted), True)
            if measured:
                self._calls[record.call] = place
                self._sizes[record.call] = next(
                    (t.element_size() for t in inputs if t.is_floating_point()), 4
                )
                self._cause(place, record.cause)
            else:
                self._add(self.copies, place, converted, record.cause)

    def _writes_backward_output(
        self, in_place: bool, in_keys: list[int], out_keys: list[int]
    ) -> bool:
        """Whether an in-place write copies a backward output into its storage (a storage the
        recorder calls parameter-derived: ``AccumulateGrad`` laying a gradient out as its
        parameter, in a ``new_empty_strided`` made at the module): it is followed as a backward
        output then, so that the optimizer reading it settles the chain behind it."""
        if not in_place:
            return False
        latest = self._latest
        return any(key in latest for key in in_keys if key not in out_keys)

    def _backward_outputs(
        self, outputs: list[torch.Tensor], out_keys: list[int], in_keys: list[int], in_place: bool
    ) -> None:
        latest, backward = self._latest, self._backward
        sources = tuple(latest[key] for key in in_keys if key in latest)
        for tensor, key in zip(outputs, out_keys, strict=True):
            if in_place or key not in in_keys:
                latest[key] = len(backward)
                numel = tensor.numel()
                backward.append((numel * tensor.element_size(), numel, sources))

    def _gradients(self, keys: list[int]) -> None:
        """The backward's outputs that the optimizer reads (the parameters' gradients), and
        the same gradients' earlier forms (backward outputs of as many elements they were made
        from: a cast, a sum of two), are paid once per step: fixed."""
        backward, latest = self._backward, self._latest
        stack = [latest.pop(key) for key in keys if key in latest]
        while stack:
            entry = stack.pop()
            size, numel, sources = backward[entry]
            if size < 0:
                continue  # settled already
            backward[entry] = (-1, numel, sources)
            self.written_fixed += size
            stack.extend(s for s in sources if backward[s][1] == numel)

    def add_measured(
        self, copies: dict[int, list[tuple[int, int | None]]], names: dict[int, str]
    ) -> None:
        """The profiler's copies inside each operation (by call number: elements and element
        size, the size None where the profiler records no dtype, then the size of the call's
        first floating-point input; ``names`` the operation's name there), counted at the
        call's place, else at an unlocated place of that operation. Explicit copies were
        counted already."""
        for call, events in copies.items():
            size = self._sizes.get(call, 4)
            copied = sum(numel * (element or size) for numel, element in events)
            if call in self._explicit or not copied:
                continue
            place = self._calls.get(call)
            if place is None:
                self.unlocated += copied
                phase = self._phase_of(call)
                place = Place(phase, False, True, None, None, None, None, names.get(call))
            entry = self.copies.setdefault(place, [0, 0])
            entry[0] += 1
            entry[1] += copied

    def converted_in_kernels(self) -> int:
        """The bytes converted inside kernels (predicted, or measured and placed)."""
        return sum(entry[1] for place, entry in self.copies.items() if place.in_kernel)

    def _phase_of(self, call: int) -> Phase:
        index = bisect.bisect_right(self._phases, call, key=lambda p: p[0]) - 1
        return self._phases[max(index, 0)][1] if self._phases else Phase.FORWARD

    def _place(self, record: OpRecord, parameter: bool, in_kernel: bool) -> Place:
        location = record.locate()
        python_op = record.python_op
        place = Place(
            record.phase,
            parameter,
            in_kernel,
            location.module_path,
            location.module_class,
            location.call_site,
            None if python_op is None else python_op_name(python_op),
            aten_op_name(record.aten_op),
        )
        self.strides.setdefault(place, map_strides(record.inputs, record.outputs))
        return place

    def _shapes(self, place: Place, record: OpRecord) -> None:
        """The first explicit copy at a call site: the shape it copied, and its own output's
        as the call's result until a view of it in the same call says otherwise."""
        key = (place.call_site, place.python_op)
        if key in self.copy_shapes or not record.inputs or not record.outputs:
            return
        self.copy_shapes[key] = (tuple(record.inputs[0].shape), tuple(record.outputs[0].shape))
        self._pending = (key, record.out_keys[0], record.python_op)

    def _reshaped(self, record: OpRecord) -> None:
        """The operation right after a copy: a view of the copy in the same Python call (a
        reshape's ``clone``, then its ``_unsafe_view``) gives the call's result shape."""
        assert self._pending is not None
        key, copied, python_op = self._pending
        self._pending = None
        if record.python_op is python_op and record.in_keys[:1] == [copied] and record.outputs:
            self.copy_shapes[key] = (self.copy_shapes[key][0], tuple(record.outputs[0].shape))

    def _add(
        self, table: dict[Place, list[int]], place: Place, size: int, cause: Cause | None
    ) -> None:
        entry = table.setdefault(place, [0, 0])
        entry[0] += 1
        entry[1] += size
        self._cause(place, cause)

    def _cause(self, place: Place, cause: Cause | None) -> None:
        if cause is not None:
            self.causes.setdefault(place, Counter())[cause] += 1
