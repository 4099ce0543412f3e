"""Slow tier: real torchvision models at their default input size, against known answers and
against the committed report (reports/torchvision-cpu.json) as a regression gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cl_audit.report import Differential, ModelReport, ModelSource
from cl_audit.run import audit_loaded
from cl_audit.settings import AuditSettings, Engine
from cl_audit.sources import LoadedModel, ModelRef, load_model
from cl_audit.sources.torchvision_models import CHANNELS_LAST_TIER as MODELS

ROOT = Path(__file__).resolve().parents[1]

COMMITTED = {
    r["model"]: ModelReport.from_dict(r)
    for r in json.loads((ROOT / "reports" / "torchvision-cpu.json").read_text())["reports"]
}

# What a reader of each model's code expects, independent of the committed report.
FLATTEN_ONLY = {m for m in MODELS if m.startswith(("vgg", "alexnet"))}
SHUFFLE = {m for m in MODELS if m.startswith("shufflenet")}
SPECIAL = FLATTEN_ONLY | SHUFFLE | {"maxvit_t", "deeplabv3_resnet50"}


def build(name: str) -> LoadedModel:
    return load_model(ModelRef(ModelSource.TORCHVISION, name))


def sites(report: ModelReport) -> set[tuple[str | None, str | None, str | None]]:
    return {(f.op, f.module_path, f.call_site) for f in report.offenders}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_torchvision_model_matches_expectation_and_committed_report(name):
    report = audit_loaded(build(name), AuditSettings())
    ops = {f.op for f in report.offenders}
    if name in FLATTEN_ONLY:
        (finding,) = report.offenders
        assert finding.op == "torch.flatten" and finding.aten_op == "aten.clone"
        assert finding.terminal == 1
        assert finding.differential is Differential.CAUSED  # a free view in NCHW
    elif name in SHUFFLE:
        assert ops == {"Tensor.contiguous", "torch.cat"}
        roots = {f.root_cause.python_op for f in report.offenders if f.op == "torch.cat"}
        assert roots == {"Tensor.contiguous"}
        assert report.summary.round_trips > 0
    elif name == "maxvit_t":
        adds = [f for f in report.offenders if f.op == "Tensor.add"]
        # the tokens that come back NCHW derive from the window partition's copy: the loss
        # where that run of contiguous data began
        assert adds and all(f.root_cause.module_class == "WindowPartition" for f in adds)
        assert report.summary.round_trips == report.summary.losses  # the MBConv converts back
    elif name == "deeplabv3_resnet50":
        (finding,) = report.offenders
        assert finding.op == "torch.cat"
        assert finding.root_cause.python_op == "F.interpolate"
        assert finding.root_cause.module_class == "ASPPPooling"
    else:
        assert name not in SPECIAL
        assert report.offenders == (), f"{name}: {ops}"
    assert all(f.regain_source is not None for f in report.regains)
    assert sites(report) == sites(COMMITTED[name])
    assert report.summary == COMMITTED[name].summary


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_patch_engine_finds_the_same_sites_as_the_dispatch_engine(name):
    report = audit_loaded(build(name), AuditSettings(engine=Engine.PATCH))
    where = {(f.module_path, f.call_site) for f in report.offenders}
    assert where == {(f.module_path, f.call_site) for f in COMMITTED[name].offenders}
    assert report.summary.losses == COMMITTED[name].summary.losses


@pytest.mark.slow
def test_video_model_runs_5d_in_channels_last_3d():
    report = audit_loaded(build("r3d_18"), AuditSettings())
    assert report.input_shape == (2, 3, 16, 112, 112)
    assert report.summary.calls_checked > 50
    assert report.offenders == ()


COMMITTED_TRAIN = {
    r["model"]: ModelReport.from_dict(r)
    for r in json.loads((ROOT / "reports" / "torchvision-cpu-train.json").read_text())["reports"]
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["mobilenet_v2", "efficientnet_b0", "shufflenet_v2_x0_5", "resnet18"]
)
def test_training_step_matches_the_committed_training_report(name):
    from cl_audit.report import Phase

    report = audit_loaded(build(name), AuditSettings(train=True))
    committed = COMMITTED_TRAIN[name]

    def phased(r: ModelReport) -> set[tuple[object, ...]]:
        return {(f.phase, f.op, f.module_path, f.call_site) for f in r.offenders}

    assert phased(report) == phased(committed)
    assert report.summary == committed.summary
    if name in ("mobilenet_v2", "efficientnet_b0"):  # the global pool's backward is the cause
        (loss,) = report.offenders
        assert loss.phase is Phase.BACKWARD and loss.root_cause.python_op == "MeanBackward1"
