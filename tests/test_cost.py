"""The cost rule: channels_last weighed against the same forward or step in NCHW, site by site.

Each case beside its positive control (``tests/cost_models.py``); the byte figures follow from
the tensors' sizes (float32)."""

from __future__ import annotations

import dataclasses
import inspect
import json

import cost_models as cm
import pytest
import torch
from torch_checks import needs_fake_cuda, needs_node_by_node
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
    # its remedy is to keep the restrided position table as it was (issue #59), not to
    # standardise in memory order
    assert "standardis" not in site.remedy.pattern and site.remedy.advice.startswith("keep ")


def test_a_site_where_channels_last_saves_bytes_gets_no_remedy():
    report = _audit(cm.PermutedCopy())
    (site,) = report.cost.sites
    assert (site.op, site.extra, site.saved) == ("Tensor.contiguous", 0, MAP)
    assert site.remedy is None
    (control,) = [s for s in _extra_sites(_audit(cm.ContiguousCopy())) if s.kind is CostKind.COPY]
    assert control.op == "Tensor.contiguous" and control.remedy is not None


def test_release_dependent_advice_names_the_release_the_user_runs():
    """Issue #67: on torch 2.15 the GroupNorm site advised "use torch 2.15". Up to 2.14 the
    advice is to move to 2.15 (the control); from 2.15 it says the copy is an earlier
    release's measurement, to be timed on a GPU."""
    from cl_audit.compare.remedies import SiteContext, remedy_for

    def advice(release: tuple[int, int]) -> str:
        found = remedy_for(CostKind.KERNEL, ("aten.native_group_norm",), (),
                           SiteContext("cuda", release=release))  # fmt: skip
        assert found is not None
        return found.advice

    assert "use torch 2.15" in advice((2, 14)) and "use torch 2.15" in advice((2, 4))
    later = advice((2, 15))
    assert "use torch 2.15" not in later and "an earlier release" in later
    assert "--time" in advice((2, 16))


def test_device_specific_remedies_hold_on_their_device_only():
    """GroupNorm's and the reflect pad's remedies are CUDA's; the CPU convolution backward's
    is the CPU's."""
    from cl_audit.compare.remedies import SiteContext, remedy_for

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


def test_a_copy_inside_a_kernel_lands_at_one_place_in_both_runs_whatever_the_strides():
    """``slice_backward`` copies its gradient into a zero tensor, contiguous or not (CoaT's
    class token sliced off before the tokens are folded back into a map: the gradient is
    contiguous in the channels_last run, strided in the NCHW one). An eager run placed a
    measured kernel only when an input was a map or strided, so the same copy was unlocated in
    one run and placed in the other: a channels_last-only cost and an NCHW-only one of the same
    bytes (coat_lite_tiny offending on the CPU and on an H200 by 2.8 MB). Control: the softmax
    over the channels_last map's tokens, copied inside the CPU kernel in that run only."""
    for softmax in (False, True):
        report = _audit(cm.TokensBackToMap(softmax), train=True)
        ops = {s.aten_op for s in report.cost.sites}
        assert "aten.slice_backward" not in ops and report.cost.unlocated_bytes < 64
        assert ("aten._softmax" in ops) is softmax


def test_a_broadcast_fill_inside_a_kernel_is_no_conversion():
    """``addmm`` copies its bias into its output before accumulating (the profiler shows a
    copy after an ``expand``): bytes written, not converted; the NCHW run's ``bmm`` and ``add``
    write as many. TokenSoftmax's copy inside the softmax is the control, still a cost."""
    report = _audit(cm.TokensLinear())
    assert _extra_sites(report) == [] and report.cost.unlocated_bytes == 0
    assert report.cost.kernel_copies is Evidence.MEASURED


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


def _at_batch(model: torch.nn.Module, batch: int, channels: int = 16, **kwargs) -> ModelReport:
    torch.manual_seed(0)
    x = torch.randn(batch, channels, 32, 32, generator=torch.Generator().manual_seed(0))
    return audit_model(model, x, **kwargs)


