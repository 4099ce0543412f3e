"""Slow tier: real torchvision models at their default input size, against known answers and
against the report committed for this torch and torchvision (reports/torchvision/) as a
regression gate. Reports record what one release's kernels did: a torch with no committed
report of its own runs the known answers only, and the comparison skips saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cl_audit.compat.versions import TORCH_VERSION, torch_version
from cl_audit.execution.settings import AuditSettings, Engine
from cl_audit.report import Differential, ModelReport, ModelSource, decode_document
from cl_audit.report.environment import distribution_version
from cl_audit.sources import LoadedModel, ModelRef, load_model
from cl_audit.sources.source_audit import audit_loaded
from cl_audit.sources.torchvision_models import CHANNELS_LAST_TIER as MODELS

ROOT = Path(__file__).resolve().parents[1]


def _minor(version: str | None) -> tuple[int, int] | None:
    return None if version is None else torch_version(version)


def committed(kind: str) -> dict[str, ModelReport]:
    """The committed reports (``cpu`` or ``cpu-train``) measured with this torch and
    torchvision (major.minor), by model; empty when there is none."""
    here = (TORCH_VERSION, _minor(distribution_version("torchvision")))
    for path in sorted((ROOT / "reports" / "torchvision").glob(f"{kind}_torch-*.json.gz")):
        document = decode_document(path.read_bytes())
        reports = [ModelReport.from_dict(r) for r in document["reports"]]
        env = reports[0].environment
        if (torch_version(env.torch), _minor(env.torchvision)) == here:
            return {r.model: r for r in reports if r.model is not None}
    return {}


COMMITTED = committed("cpu")
COMMITTED_TRAIN = committed("cpu-train")


def require(reports: dict[str, ModelReport], name: str) -> ModelReport:
    if name not in reports:
        pytest.skip(f"no committed report of {name} for torch {torch.__version__} here")
    return reports[name]


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
    committed = require(COMMITTED, name)
    assert sites(report) == sites(committed)
    assert report.summary == committed.summary


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_patch_engine_finds_the_same_sites_as_the_dispatch_engine(name):
    report = audit_loaded(build(name), AuditSettings(engine=Engine.PATCH))
    dispatch = COMMITTED.get(name) or audit_loaded(build(name), AuditSettings())
    where = {(f.module_path, f.call_site) for f in report.offenders}
    assert where == {(f.module_path, f.call_site) for f in dispatch.offenders}
    assert report.summary.losses == dispatch.summary.losses


@pytest.mark.slow
def test_video_model_runs_5d_in_channels_last_3d():
    report = audit_loaded(build("r3d_18"), AuditSettings())
    assert report.input_shape == (2, 3, 16, 112, 112)
    assert report.summary.calls_checked > 50
    assert report.offenders == ()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["mobilenet_v2", "efficientnet_b0", "shufflenet_v2_x0_5", "resnet18"]
)
def test_training_step_matches_the_committed_training_report(name):
    from cl_audit.report import Phase

    report = audit_loaded(build(name), AuditSettings(train=True))
    if name in ("mobilenet_v2", "efficientnet_b0"):  # the global pool's backward is the cause
        (loss,) = report.offenders
        assert loss.phase is Phase.BACKWARD and loss.root_cause.python_op == "MeanBackward1"
    committed = require(COMMITTED_TRAIN, name)

    def phased(r: ModelReport) -> set[tuple[object, ...]]:
        return {(f.phase, f.op, f.module_path, f.call_site) for f in r.offenders}

    assert phased(report) == phased(committed)
    assert report.summary == committed.summary
