"""The cost rule: channels_last weighed against the same forward or step in NCHW, site by site.

Each case beside its positive control (``tests/cost_models.py``); the byte figures follow from
the tensors' sizes (float32)."""

from __future__ import annotations

import dataclasses
import json

import cost_models as cm
import pytest
import torch
from typer.testing import CliRunner

from cl_audit import audit_model
from cl_audit.cli import app
from cl_audit.enums import CostKind, Evidence, Phase, Verdict
from cl_audit.report import REPORT_VERSION, Gate, ModelReport, SweepReport, compare, load_schema

MAP = 2 * 8 * 32 * 32 * 4  # one (2, 8, 32, 32) float32 map
ANY = {"fail_share": 0.0, "fail_bytes": 0}  # any channels_last-only cost offends


def _input(channels: int = 3) -> torch.Tensor:
    return torch.randn(2, channels, 32, 32, generator=torch.Generator().manual_seed(0))


def _audit(model: torch.nn.Module, channels: int = 3, **kwargs) -> ModelReport:
    torch.manual_seed(0)
    return audit_model(model, _input(channels), **{**ANY, **kwargs})


def _extra_sites(report: ModelReport):
    assert report.cost is not None
    return [s for s in report.cost.sites if s.extra]


def test_a_copy_nchw_makes_identically_costs_nothing():
    report = _audit(cm.TransposeCopy())
    assert report.cost.extra_bytes == 0
    assert report.verdict is Verdict.CLEAN


def test_a_copy_only_channels_last_makes_is_a_cost_counted_once_where_it_happens():
    report = _audit(cm.ContiguousCopy())
    assert report.verdict is Verdict.OFFENDING
    assert report.cost.extra_bytes == 2 * MAP  # the copy, and the conversion back in `after`
    copy, conversion = sorted(_extra_sites(report), key=lambda s: s.kind.value)
    assert (copy.kind, copy.op, copy.extra) == (CostKind.COPY, "Tensor.contiguous", MAP)
    assert (conversion.kind, conversion.module_path, conversion.extra) == (
        CostKind.KERNEL, "after", MAP,
    )  # fmt: skip
    assert conversion.fix_site is not None and conversion.fix_site.python_op == "Tensor.contiguous"
    assert report.cost.kernel_copies is Evidence.MEASURED


def test_the_conversion_after_a_shared_copy_is_the_site_and_names_the_copy_as_its_fix():
    report = _audit(cm.Shuffle())
    (site,) = _extra_sites(report)
    assert (site.kind, site.module_path, site.extra) == (CostKind.KERNEL, "after", MAP)
    assert site.fix_site.python_op == "Tensor.contiguous"
    assert site.fix_site.call_site.startswith("cost_models.py:")


def test_weight_standardisation_reports_its_cost_as_parameter_conversions_with_a_remedy():
    weight = 64 * 16 * 3 * 3 * 4
    report = _audit(cm.Standardised(), channels=16)
    sites = _extra_sites(report)
    assert {s.kind for s in sites} == {CostKind.PARAMETER}
    assert report.cost.extra_bytes == 2 * weight  # copied out, converted back
    assert all(s.remedy is not None and "std_conv" in s.remedy.reference for s in sites)
    assert report.verdict is Verdict.OFFENDING


def test_a_parameter_copy_without_standardisation_gets_no_standardisation_remedy():
    """The weight-standardisation remedy needs its pattern in the data: a costing weight
    reshape and the costing convolution in one module (the control above has both)."""
    report = _audit(cm.PositionTokens())
    (site,) = [s for s in _extra_sites(report) if s.kind is CostKind.PARAMETER]
    assert (site.op, site.extra) == ("Tensor.reshape", 8 * 16 * 4)
    assert site.remedy is None


def test_a_site_where_channels_last_saves_bytes_gets_no_remedy():
    report = _audit(cm.PermutedCopy())
    (site,) = report.cost.sites
    assert (site.op, site.extra, site.saved) == ("Tensor.contiguous", 0, MAP)
    assert site.remedy is None
    (control,) = [s for s in _extra_sites(_audit(cm.ContiguousCopy())) if s.kind is CostKind.COPY]
    assert control.op == "Tensor.contiguous" and control.remedy is not None


def test_device_specific_remedies_hold_on_their_device_only():
    """GroupNorm's and the reflect pad's remedies are CUDA's; the CPU convolution backward's
    is the CPU's."""
    from cl_audit.remedies import SiteContext, remedy_for

    cases = (
        (CostKind.KERNEL, "aten.native_group_norm", "cuda"),
        (CostKind.KERNEL, "aten.reflection_pad2d", "cuda"),
        (CostKind.KERNEL, "ConvolutionBackward0", "cpu"),
    )
    for kind, op, device in cases:
        other = "cpu" if device == "cuda" else "cuda"
        assert remedy_for(kind, (op,), (), SiteContext(device)) is not None
        assert remedy_for(kind, (op,), (), SiteContext(other)) is None