def test_the_gate_keeps_parameter_bytes_and_scales_activation_bytes_to_its_batch():
    """Projected from batch 2 to batch 8, the cost equals an audit run at batch 8: the
    standardised weight's copies are paid once a forward, the activation copy per sample."""
    weight = 64 * 16 * 3 * 3 * 4
    small = _at_batch(cm.StandardisedThenCopy(), 2, gate_batch=8).cost
    real = _at_batch(cm.StandardisedThenCopy(), 8, gate_batch=8).cost
    assert (small.batch, small.fixed_bytes, real.fixed_bytes) == (2, 2 * weight, 2 * weight)
    activations = 64 * 32 * 32 * 4 * 2  # per sample: the copy, and its conversion back
    assert small.per_sample_bytes == real.per_sample_bytes == activations
    at = small.at_gate
    assert at.projected and not real.at_gate.projected
    assert (at.batch, at.extra_bytes, at.bytes_written) == (
        8, real.extra_bytes, real.bytes_written,
    )  # fmt: skip
    assert small.fixed_written_bytes == real.fixed_written_bytes > 0  # the weight's copies


def test_a_cost_paid_once_a_forward_shrinks_at_the_gates_batch_and_the_verdict_with_it():
    """dm_nfnet_f0's case: parameter copies offend at batch 2 and weigh 1/4 as much at batch 8."""
    gate = {"fail_share": 2.0, "fail_bytes": 0}
    at_audit = _at_batch(cm.Standardised(), 2, gate_batch=None, **gate)
    projected = _at_batch(cm.Standardised(), 2, gate_batch=64, **gate)
    assert at_audit.verdict is Verdict.OFFENDING and not at_audit.cost.at_gate.projected
    assert projected.cost.at_gate.extra_bytes == at_audit.cost.extra_bytes
    assert projected.verdict is Verdict.MINOR  # the same bytes over 32x the bytes written
    control = _at_batch(cm.Plain(), 2, gate_batch=64, **gate)  # nothing to project
    assert control.cost.at_gate.extra_bytes == 0 and control.verdict is Verdict.CLEAN


def test_a_training_steps_gradients_are_paid_once_a_step():
    """The parameters' gradients (and the optimizer's writes) do not grow with the batch: the
    bytes written projected from batch 2 match a step run at batch 8."""
    small = _at_batch(cm.Plain(), 2, train=True, gate_batch=8).cost
    real = _at_batch(cm.Plain(), 8, train=True, gate_batch=8).cost
    gradient = (64 * 16 * 3 * 3 + 64) * 4
    assert small.fixed_written_bytes >= gradient
    assert small.at_gate.bytes_written == pytest.approx(real.bytes_written, rel=0.01)


