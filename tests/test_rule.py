"""The loss/regain rule on single operations whose CPU answers are known."""

from __future__ import annotations

import pytest
import rule_models
import torch
import torch.nn.functional as F
from conftest import channels_last

import cl_audit
from cl_audit.rule.conversions import carries_order, is_copy_op

x = channels_last(2, 8, 6, 6)

LOSSES = {
    "softmax over channels": (lambda: F.softmax(x, dim=1), "F.softmax"),
    "instance_norm": (lambda: F.instance_norm(x), "F.instance_norm"),
    "explicit contiguous": (lambda: x.contiguous(), "Tensor.contiguous"),
    "to(contiguous_format)": (lambda: x.to(memory_format=torch.contiguous_format), "Tensor.to"),
    "NCHW + channels_last add": (lambda: torch.randn(2, 8, 6, 6) + x, None),
    "flatten of a spatial map": (lambda: torch.flatten(x, 1), "torch.flatten"),
    "5D view copied out (channel shuffle)": (
        lambda: x.view(2, 2, 4, 6, 6).transpose(1, 2).contiguous(),
        "Tensor.contiguous",
    ),
}

KEPT = {
    "permute + LayerNorm + permute": lambda: F.layer_norm(x.permute(0, 2, 3, 1), (8,)).permute(
        0, 3, 1, 2
    ),
    "channel slices": lambda: x[:, :4] * 2 + x[:, 4:],
    "N1HW gate": lambda: x * torch.sigmoid(channels_last(2, 1, 6, 6)),
    "NC11 squeeze-excite": lambda: x * torch.sigmoid(F.adaptive_avg_pool2d(x, 1)),
    "relu": lambda: F.relu(x),
    "batch_norm": lambda: F.batch_norm(x, torch.zeros(8), torch.ones(8)),
    "max_pool2d": lambda: F.max_pool2d(x, 2),
    "cat of channels_last": lambda: torch.cat([x, x], dim=1),
    "global mean to (N, C)": lambda: x.mean((2, 3)),
    "views only": lambda: x.permute(0, 2, 3, 1).reshape(2, 36, 8).transpose(1, 2),
}


def run(fn, engine: str) -> cl_audit.ModelReport:
    with torch.no_grad(), cl_audit.audit(engine) as audit:
        fn()
    return audit.report()


@pytest.mark.parametrize("case", LOSSES, ids=list(LOSSES))
def test_loss_is_flagged(case, engine):
    fn, python_op = LOSSES[case]
    report = run(fn, engine)
    assert report.summary.losses == 1, report.offenders
    (finding,) = report.offenders
    if python_op is not None:
        assert finding.python_op == python_op
    assert finding.outputs[0].layout in (cl_audit.MemoryLayout.CONTIGUOUS,)
    assert finding.terminal == 1 and finding.round_trips == 0
    assert finding.bytes_converted == 2 * 8 * 6 * 6 * 4


@pytest.mark.parametrize("case", KEPT, ids=list(KEPT))
def test_format_kept_is_not_flagged(case, engine):
    report = run(KEPT[case], engine)
    assert report.offenders == ()
    assert report.summary.losses == 0
    assert report.summary.calls_checked > 0


def test_dispatch_names_aten_and_python_level_ops():
    report = run(lambda: torch.randn(2, 8, 6, 6) + x, "dispatch")
    (finding,) = report.offenders
    assert (finding.python_op, finding.aten_op) == ("Tensor.add", "aten.add")
    assert finding.mixed_formats


def test_patch_engine_sees_operator_dunders():
    report = run(lambda: torch.randn(2, 8, 6, 6) + x, "patch")
    (finding,) = report.offenders
    assert finding.python_op == "Tensor.__add__" and finding.aten_op is None


def test_nested_python_calls_are_one_event(engine):
    report = run(lambda: F.softmax(x, dim=1), engine)
    assert report.summary.losses == 1
    assert report.offenders[0].python_op == "F.softmax"


def test_conv_with_channels_last_weight_regains(engine):
    conv = torch.nn.Conv2d(8, 8, 1).to(memory_format=torch.channels_last)
    report = run(lambda: conv(torch.randn(2, 8, 6, 6)), engine)
    assert report.offenders == ()
    assert report.summary.regains == 1
    assert report.regains[0].kind is cl_audit.report.Conversion.REGAIN


def test_loss_then_regain_is_a_round_trip(engine):
    conv = torch.nn.Conv2d(8, 8, 1).to(memory_format=torch.channels_last)
    report = run(lambda: conv(F.softmax(x, dim=1)), engine)
    (finding,) = report.offenders
    assert (finding.round_trips, finding.terminal) == (1, 0)
    assert report.summary.round_trips == 1 and report.summary.terminal_conversions == 0


