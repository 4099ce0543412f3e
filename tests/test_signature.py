"""A measured run labels only the first call of each signature (``CallLabels.FIRST``), the
profiler recording nothing else, and gives the other calls that call's copies: the ledger
equals a run labelling every call, on loops of small operations and on a training step."""

from __future__ import annotations

import torch
from torch import nn

from cl_audit.compat.profiler_events import profiled_ops
from cl_audit.enums import CallLabels
from cl_audit.execution.audit_context import audit
from cl_audit.execution.timing import Profiler, copies_by_call, repeated
from cl_audit.intercept.dispatch import CALL_LABEL
from cl_audit.intercept.ledger import Ledger
from cl_audit.intercept.signature import call_signature

_ADD = torch.ops.aten.add.Tensor


class _KeypointLoop(nn.Module):
    """SuperPoint's shape: a convolution, a softmax over the channels (a copy inside the kernel
    on a channels_last map, every call), then a Python loop of small operations."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        for _ in range(3):
            y = y + y.softmax(dim=1)  # over the channels: converted inside, thrice alike
        points = y.flatten(1)[:, :20]
        total = torch.zeros(())
        for i in range(points.shape[1]):
            p = points[:, i]
            total = total + (p >= 0).float().sum() + p.clamp(-1, 1).sum()
        return total


def _measured(
    model: nn.Module, x: torch.Tensor, labels: CallLabels, train: bool
) -> tuple[Ledger, int, int]:
    """The run's ledger, its labelled calls and the calls left unlabelled."""
    ledger = Ledger(measured=True)
    with (
        audit(model=model, label_calls=labels, ledger=ledger, training=train, findings=False) as a,
        Profiler(torch.device("cpu"), shapes=True) as profiler,
    ):
        if train:
            model(x).backward()
        else:
            with torch.no_grad():
                model(x)
    ledger.add_measured(*repeated(copies_by_call(profiler), a.repeats))
    labelled = sum(op.name.startswith(CALL_LABEL) for op in profiler.ops)
    return ledger, labelled, len(a.repeats)


def _copies(ledger: Ledger) -> dict[object, tuple[int, int]]:
    return {place: (entry[0], entry[1]) for place, entry in ledger.copies.items()}


def test_a_run_labelling_each_signature_once_weighs_what_labelling_every_call_does() -> None:
    for train in (False, True):
        torch.manual_seed(0)
        model = _KeypointLoop().to(memory_format=torch.channels_last)
        x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
        every, _, _ = _measured(model, x, CallLabels.EVERY, train)
        model.zero_grad(set_to_none=True)
        first, _, repeats = _measured(model, x, CallLabels.FIRST, train)
        model.zero_grad(set_to_none=True)
        assert repeats > 100
        assert _copies(first) == _copies(every)
        assert (first.written, first.unlocated) == (every.written, every.unlocated)
        # the control: the softmax's copies, measured at its first call, counted at all three
        softmax = [e for place, e in first.copies.items() if place.aten_op == "aten._softmax"]
        assert softmax and softmax[0][0] == 3
        assert softmax[0][1] == 3 * 2 * 8 * 16 * 16 * 4


def test_the_profiler_records_the_first_call_of_each_signature_alone() -> None:
    torch.manual_seed(0)
    model = _KeypointLoop().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    _, every, none_left = _measured(model, x, CallLabels.EVERY, False)
    _, first, repeats = _measured(model, x, CallLabels.FIRST, False)
    assert none_left == 0 and first + repeats == every
    assert first < every / 4
    # recording is on again after the audit: a profile sees an operation
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        torch.ones(3).add(1)
    assert any(op.name == "aten::add" for op in profiled_ops(profile))


def test_a_signature_is_the_operator_with_its_tensors_strides_and_shared_storage() -> None:
    base = torch.randn(4, 3)
    x = torch.randn(2, 3, 4, 4)
    cl = x.contiguous(memory_format=torch.channels_last)
    # another row of the same tensor (another storage offset): the same signature
    assert call_signature(_ADD, (base[0], base[0]), {}) == call_signature(
        _ADD, (base[1], base[1]), {}
    )
    # the control: other strides, another signature
    assert call_signature(_ADD, (x, x), {}) != call_signature(_ADD, (cl, cl), {})
    # both arguments in one storage against two storages of the same strides
    y = torch.randn(2, 3, 4, 4)
    assert call_signature(_ADD, (x, x), {}) != call_signature(_ADD, (x, y), {})
    # other arguments than tensors as they are
    add_scalar = torch.ops.aten.add.Scalar
    assert call_signature(add_scalar, (x, 1), {}) != call_signature(add_scalar, (x, 2), {})


def test_an_operator_whose_output_shape_depends_on_data_is_labelled_at_every_call() -> None:
    x = torch.randn(8)
    assert call_signature(torch.ops.aten.nonzero.default, (x,), {}) is None
    assert call_signature(torch.ops.aten.masked_select.default, (x, x > 0), {}) is None
    # the control: an operator whose output's shape follows its input's
    assert call_signature(torch.ops.aten.abs.default, (x,), {}) is not None
    # a tensor that is not strided has no signature either
    assert call_signature(torch.ops.aten.abs.default, (x.to_sparse(),), {}) is None