def test_cli_judges_at_batch_32_unless_gate_batch_says_otherwise(tmp_path):
    """A 128 KiB copy at batch 2 is 2 MiB at batch 32 (offending, exit 1), 256 KiB at 4."""
    out = tmp_path / "r.json"
    spec = "cost_models:ContiguousCopy"
    args = [spec, "--input-size", "3x32x32", "--json", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 1
    cost = json.loads(out.read_text())["cost"]
    assert (cost["gate"]["batch"], cost["batch"], cost["at_gate"]["extra_bytes"]) == (
        32, 2, 16 * cost["extra_bytes"],
    )  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--gate-batch", "4"])
    assert result.exit_code == 0, result.output
    cost = json.loads(out.read_text())["cost"]
    assert (cost["gate"]["batch"], cost["at_gate"]["extra_bytes"]) == (4, 2 * cost["extra_bytes"])
    assert "at batch 4 (projected from batch 2" in result.output
    refused = CliRunner().invoke(app, [spec, "--gate-batch", "0"])
    assert refused.exit_code == 2 and "--gate-batch" in refused.output


def test_a_permute_around_a_kernel_is_no_root_cause_and_costs_nothing():
    report = _audit(cm.LayerNorm2d())
    assert report.cost.extra_bytes == 0
    assert report.cost.saved_bytes > 0  # NCHW copies inside layer_norm; channels_last does not


def test_a_real_copy_after_the_permute_is_the_fix_site_not_the_view():
    report = _audit(cm.LayerNorm2d(copy=True))
    conversion = next(s for s in _extra_sites(report) if s.kind is CostKind.KERNEL)
    assert conversion.module_path == "after"
    assert conversion.fix_site.python_op == "Tensor.contiguous"


def test_the_fold_writing_nchw_order_is_the_fix_site_not_the_cut_where_the_data_was_lost():
    report = _audit(cm.Folded())
    conversion = next(s for s in _extra_sites(report) if s.module_path == "after")
    assert conversion.kind is CostKind.KERNEL and conversion.extra == MAP
    fold = conversion.fix_site
    assert fold.python_op == "Tensor.contiguous"  # through the pool and the ReLU after it
    (cut,) = [s for s in _extra_sites(report) if s.kind is CostKind.COPY]
    assert cut.op == "Tensor.reshape" and cut.extra == MAP  # the loss itself, still a cost
    assert fold.call_site != cut.call_site
    assert conversion.root_cause.call_site == cut.call_site  # where the NCHW data began
    (regain,) = [r for r in report.regains if r.module_path == "after"]
    assert regain.root_cause.python_op == "Tensor.reshape"  # the root cause stays the loss


def test_a_fold_writing_channels_last_order_leaves_only_the_cut_to_pay_for():
    report = _audit(cm.Folded(fold_channels_last=True))
    (cut,) = _extra_sites(report)
    assert (cut.kind, cut.op, cut.extra) == (CostKind.COPY, "Tensor.reshape", MAP)
    assert cut.fix_site is None and cut.root_cause is None  # the cut made its own data


def test_the_operation_writing_tokens_viewed_as_a_map_is_the_fix_site_not_a_layer_norm():
    report = _audit(cm.NormThenTokens())
    (conversion,) = _extra_sites(report)
    assert (conversion.kind, conversion.module_path, conversion.extra) == (
        CostKind.KERNEL, "dw", MAP,
    )  # fmt: skip
    assert (conversion.fix_site.python_op, conversion.fix_site.module_path) == (
        "torch.conv1d", "proj",
    )  # fmt: skip


def test_mixed_format_elementwise_operations_are_listed_apart_and_never_cost():
    report = _audit(cm.MixedAdd())
    assert report.cost.extra_bytes == 0
    assert [m.op for m in report.cost.mixed] == ["Tensor.add"]
    assert report.cost.mixed[0].bytes_read == MAP


def test_the_terminal_names_the_elementwise_operation_that_read_both_orders():
    """Issue #67: "1 elementwise operations read both orders" said neither which nor where;
    the line names the operation, its line and its bytes; a model reading one order prints
    no such line (the control)."""
    from rich.console import Console

    from cl_audit.render.terminal import render_report

    def printed(report: ModelReport) -> str:
        console = Console(width=200, record=True, color_system=None)
        with console.capture() as capture:
            render_report(report, console)
        return capture.get()

    line = next(n for n, t in enumerate(inspect.getsource(cm).splitlines(), 1) if "x + branch" in t)
    text = printed(_audit(cm.MixedAdd()))
    assert (
        f"1 elementwise operation read both orders (64.0 KiB read strided; no copy, not counted "
        f"in the cost): Tensor.add at cost_models.py:{line} (64.0 KiB)"
    ) in text
    assert "read both orders" not in printed(_audit(cm.Folded(fold_channels_last=True)))


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


@pytest.mark.parametrize(
    "train", [False, pytest.param(True, marks=needs_node_by_node)], ids=["forward", "training"]
)
@pytest.mark.parametrize(
    "model", [cm.TransposeCopy, cm.ContiguousCopy, cm.PermutedCopy, cm.Shuffle]
)
def test_the_nchw_run_kept_for_its_ledger_alone_weighs_as_a_full_audit_of_it(
    monkeypatch, model, train
):
    """The NCHW run applies no rule (``findings=False``: its findings are never read): the
    cost weighed against it, site by site, equals the cost against a full audit of the same run
    (copies both formats make, only one makes, and the conversions after them); the
    channels_last run's findings are its own either way. A ledger-only audit refuses its
    findings."""
    import cl_audit.phases.compare as compare_phase
    from cl_audit.errors import AuditError
    from cl_audit.execution.audit_context import Audit

    reports = []
    for full in (False, True):
        if full:
            instrumented = compare_phase.instrumented
            monkeypatch.setattr(
                compare_phase,
                "instrumented",
                lambda *args, findings, run=instrumented, **kwargs: run(*args, **kwargs),
            )
        reports.append(_fake(model(), train=train))
    ledger_alone, audited = reports
    assert ledger_alone.cost == audited.cost and ledger_alone.offenders == audited.offenders
    assert ledger_alone.cost.sites or model is cm.TransposeCopy
    with Audit(findings=False) as active:
        torch.ones(2, 3, 4, 4).contiguous(memory_format=torch.channels_last).sum()
    with pytest.raises(AuditError, match="ledger alone"):
        active.observed()


def test_fake_mode_predicts_the_same_sites_from_strides():
    torch.manual_seed(0)
    model = cm.ContiguousCopy()
    from cl_audit.execution.settings import AuditSettings, TensorMode
    from cl_audit.phases.audit_module import audit_module

    settings = AuditSettings(tensor_mode=TensorMode.FAKE, gate=Gate(0, 0))
    report = audit_module(model, (_input(),), settings)
    assert report.cost.kernel_copies is Evidence.PREDICTED
    assert report.cost.extra_bytes == 2 * MAP
    assert report.verdict is Verdict.OFFENDING


def _fake(model: torch.nn.Module, train: bool = False, device: str = "cpu") -> ModelReport:
    from cl_audit.execution.settings import AuditSettings, TensorMode
    from cl_audit.phases.audit_module import audit_module

    torch.manual_seed(0)
    settings = AuditSettings(
        tensor_mode=TensorMode.FAKE, gate=Gate(0, 0), train=train, device=device
    )
    return audit_module(model, (_input(),), settings)


@needs_fake_cuda
def test_an_index_torch_makes_from_a_list_never_takes_a_dropped_constants_provenance():
    """An index tensor made from a Python list is made outside any operation the audit sees;
    its storage could take the identity of a parameter-derived constant the model dropped
    just before, and its copy to the device then counted as a parameter's in one run and not
    the other (a site of 512 bytes in csatv2's stem, present in some runs only). Parameter-
    derived outputs are held while the audit runs, so no identity is reused: the list
    indexes' copies are activations' copies in both formats, equal, no site; the control, an
    index the model makes by an operation, is a parameter copy in both, no site either."""
    for _ in range(3):
        report = _fake(cm.ListIndexAfterConstants(), device="cuda")
        assert report.cost.sites == ()
        assert report.cost.extra_bytes == report.cost.saved_bytes == 0


def test_fake_mode_predicts_the_copy_a_kernel_was_measured_to_make_of_a_strided_input():
    """The CPU softmax copies a strided 3-D input inside (``kernel_copies.json``, measured for
    this torch): a fake run, which runs no kernel, predicts the copy the eager run measures."""
    eager, fake = _audit(cm.TokenSoftmax()), _fake(cm.TokenSoftmax())
    assert fake.cost.kernel_copies is Evidence.PREDICTED
    (site,) = _extra_sites(fake)
    assert (site.kind, site.aten_op, site.extra) == (CostKind.KERNEL, "aten._softmax", MAP)
    assert [(s.aten_op, s.call_site, s.extra) for s in _extra_sites(eager)] == [
        (site.aten_op, site.call_site, site.extra)
    ]


def test_fake_mode_predicts_no_copy_where_the_kernel_reads_the_strided_input_as_it_lies():
    """The control: ``bmm`` of the same tokens (a batch of transposed matrices) copies
    nothing, measured; the fake run charges nothing either."""
    eager, fake = _audit(cm.TokenBmm()), _fake(cm.TokenBmm())
    assert _extra_sites(eager) == _extra_sites(fake) == []


def test_fake_mode_predicts_the_saving_where_only_the_nchw_run_hands_a_kernel_strided_data():
    """LayerNorm2d: NCHW permuted to (N, H, W, C) is strided, and the CPU layer norm copies it
    first; channels_last permuted so is contiguous. Fake and eager weigh the same saving."""
    eager, fake = _audit(cm.LayerNorm2d()), _fake(cm.LayerNorm2d())
    assert fake.cost.extra_bytes == eager.cost.extra_bytes == 0
    saves = [[(s.kind, s.aten_op, s.saved) for s in r.cost.sites] for r in (eager, fake)]
    assert saves[0] == saves[1]
    assert (CostKind.KERNEL, "aten.native_layer_norm", MAP) in saves[1]


@needs_fake_cuda
def test_fake_cuda_predicts_the_copies_cuda_kernels_were_measured_to_make():
    """``kernel_copies.json``'s CUDA table (an H200, torch 2.11): the CUDA ``cumsum`` copies
    strided tokens first, so a fake CUDA run charges channels_last that copy at its line; the
    CPU's reads them as it lies (its table has no ``cumsum``), so a fake CPU run charges
    nothing there. Before the table, fake CUDA runs predicted no kernel copy at all."""
    cuda = _fake(cm.TokenCumsum(), device="cuda")
    assert cuda.cost.kernel_copies is Evidence.PREDICTED
    (site,) = _extra_sites(cuda)
    assert (site.kind, site.aten_op, site.extra) == (CostKind.KERNEL, "aten.cumsum", MAP)
    assert site.call_site is not None and site.call_site.startswith("cost_models.py:")
    assert _extra_sites(_fake(cm.TokenCumsum())) == []


def test_an_operation_reading_only_metadata_of_a_channels_last_map_is_no_predicted_copy():
    report = _fake(cm.MetadataFill())
    assert [s.op for s in _extra_sites(report)] == []
    assert report.verdict is Verdict.CLEAN


@needs_node_by_node
def test_a_channel_slices_backward_converts_nothing_itself_in_fake_runs_as_in_eager_ones():
    """``slice_backward`` fills zeros and copies the gradient into the slice, in either order
    alike: eager runs measure no channels_last-only copy there (dpn68b on the CPU and on an
    H200), where fake runs predicted the whole gradient as a conversion (12 of dpn68b's 14.5 MB
    predicted for CUDA; offending where the GPU measured minor). The control: the conversion
    it causes, at the first convolution's backward, is still the cost, and names the slice's
    backward as its fix site."""
    eager, fake = _audit(cm.ChannelSlice(), train=True), _fake(cm.ChannelSlice(), train=True)
    for report in (eager, fake):
        sites = {(s.kind, s.aten_op, s.module_path): s for s in _extra_sites(report)}
        assert not [key for key in sites if key[1] == "aten.slice_backward"]
        conversion = sites[(CostKind.KERNEL, "aten.convolution_backward", "conv")]
        assert conversion.fix_site is not None
        assert conversion.fix_site.aten_op == "aten.slice_backward"
    assert fake.verdict is Verdict.OFFENDING


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


def _record(call, phase, op, inputs, outputs, in_keys, out_keys, parameters=()):
    from cl_audit.intercept.ledger import OpRecord
    from cl_audit.rule.attribution import Location

    return OpRecord(
        call, phase, op, None, inputs, outputs, in_keys, out_keys, set(parameters),
        lambda: Location(None, None, None), None,
    )  # fmt: skip


def _weight_gradient() -> tuple[torch.Tensor, torch.Tensor, list]:
    """A convolution's backward (call 1: its activation gradient, key 11, and a half-precision
    weight gradient, key 12) and the weight gradient cast to float32 (call 2, key 13): the
    activation gradient, the float32 gradient and the two records."""
    aten, back = torch.ops.aten, Phase.BACKWARD
    grad_out, act = torch.zeros(2, 8, 4, 4), torch.zeros(2, 8, 4, 4)  # per sample
    half, full = torch.zeros(8, 8, dtype=torch.half), torch.zeros(8, 8)  # a weight's gradient
    conv_backward = aten.convolution_backward.default
    records = [
        _record(1, back, conv_backward, [grad_out], [act, half], [10], [11, 12]),
        _record(2, back, aten._to_copy.default, [half], [full], [12], [13]),
    ]
    return act, full, records


def test_gradients_are_fixed_through_their_casts_and_a_reused_storage_is_not_one():
    """What the optimizer reads back from the backward (a gradient, and the half-precision
    gradient it was cast from) is paid once a step; an activation gradient is not, nor is the
    backward output whose storage the optimizer's own scratch tensor reused."""
    from cl_audit.intercept.ledger import Ledger

    aten = torch.ops.aten
    _, full, gradient = _weight_gradient()
    stale, scratch = torch.zeros(64), torch.zeros(64)
    ledger = Ledger()
    back, optimizer = Phase.BACKWARD, Phase.OPTIMIZER
    for record in (
        *gradient,
        _record(3, back, aten.neg.default, [full], [stale], [13], [14]),  # freed, id reused below
        _record(4, optimizer, aten.mul.Tensor, [full], [scratch], [13], [14]),
        _record(5, optimizer, aten._foreach_add_.List, [full, scratch], [], [13, 14], []),
    ):
        ledger.observe(record)
    step = 8 * 8 * 2 + 8 * 8 * 4 + 64 * 4  # the gradient, its half form, the scratch tensor
    assert ledger.written == 2 * 8 * 4 * 4 * 4 + step + 64 * 4
    assert ledger.written_fixed == step  # not the activation gradient, not the stale output


def test_a_backward_output_whose_storage_a_parameter_derived_one_reused_is_not_fixed():
    """A parameter-derived output made in the backward (counted fixed as it is written) may
    take the storage of a backward output freed before it; when the optimizer reads it, the
    freed output is not one of the step's gradients (it was counted fixed by chance, as the
    allocator reused addresses: nfnet's bytes differed from run to run). The control: the
    gradient and its half-precision form are fixed."""
    from cl_audit.intercept.ledger import Ledger

    aten = torch.ops.aten
    act, full, gradient = _weight_gradient()
    freed, derived, weight = torch.zeros(64), torch.zeros(64), torch.zeros(64)
    ledger = Ledger()
    back, optimizer = Phase.BACKWARD, Phase.OPTIMIZER
    for record in (
        *gradient,
        _record(3, back, aten.neg.default, [act], [freed], [11], [14]),  # freed: 14 reused below
        _record(4, back, aten.mul.Tensor, [weight], [derived], [20], [14], parameters={20, 14}),
        _record(5, optimizer, aten._foreach_add_.List, [full, derived], [], [13, 14], []),
    ):
        ledger.observe(record)
    gradient = 8 * 8 * 2 + 8 * 8 * 4  # the gradient and its half form
    assert ledger.written_fixed == gradient + 64 * 4  # and the parameter-derived output


def test_a_backward_output_whose_storage_an_empty_tensor_reused_is_not_fixed():
    """An empty tensor made in the backward (cuDNN batch norm's reserve space, cloned when the
    node runs outside torch's engine) writes no byte but may take the storage of a backward
    output freed before it; an operation that reads it beside what the optimizer later reads
    does not make the freed output one of the step's gradients (cspresnet50's fixed bytes moved
    by 0.5-3 MB between runs, as the allocator reused addresses). The control: the gradient,
    its half-precision form and the weight gradient read beside the empty tensor are fixed."""
    from cl_audit.intercept.ledger import Ledger

    aten = torch.ops.aten
    act, full, gradient = _weight_gradient()
    freed, weight_grad, empty, reserve = (
        torch.zeros(64),
        torch.zeros(64),
        torch.zeros(0),
        torch.zeros(0),
    )
    ledger = Ledger()
    back, optimizer = Phase.BACKWARD, Phase.OPTIMIZER
    for record in (
        *gradient,
        _record(3, back, aten.neg.default, [act], [freed], [11], [14]),  # freed: 14 reused below
        _record(4, back, aten.clone.default, [reserve], [empty], [30], [14]),
        _record(5, back, aten.mul.Tensor, [act, empty], [weight_grad], [11, 14], [15]),
        _record(6, optimizer, aten._foreach_add_.List, [full, weight_grad], [], [13, 15], []),
    ):
        ledger.observe(record)
    assert ledger.written_fixed == 8 * 8 * 2 + 8 * 8 * 4 + 64 * 4


def test_a_gradient_copied_to_its_parameters_strides_settles_the_chain_behind_it():
    """``AccumulateGrad`` lays a gradient out as its parameter by a ``copy_`` into a
    ``new_empty_strided`` made at the module, a storage the recorder calls parameter-derived:
    the copy is still a backward output, so the optimizer reading it settles the weight-shaped
    chain behind it (the convolution's weight gradient and its cast) as paid once a step; a
    weight-standardised net's fixed bytes fell short of a two-batch fit by those (nf_resnet26:
    88 MB). Control: a parameter-derived output the backward makes from parameters alone is
    fixed as it is written."""
    from cl_audit.intercept.ledger import Ledger

    aten = torch.ops.aten
    _, full, gradient = _weight_gradient()
    laid_out, weight, derived = torch.zeros(8, 8), torch.zeros(64), torch.zeros(64)
    ledger = Ledger()
    back, optimizer = Phase.BACKWARD, Phase.OPTIMIZER
    for record in (
        *gradient,
        _record(
            3, back, aten.new_empty_strided.default, [full], [laid_out], [13], [30], parameters={30}
        ),
        _record(
            4,
            back,
            aten.copy_.default,
            [laid_out, full],
            [laid_out],
            [30, 13],
            [30],
            parameters={30},
        ),
        _record(5, back, aten.mul.Tensor, [weight], [derived], [20], [21], parameters={20, 21}),
        _record(6, optimizer, aten._foreach_add_.List, [laid_out], [], [30], []),
    ):
        ledger.observe(record)
    chain = 8 * 8 * 2 + 8 * 8 * 4 + 8 * 8 * 4  # the half gradient, its cast, the copy
    assert ledger.written_fixed == 8 * 8 * 4 + chain + 64 * 4  # the empty, the chain, derived


def test_audit_model_given_a_factory_says_to_call_it():
    """Issue #67: ``audit_model(lambda: net)`` raised AttributeError ('modules'). The control:
    the module the factory makes audits."""
    with pytest.raises(TypeError, match=r"not a function \(a factory\? call it"):
        audit_model(lambda: cm.ContiguousCopy(), torch.randn(2, 3, 8, 8))
    with pytest.raises(TypeError, match=r"an nn\.Module, not a str$"):
        audit_model("resnet18", torch.randn(2, 3, 8, 8))
    assert audit_model(cm.ContiguousCopy(), torch.randn(2, 3, 8, 8), verify=False).cost


def test_the_verdict_line_names_the_site_that_saves():
    """Issue #67: "saves 1.1 MiB at 1 site" never said where. The control: a model that saves
    nothing says nothing more."""
    from cl_audit.render.wording import cost_line

    saving = cost_line(_audit(cm.PermutedCopy()).cost, train=False)
    assert "saves 64.0 KiB at 1 site (Tensor.contiguous at " in saving
    assert "cost_models.py:" in saving.split("at 1 site (")[1]
    assert "saves 0 B; net" in cost_line(_audit(cm.ContiguousCopy()).cost, train=False)
