"""The loss/regain rule on single operations whose CPU answers are known."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import channels_last

import cl_audit

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