def test_identical_events_merge_with_a_count(engine):
    def twice():
        for _ in range(3):
            F.softmax(x, dim=1)

    report = run(twice, engine)
    (finding,) = report.offenders
    assert finding.count == 3 and report.summary.losses == 3
    assert finding.bytes_converted == 3 * x.numel() * 4


def test_report_keeps_no_tensors(engine):
    report = run(lambda: F.softmax(x, dim=1), engine)

    def walk(value):
        assert not isinstance(value, torch.Tensor)
        if isinstance(value, (tuple, list)):
            for v in value:
                walk(v)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                walk(getattr(value, name))

    walk(report)


# --- Corrections: copies only for same-size outputs, reshaped storage, outputs with an order ---


def audit_factory(factory, engine: str, **kwargs) -> cl_audit.ModelReport:
    model, shape = factory()
    for name, value in kwargs.items():
        setattr(model, name, value)
    return cl_audit.audit_model(model, torch.randn(2, *shape), engine=engine, differential=False)


def test_bmm_with_coinciding_sizes_is_not_a_loss(engine):
    report = audit_factory(rule_models.bmm_same_size, engine)
    assert report.offenders == () and report.summary.losses == 0


def test_same_size_copy_of_that_view_is_still_a_loss(engine):
    report = audit_factory(rule_models.bmm_same_size, engine, copy=True)
    (finding,) = report.offenders
    assert finding.python_op == "Tensor.contiguous"
    assert finding.outputs[0].shape == (2, 16, 16)


def test_reshaped_sum_over_the_radix_is_a_round_trip(engine):
    report = audit_factory(rule_models.resnest_split, engine)
    (finding,) = report.offenders
    assert finding.python_op == "Tensor.sum"
    assert finding.inputs[0].shape == (2, 2, 4, 16, 16)  # the reshaped view
    assert finding.outputs[0].shape == (2, 4, 16, 16)  # half the elements: size does not matter
    assert (finding.round_trips, finding.terminal) == (1, 0)


def test_the_same_sum_over_channel_slices_keeps_the_format(engine):
    report = audit_factory(rule_models.resnest_split, engine, slices=True)
    assert report.offenders == () and report.summary.regains == 0


def test_stack_of_channels_last_maps_summed_is_a_round_trip(engine):
    report = audit_factory(rule_models.sk_stack, engine)
    (finding,) = report.offenders
    assert finding.python_op == "Tensor.sum"
    assert finding.inputs[0].shape == (2, 2, 8, 16, 16)
    assert (finding.round_trips, finding.terminal) == (1, 0)


ORDERLESS = {  # outputs with fewer than two dims of size > 1: no order to lose
    "NC11 keepdim mean": lambda: x.mean((2, 3), keepdim=True),
    "N1HW keepdim sum": lambda: x.sum(1, keepdim=True),
    "batch-1 NC11 softmax": lambda: F.softmax(x[:1].mean((2, 3), keepdim=True), dim=1),
    "one-channel copy": lambda: x[:, :1].contiguous(),
}


@pytest.mark.parametrize("case", ORDERLESS, ids=list(ORDERLESS))
def test_output_without_an_order_is_not_a_loss(case, engine):
    report = run(ORDERLESS[case], engine)
    assert report.offenders == ()


def test_keepdim_sum_over_one_spatial_dim_is_a_loss(engine):
    """The control: (N, C, 1, W) still has two ordered dims and comes out NCHW."""
    report = run(lambda: x.sum(2, keepdim=True), engine)
    (finding,) = report.offenders
    assert finding.outputs[0].shape == (2, 8, 1, 6)


@pytest.mark.parametrize("batch", [1, 2])
def test_flatten_is_a_loss_whatever_the_batch_size(batch, engine):
    """At aten level the copy inside flatten is a 4D clone; the patch engine sees the flat
    output: both must agree, also for a batch of one."""
    report = run(lambda: torch.flatten(x[:batch], 1), engine)
    (finding,) = report.offenders
    assert finding.python_op == "torch.flatten"


def test_copy_ops_by_name():
    assert is_copy_op("aten.clone", "torch.flatten")
    assert is_copy_op("aten._to_copy", None)
    assert not is_copy_op("aten.bmm", "Tensor.contiguous")  # the aten name decides
    assert is_copy_op(None, "Tensor.reshape") and is_copy_op(None, "torch.flatten")
    assert not is_copy_op(None, "torch.bmm") and not is_copy_op(None, "Tensor.__mul__")


def test_carries_order_ignores_size_one_and_broadcast_dims():
    assert carries_order(torch.empty(2, 3))
    assert not carries_order(torch.empty(1, 6, 1, 1))
    assert not carries_order(torch.empty(6, 1).expand(6, 4))
    assert carries_order(torch.empty(2, 8, 1, 6))
