"""The recorder's bookkeeping on literal tensors, without an engine: each operation is handed
to ``Recorder.observe`` as an engine would, with the real tensors it took and returned."""

from __future__ import annotations

import torch

from cl_audit.intercept.recorder import Recorder
from cl_audit.report import Conversion, Provenance, RegainSource
from cl_audit.rule.attribution import ModuleNames

aten = torch.ops.aten
CL = torch.channels_last


def channels_last() -> torch.Tensor:
    return torch.randn(2, 8, 4, 4).contiguous(memory_format=CL)


def observe(recorder: Recorder, op: object, name: str, inputs: tuple, result: object) -> None:
    recorder.observe(op, name, inputs, {}, result)


def test_a_loss_whose_data_is_converted_back_is_one_round_trip():
    recorder = Recorder(ModuleNames())
    x = channels_last()
    y = x.contiguous()
    observe(recorder, aten.clone.default, "Tensor.contiguous", (x,), y)
    z = y + 1  # the NCHW data flows on through what reads it
    observe(recorder, aten.add.Tensor, "Tensor.add", (y, 1), z)
    back = z.contiguous(memory_format=CL)
    observe(recorder, aten.clone.default, "Tensor.contiguous", (z,), back)
    losses, regains = recorder.findings()
    (loss,) = losses
    assert (loss.kind, loss.aten_op, loss.count) == (Conversion.LOSS, "aten.clone", 1)
    assert (loss.round_trips, loss.terminal) == (1, 0)
    assert loss.bytes_converted == y.numel() * y.element_size()
    (regain,) = regains
    assert regain.regain_source is RegainSource.LOSS
    assert recorder.calls_checked == 3


def test_a_loss_that_is_never_converted_back_is_terminal():
    recorder = Recorder(ModuleNames())
    x = channels_last()
    observe(recorder, aten.clone.default, "Tensor.contiguous", (x,), x.contiguous())
    ((loss,), regains) = recorder.findings()
    assert (loss.round_trips, loss.terminal) == (0, 1) and regains == []


def test_data_made_from_parameters_through_views_has_parameter_provenance():
    weight = channels_last()
    recorder = Recorder(ModuleNames(), parameters=[weight])
    view = weight.permute(1, 0, 2, 3)  # a view: the parameter's own storage
    observe(recorder, aten.permute.default, "Tensor.permute", (weight,), view)
    copy = view.contiguous()
    observe(recorder, aten.clone.default, "Tensor.contiguous", (view,), copy)
    x = channels_last()  # the control: an activation, not derived from a parameter
    observe(recorder, aten.clone.default, "Tensor.contiguous", (x,), x.contiguous())
    losses, _ = recorder.findings()
    assert sorted(f.provenance for f in losses) == [Provenance.BATCH, Provenance.PARAMETER]


def test_a_storage_identity_reused_by_an_unrelated_tensor_is_forgotten():
    recorder = Recorder(ModuleNames())
    x = channels_last()
    y = x.contiguous()
    observe(recorder, aten.clone.default, "Tensor.contiguous", (x,), y)
    # an operation that did not read y returns a tensor on y's storage (an allocator reuse)
    unrelated = channels_last()
    observe(recorder, aten.empty_like.default, "torch.empty_like", (unrelated,), y)
    back = y.contiguous(memory_format=CL)
    observe(recorder, aten.clone.default, "Tensor.contiguous", (y,), back)
    losses, _ = recorder.findings()
    loss = next(
        f for f in losses if f.kind is Conversion.LOSS and f.python_op == "Tensor.contiguous"
    )
    assert (loss.round_trips, loss.terminal) == (0, 1)  # the regain is not credited to it


def test_an_in_place_operation_keeps_the_storage_it_tracks():
    recorder = Recorder(ModuleNames())
    x = channels_last()
    y = x.contiguous()
    observe(recorder, aten.clone.default, "Tensor.contiguous", (x,), y)
    observe(recorder, aten.add_.Tensor, "Tensor.add_", (y, 1), y.add_(1))
    back = y.contiguous(memory_format=CL)
    observe(recorder, aten.clone.default, "Tensor.contiguous", (y,), back)
    ((loss,), _) = recorder.findings()
    assert loss.round_trips == 1


def test_one_loss_converted_back_twice_is_one_round_trip():
    recorder = Recorder(ModuleNames())
    x = channels_last()
    y = x.contiguous()
    observe(recorder, aten.clone.default, "Tensor.contiguous", (x,), y)
    for _ in range(2):
        observe(
            recorder, aten.clone.default, "Tensor.contiguous", (y,), y.contiguous(memory_format=CL)
        )
    ((loss,), regains) = recorder.findings()
    assert loss.round_trips == 1 and sum(r.count for r in regains) == 2