def test_a_kernel_copy_of_a_strided_token_map_is_placed_at_its_call_site():
    """The CPU softmax copies a strided 3-D input inside the kernel (the profiler measures
    it): the site is the softmax's line, not an unlocated place (it had no call site)."""
    report = _audit(cm.TokenSoftmax())
    (site,) = _extra_sites(report)
    assert (site.kind, site.aten_op, site.extra) == (CostKind.KERNEL, "aten._softmax", MAP)
    assert site.call_site is not None and site.call_site.startswith("cost_models.py:")
    assert report.cost.unlocated_bytes == 0 and site.where == site.call_site
    unlocated = dataclasses.replace(site, module_path=None, module_class=None, call_site=None)
    assert unlocated.where == "unlocated: measured inside aten._softmax, not placed"


def test_the_same_convolution_not_standardised_is_clean():
    report = _audit(cm.Plain(), channels=16)
    assert report.cost.extra_bytes == 0
    assert report.verdict is Verdict.CLEAN


def test_the_means_backward_alone_is_minor_under_the_default_gate():
    torch.manual_seed(0)
    report = audit_model(cm.MeanHead(), _input(), train=True)
    assert report.cost.extra_bytes > 0
    assert report.verdict is Verdict.MINOR
    assert {s.phase for s in _extra_sites(report)} == {Phase.BACKWARD}


def test_the_means_backward_offends_when_any_cost_must_fail():
    assert _audit(cm.MeanHead(), train=True).verdict is Verdict.OFFENDING


def test_a_permute_around_a_kernel_is_no_root_cause_and_costs_nothing():
    report = _audit(cm.LayerNorm2d())
    assert report.cost.extra_bytes == 0
    assert report.cost.saved_bytes > 0  # NCHW copies inside layer_norm; channels_last does not


def test_a_real_copy_after_the_permute_is_the_fix_site_not_the_view():
    report = _audit(cm.LayerNorm2d(copy=True))
    conversion = next(s for s in _extra_sites(report) if s.kind is CostKind.KERNEL)
    assert conversion.module_path == "after"
    assert conversion.fix_site.python_op == "Tensor.contiguous"


def test_mixed_format_elementwise_operations_are_listed_apart_and_never_cost():
    report = _audit(cm.MixedAdd())
    assert report.cost.extra_bytes == 0
    assert [m.op for m in report.cost.mixed] == ["Tensor.add"]
    assert report.cost.mixed[0].bytes_read == MAP


@pytest.mark.parametrize(
    ("extra", "written", "verdict"),
    [
        (0, 100 << 20, Verdict.CLEAN),
        (1 << 20, 100 << 20, Verdict.OFFENDING),  # 1 MiB and 1%: both reached
        ((1 << 20) - 1, 100 << 20, Verdict.MINOR),  # under 1 MiB
        (2 << 20, 300 << 20, Verdict.MINOR),  # under 1%
    ],
)
def test_the_gate_needs_both_the_share_and_the_bytes(extra, written, verdict):
    assert Gate().verdict(extra, written) is verdict


def test_a_timed_cost_offends_on_its_time_share_alone():
    assert Gate().verdict(10, 100 << 20, time_share=0.02) is Verdict.OFFENDING
    assert Gate().verdict(10, 100 << 20, time_share=0.005) is Verdict.MINOR


def test_fake_mode_predicts_the_same_sites_from_strides():
    torch.manual_seed(0)
    model = cm.ContiguousCopy()
    from cl_audit.run import audit_module
    from cl_audit.settings import AuditSettings, TensorMode

    settings = AuditSettings(tensor_mode=TensorMode.FAKE, gate=Gate(0, 0))
    report = audit_module(model, (_input(),), settings)
    assert report.cost.kernel_copies is Evidence.PREDICTED
    assert report.cost.extra_bytes == 2 * MAP
    assert report.verdict is Verdict.OFFENDING


def _fake(model: torch.nn.Module) -> ModelReport:
    from cl_audit.run import audit_module
    from cl_audit.settings import AuditSettings, TensorMode

    torch.manual_seed(0)
    settings = AuditSettings(tensor_mode=TensorMode.FAKE, gate=Gate(0, 0))
    return audit_module(model, (_input(),), settings)


def test_an_operation_reading_only_metadata_of_a_channels_last_map_is_no_predicted_copy():
    report = _fake(cm.MetadataFill())
    assert [s.op for s in _extra_sites(report)] == []
    assert report.verdict is Verdict.CLEAN


