"""The differential audit: terminal losses against the same forward run in NCHW."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace
from pathlib import Path

import differential_models as dm
import pytest
import torch
import toy_models
from torch_checks import needs_fake_cuda
from typer.testing import CliRunner

import cl_audit
from cl_audit.cli import app
from cl_audit.compare.differential import CounterpartWatcher, classify_terminal
from cl_audit.execution.settings import AuditSettings, TensorMode
from cl_audit.phases.audit_module import audit_module
from cl_audit.report import Differential, DifferentialRun, DifferentialStatus

HERE = Path(__file__).parent


def audit(model: torch.nn.Module, engine: str = "dispatch", size: int = 8, **kwargs):
    return cl_audit.audit_model(model, torch.randn(2, 3, size, size), engine=engine, **kwargs)


def test_talking_heads_softmax_is_format_neutral_not_an_offender(engine):
    report = audit(dm.TalkingHeads(), engine)
    assert report.offenders == ()
    (neutral,) = report.format_neutral
    assert neutral.python_op in ("Tensor.softmax", "torch.softmax")
    assert neutral.differential is Differential.NEUTRAL and neutral.terminal == 1
    assert report.differential.status is DifferentialStatus.RAN
    assert report.summary.format_neutral == 1 and report.summary.losses == 0


def test_talking_heads_softmax_is_a_loss_without_the_comparison(engine):
    """The control: the same finding is an offender when no NCHW run classifies it."""
    report = audit(dm.TalkingHeads(), engine, differential=False)
    (finding,) = report.offenders
    assert finding.differential is None and finding.terminal == 1
    assert report.differential.status is DifferentialStatus.SKIPPED


def test_flatten_before_classifier_is_caused_by_channels_last(engine):
    report = audit(toy_models.FlattenHead(), engine, size=16)
    (finding,) = report.offenders
    assert finding.python_op == "torch.flatten" and finding.differential is Differential.CAUSED
    assert report.format_neutral == () and report.differential.unaligned == 0


def test_a_round_trip_stays_an_offender_though_nchw_copies_the_same(engine):
    """shufflenet's shuffle copies in NCHW too; only in channels_last does it disagree with
    the convolutions around it."""
    report = audit(toy_models.ChannelShuffle(), engine, size=16)
    (finding,) = report.offenders
    assert (finding.round_trips, finding.terminal) == (1, 0) and finding.differential is None
    # nothing to classify: only the dispatch engine's cost comparison runs the NCHW forward
    expected = DifferentialStatus.RAN if engine == "dispatch" else DifferentialStatus.NOT_NEEDED
    assert report.differential.status is expected


def test_a_loss_with_no_counterpart_is_unaligned_and_counted_as_caused(engine):
    report = audit(dm.FormatBranch(), engine)
    (finding,) = report.offenders
    assert finding.python_op == "Tensor.contiguous"
    assert finding.differential is Differential.UNALIGNED
    assert report.differential.unaligned == 1 and report.summary.terminal_conversions == 1


def test_a_failed_nchw_run_keeps_every_terminal_loss_as_an_offender():
    report = audit(dm.NCHWOnlyFails())
    (finding,) = report.offenders
    assert finding.differential is None and finding.terminal == 1
    assert report.differential.status is DifferentialStatus.FAILED
    assert "refuses NCHW" in report.differential.message and report.differential.unaligned == 1


def test_the_model_is_left_channels_last_after_the_nchw_run():
    model = dm.TalkingHeads()
    audit(model)
    assert model.stem.weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.stem.weight.is_contiguous()


def test_fake_mode_classifies_the_same_way():
    settings = AuditSettings(tensor_mode=TensorMode.FAKE)
    neutral = audit_module(dm.TalkingHeads(), (torch.randn(2, 3, 8, 8),), settings)
    assert neutral.offenders == () and len(neutral.format_neutral) == 1
    assert neutral.predicted and neutral.environment.mode is TensorMode.FAKE
    caused = audit_module(toy_models.FlattenHead(), (torch.randn(2, 3, 16, 16),), settings)
    assert caused.offenders[0].differential is Differential.CAUSED


def test_neutral_terminal_occurrences_split_from_round_trips_of_the_same_finding():
    report = audit(dm.TalkingHeads(), differential=False)
    (finding,) = report.offenders
    merged = replace(finding, count=3, bytes_converted=3 * finding.bytes_converted, round_trips=2)
    merged = replace(merged, terminal=1)
    watcher = CounterpartWatcher(cl_audit.rule.attribution.ModuleNames(), (merged,))
    same = tuple((t.shape, t.strides) for t in merged.inputs)
    out = tuple((t.shape, t.strides) for t in merged.outputs)
    place = (
        merged.module_path,
        merged.call_site,
        merged.python_op,
        tuple(t.shape for t in merged.inputs),
    )
    watcher.seen[place] = {(merged.aten_op, same, out)}
    offenders, neutrals, differential = classify_terminal((merged,), watcher)
    (offender,) = offenders
    (neutral,) = neutrals
    assert (offender.count, offender.round_trips, offender.terminal) == (2, 2, 0)
    assert (neutral.count, neutral.round_trips, neutral.terminal) == (1, 0, 1)
    assert offender.bytes_converted == 2 * finding.bytes_converted
    assert differential == DifferentialRun(DifferentialStatus.RAN)


def test_cli_runs_the_comparison_by_default_and_skips_it_when_asked():
    runner = CliRunner()
    spec = f"{HERE / 'differential_models.py'}:talking_heads"
    compared = runner.invoke(app, [spec, "--json", "-"], env={"COLUMNS": "120"})
    assert compared.exit_code == 0, compared.output
    data = json.loads(compared.stdout)
    assert data["offenders"] == [] and len(data["format_neutral"]) == 1
    assert data["differential"]["status"] == "ran"
    skipped = runner.invoke(app, [spec, "--no-differential"], env={"COLUMNS": "120"})
    assert skipped.exit_code == 1 and "NCHW comparison skipped" in skipped.output


def test_cli_show_all_lists_the_format_neutral_losses():
    runner = CliRunner()
    spec = f"{HERE / 'differential_models.py'}:talking_heads"
    result = runner.invoke(app, [spec, "--show-all"], env={"COLUMNS": "120"})
    assert result.exit_code == 0 and "Format-neutral losses" in result.output
    lines, first = inspect.getsourcelines(dm.TalkingHeads.forward)
    line = first + next(i for i, text in enumerate(lines) if ".softmax(" in text)
    assert f"differential_models.py:{line}" in result.output


@pytest.mark.parametrize("engine_name", ["dispatch", "patch"])
def test_context_manager_never_classifies(engine_name):
    model = toy_models.FlattenHead().eval()
    cl_audit.execution.convert.to_channels_last(model)
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), cl_audit.audit(engine_name, model=model) as active:
        model(x)
    report = active.report()
    assert report.differential.status is DifferentialStatus.SKIPPED
    assert report.offenders[0].differential is None


class DtypeProbe(torch.nn.Module):
    """Remembers the dtype its convolution produced."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.seen: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        self.seen.append(y.dtype)
        return y.softmax(dim=1)


@needs_fake_cuda
def test_fake_cuda_amp_takes_effect_without_a_gpu_and_is_restored():
    from cl_audit.execution.settings import Amp

    probe = DtypeProbe()
    settings = AuditSettings(device="cuda", tensor_mode=TensorMode.FAKE, amp=Amp.FP16)
    report = audit_module(probe, (torch.randn(2, 3, 8, 8),), settings)
    assert probe.seen[0] == torch.float16  # the channels_last run ran under fp16 autocast
    assert report.environment.autocast == "cuda:float16"
    assert report.environment.device == "cuda" and report.predicted
    assert not torch.is_autocast_enabled("cuda")