def test_im2col_of_a_channels_last_map_is_still_a_predicted_copy():
    """The control: ``unfold`` reads the map's data, converting it inside its kernel."""
    report = _fake(cm.Unfolded())
    (site,) = _extra_sites(report)
    assert site.kind is CostKind.KERNEL and site.channels_last_bytes == MAP


def test_a_fake_audit_reads_the_values_of_tensors_the_model_holds():
    """A plain tensor attribute is real data: iterating it for fill values works in a fake run
    as in an eager one (a forward that failed: DataDependentOutputException)."""
    eager, fake = _audit(cm.HeldScales()), _fake(cm.HeldScales())
    assert [s.op for s in _extra_sites(fake)] == [s.op for s in _extra_sites(eager)] == []
    assert cm.HeldScales().scales.tolist() == [2.0, 4.0]  # not changed


def test_a_fake_audit_still_cannot_read_the_values_of_its_input():
    """The control: the batch is fake, its values unknown; the forward fails, saying so."""
    from cl_audit.errors import ModelFailedError

    with pytest.raises(ModelFailedError, match="DataDependentOutputException"):
        _fake(cm.ReadsInput())


def test_the_report_json_is_version_5_validates_and_reads_back():
    jsonschema = pytest.importorskip("jsonschema")
    report = _audit(cm.ContiguousCopy())
    data = report.to_dict()
    assert data["version"] == REPORT_VERSION
    jsonschema.validate(data, load_schema("report"))
    assert data["cost"]["extra_bytes"] == 2 * MAP and data["summary"]["verdict"] == "offending"
    assert ModelReport.from_dict(json.loads(report.to_json())) == report


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "120"}, catch_exceptions=False)


def test_cli_minor_exits_0_and_fail_share_0_fail_bytes_0_makes_it_exit_1(tmp_path):
    model = "tests/cost_models.py:MeanHead"
    minor = _invoke(model, "--input-size", "3x32x32", "--train")
    assert minor.exit_code == 0, minor.output
    assert "cl-audit: minor" in minor.output and "channels_last adds" in minor.output
    strict = _invoke(
        model, "--input-size", "3x32x32", "--train", "--fail-share", "0", "--fail-bytes", "0",
        "--json", str(tmp_path / "r.json"),
    )  # fmt: skip
    assert strict.exit_code == 1, strict.output
    gate = json.loads((tmp_path / "r.json").read_text())["cost"]["gate"]
    assert (gate["share"], gate["bytes"]) == (0.0, 0)


def test_cli_refuses_a_bad_size_in_one_line():
    result = _invoke("resnet18", "--fail-bytes", "lots")
    assert result.exit_code == 2
    assert "--fail-bytes 'lots'" in result.output


def _sweep(extra: int, verdict: str) -> SweepReport:
    report = _audit(cm.ContiguousCopy())
    cost = report.cost
    from dataclasses import replace

    cost = replace(cost, extra_bytes=extra, verdict=Verdict(verdict))
    report = replace(report, cost=cost, summary=replace(report.summary, verdict=Verdict(verdict)))
    from cl_audit.enums import Mode, ModelSource
    from cl_audit.report import ModelRow

    row = ModelRow.from_report(report, "m", ModelSource.USER, Mode.EAGER)
    return SweepReport.build(report.environment, {}, [row])


def test_a_baseline_gates_on_a_cost_that_grew_past_the_gate():
    base = _sweep(2 * MAP, "offending")
    assert not compare(base, base).regressed
    grown = _sweep(2 * MAP + (4 << 20), "offending")
    assert compare(base, grown).grown_costs == ("user:m",)
    assert compare(base, grown).regressed


def test_junit_fails_an_offending_row_with_its_cost_sites():
    import xml.etree.ElementTree as ET

    from cl_audit.render.junit import junit_xml

    suite = ET.fromstring(junit_xml(_sweep(2 * MAP, "offending")))
    failure = suite.find("testcase").find("failure")
    assert failure.get("type") == "channels_last_cost"
    assert failure.get("message").startswith("channels_last adds 128.0 KiB")
    assert "Tensor.contiguous (copy, forward)" in failure.text


def test_a_view_is_never_a_fix_site_though_the_finding_names_it_as_root_cause():
    report = _audit(cm.TokensAsMap())
    conversion = next(s for s in _extra_sites(report) if s.module_path == "after")
    assert conversion.kind is CostKind.KERNEL and conversion.fix_site is None
    (regain,) = [r for r in report.regains if r.module_path == "after"]
    assert regain.root_cause.python_op == "Tensor.view"  # where the tokens became a map
