"""Remedies proven by what-if runs (``cl_audit.phases.verify``): a change made at its line in
both layouts is verified only when the model still runs, its output is kept and the cost at
its sites falls; the changes that break the model are shown failed and not offered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cost_models as cm
import jsonschema
import pytest
import remedy_models as rm
import torch
import torchvision
import training_models as tm
from literal_reports import before_version_8
from torch import nn
from torch_checks import dropout_draws_in_memory_order, needs_node_by_node
from typer.testing import CliRunner

from cl_audit import audit_model
from cl_audit.cli import app
from cl_audit.compare.kept import nearest, restrided
from cl_audit.enums import RemedyStatus
from cl_audit.report import ModelReport, load_schema

ANY = {"fail_share": 0.0, "fail_bytes": 0}
SHUFFLE = "F.channel_shuffle(x, groups)"


def _input(size: int = 16) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


def _audit(model: torch.nn.Module, **kwargs) -> ModelReport:
    torch.manual_seed(0)
    return audit_model(model, _input(), **{**ANY, **kwargs})


def _remedies(report: ModelReport) -> dict[str, object]:
    """Each tried line's remedy (by the line its changes were made at)."""
    found = {}
    for site in report.cost.sites:
        for trial in site.remedy.evidence if site.remedy is not None else ():
            found[trial.line] = site.remedy
    return found


def _line(model: type, text: str) -> str:
    import inspect

    lines, start = inspect.getsourcelines(model.forward)
    (number,) = [start + i for i, line in enumerate(lines) if text in line]
    return f"remedy_models.py:{number}"


def test_a_change_that_holds_is_verified_and_one_that_breaks_the_view_is_refuted():
    report = _audit(rm.TwoCopies())
    remedies = _remedies(report)
    droppable = remedies[_line(rm.TwoCopies, "# droppable")]
    needed = remedies[_line(rm.TwoCopies, "# needed by the view")]
    assert droppable.status is RemedyStatus.VERIFIED and droppable.verified
    assert droppable.advice == "drop the .contiguous()"
    held = [t for t in droppable.evidence if t.holds]
    assert held and all(
        t.max_abs_diff <= t.tolerance and t.site_bytes_after == 0 and t.moved_bytes <= 0
        for t in held
    )
    assert needed.status is RemedyStatus.REFUTED and not needed.verified
    assert needed.evidence and all(
        not t.holds and f"Tensor.view at {_line(rm.TwoCopies, 'needed')}" in t.failure
        for t in needed.evidence
    )
    assert report.cost.verify_seconds is not None
    data = json.loads(report.to_json())
    jsonschema.validate(data, load_schema("report"))
    assert ModelReport.from_dict(data) == report


def test_the_channel_shuffle_is_proven_where_the_contiguous_edits_break_the_view():
    report = _audit(cm.Shuffle())
    (remedy,) = _remedies(report).values()
    assert remedy.status is RemedyStatus.VERIFIED and SHUFFLE in remedy.advice
    by_change = {t.change.split()[0]: t for t in remedy.evidence}
    assert by_change["replace"].holds and by_change["replace"].extra_bytes_after == 0
    for edit in ("drop", "write"):
        assert not by_change[edit].holds and "Tensor.view" in by_change[edit].failure
    control = _audit(rm.ShuffledByTorch())
    assert control.cost.extra_bytes == 0 and control.cost.verify_seconds is None


def test_the_channel_shuffle_change_is_tried_only_where_the_pattern_is():
    remedies = _remedies(_audit(rm.TwoCopies()))
    changes = {t.change for r in remedies.values() for t in r.evidence}
    assert changes and not any(SHUFFLE in c for c in changes)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"verify": False}, "verification off"),
    ],
)
def test_an_untried_remedy_is_a_lead_that_says_why(kwargs, reason):
    report = _audit(rm.TwoCopies(), **kwargs)
    remedies = [s.remedy for s in report.cost.sites if s.remedy is not None]
    assert remedies and all(
        r.status is RemedyStatus.LEAD and not r.evidence and reason in r.note for r in remedies
    )


def test_a_version_7_remedy_reads_back_as_a_lead():
    data = before_version_8(_audit(rm.TwoCopies()).to_dict()) | {"version": 7}
    jsonschema.validate(data, load_schema("report", 7))
    old = ModelReport.from_dict(data)
    assert all(
        s.remedy.status is RemedyStatus.LEAD and not s.remedy.evidence
        for s in old.cost.sites
        if s.remedy is not None
    )
    jsonschema.validate(old.to_dict(), load_schema("report"))


def test_shufflenet_gets_the_verified_channel_shuffle_not_the_contiguous_edits():
    torch.manual_seed(0)
    model = torchvision.models.shufflenet_v2_x0_5()
    report = audit_model(model, _input(64))
    remedies = _remedies(report)
    assert remedies and all(r.status is RemedyStatus.VERIFIED for r in remedies.values())
    assert all(SHUFFLE in r.advice for r in remedies.values())
    failed = [t for r in remedies.values() for t in r.evidence if not t.holds]
    assert failed and all("Tensor.view at torchvision/models/shufflenetv2.py" in t.failure
                          for t in failed)  # fmt: skip


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "160"}, catch_exceptions=False)


def test_cli_verifies_one_model_and_no_verify_leaves_leads(tmp_path):
    model = ("tests/remedy_models.py:TwoCopies", "--input-size", "3x16x16", "--fail-bytes", "0")
    verified = _invoke(*model, "--json", str(tmp_path / "v.json"))
    assert verified.exit_code == 1, verified.output
    assert "remedy, verified on this model: drop the .contiguous()" in verified.output
    assert "changes tried at remedy_models.py:" in verified.output
    statuses = {
        s["remedy"]["status"]
        for s in json.loads((tmp_path / "v.json").read_text())["cost"]["sites"]
        if s["remedy"]
    }
    assert statuses == {"verified", "refuted"}
    lead = _invoke(*model, "--no-verify", "--json", str(tmp_path / "l.json"))
    assert lead.exit_code == 1, lead.output
    assert "remedy (a lead, not tried: verification off" in lead.output
    cost = json.loads((tmp_path / "l.json").read_text())["cost"]
    assert cost["verify_seconds"] is None
    assert {s["remedy"]["status"] for s in cost["sites"] if s["remedy"]} == {"lead"}


def test_a_sweep_proves_remedies_only_with_verify(tmp_path):
    models = ("tests/remedy_models.py:TwoCopies", "tests/cost_models.py:Shuffle")
    swept = _invoke(*models, "--input-size", "3x16x16", "--verify", "--json", str(tmp_path / "s"))
    assert swept.exit_code == 0, swept.output
    data = json.loads((tmp_path / "s").read_text())
    jsonschema.validate(data, load_schema("sweep"))
    statuses = {
        row["name"].split(":")[1]: {
            s["remedy"]["status"] for s in row["cost"]["sites"] if s["remedy"]
        }
        for row in data["models"]
    }
    assert statuses == {"TwoCopies": {"verified", "refuted"}, "Shuffle": {"verified"}}


def test_a_change_where_the_nchw_data_began_is_tried_and_verified_beyond_the_fix_site():
    report = _audit(rm.AttentionFold())
    (site,) = [s for s in report.cost.sites if s.extra]
    began = _line(rm.AttentionFold, "# where the NCHW data begins")
    assert site.fix_site.python_op == "Tensor.reshape"  # the fold writes the map: no change
    assert site.root_cause.python_op == "Tensor.contiguous"
    assert site.root_cause.call_site.endswith(began)
    assert site.remedy.status is RemedyStatus.VERIFIED
    assert site.remedy.advice == "drop the .contiguous()"
    (held,) = [t for t in site.remedy.evidence if t.holds]
    assert held.line.endswith(began) and held.extra_bytes_after == 0


def test_untried_the_fold_keeps_its_cost_and_its_fix_sites_lead():
    report = _audit(rm.AttentionFold(), verify=False)
    (site,) = [s for s in report.cost.sites if s.extra]
    assert site.remedy.status is RemedyStatus.LEAD and not site.remedy.evidence
    assert site.remedy.pattern == "flatten or reshape of a channels_last map"


def test_a_reshape_lead_is_the_entry_whose_pattern_fits_the_calls_shapes():
    """Issue #67: untried (a fake run, no what-ifs), the per-channel ``reshape(b * c, 1, h, w)``
    was offered the catalogue's first reshape entry, the token flattening; the ledger keeps each
    copying call's shapes (copied, returned) and an entry is offered only where they fit: batch
    and channels merged get the grouped convolution. The control: a reshape that keeps the
    batch (the attention fold's) is still offered the flattening, fake or eager."""
    from cl_audit.enums import TensorMode
    from cl_audit.execution.settings import AuditSettings
    from cl_audit.phases.audit_module import audit_module

    flatten, per_channel = "flatten or reshape of a channels_last map", "batch and channels of"

    def reshapes(model: nn.Module, mode: TensorMode) -> set[str]:
        torch.manual_seed(0)
        settings = AuditSettings(tensor_mode=mode, verify=False)
        report = audit_module(model, (_input(),), settings)
        patterns = {s.remedy.pattern for s in report.cost.sites if s.extra and s.remedy}
        return {p for p in patterns if p.startswith((flatten, per_channel))}

    for mode in (TensorMode.FAKE, TensorMode.EAGER):
        (found,) = reshapes(rm.NewUserNet(), mode)
        assert found.startswith(per_channel), mode
        assert reshapes(rm.AttentionFold(), mode) == {flatten}, mode


def test_a_fold_whose_upstream_changes_all_fail_stays_a_lead_showing_them():
    report = _audit(rm.AttentionFold(flat=True))
    (site,) = [s for s in report.cost.sites if s.extra]
    assert site.remedy.status is RemedyStatus.LEAD  # the fold's own remedy was never tried
    assert site.remedy.pattern == "flatten or reshape of a channels_last map"
    assert site.remedy.evidence and all(t.failure for t in site.remedy.evidence)
    assert "none held where its NCHW data began" in site.remedy.note


def test_weight_standardisation_in_memory_order_is_verified_and_removes_both_copies():
    """timm's StdConv2d: the channels_last weight's rows taken in (kh, kw, in) order, normalised
    per output channel and read back so: the same weight, channels_last, no copy."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 16, 16, generator=torch.Generator().manual_seed(0))
    report = audit_model(cm.Standardised(), x, **ANY)
    sites = [s for s in report.cost.sites if s.extra]
    assert len(sites) == 2 and all(s.remedy.status is RemedyStatus.VERIFIED for s in sites)
    (trial,) = {t for s in sites for t in s.remedy.evidence if "permute" in t.change}
    assert trial.holds and trial.applied == 1 and trial.max_abs_diff <= trial.tolerance
    assert trial.site_bytes_before == report.cost.extra_bytes and trial.extra_bytes_after == 0
    assert "permute(0, 2, 3, 1)" in sites[0].remedy.advice
    # the weight the convolution reads is the standardised one, not the parameter: keeping the
    # parameter as it was is tried too (and holds on this CPU), after the catalogue's own edit
    kept = {t for s in sites for t in s.remedy.evidence if t.change.startswith("keep conv.weight")}
    assert kept and any(t.holds for t in kept)


def test_rows_transformed_in_their_order_refute_the_memory_order_change():
    report = _audit(rm.CumulativeRows())
    sites = [s for s in report.cost.sites if s.extra]
    trials = {t for s in sites for t in s.remedy.evidence if "permute" in t.change}
    assert sites and trials and not any(t.holds for t in trials)
    assert all(t.max_abs_diff > t.tolerance for t in trials)
    # what holds is keeping the weight as it was (strides, not values, change): never the edit
    assert all(not s.remedy.verified or s.remedy.advice.startswith("keep weight") for s in sites)


def test_a_batch_allocated_nchw_is_allocated_channels_last_and_verified():
    report = _audit(rm.PaddedBatch())
    (site,) = [s for s in report.cost.sites if s.extra]
    assert site.fix_site.python_op == "Tensor.new_full"
    assert site.remedy.status is RemedyStatus.VERIFIED
    (trial,) = site.remedy.evidence
    assert trial.line.endswith(_line(rm.PaddedBatch, "# the allocation"))
    # the same values, up to the rounding of a convolution in the other order (CPU-dependent:
    # 0 on some machines, 3.6e-07 on an AMD EPYC)
    assert trial.holds and trial.extra_bytes_after == 0
    assert trial.max_abs_diff <= trial.tolerance


def test_a_batch_read_through_a_view_refutes_allocating_it_channels_last():
    report = _audit(rm.PaddedBatch(flat=True))
    (site,) = [s for s in report.cost.sites if s.extra]
    assert site.remedy.status is RemedyStatus.REFUTED
    (trial,) = site.remedy.evidence
    assert not trial.holds and "Tensor.view" in trial.failure


@pytest.mark.parametrize("log", [False, True])
def test_a_softmax_over_channels_is_taken_over_the_channels_last_views_last_dim(log):
    report = _audit(rm.ChannelSoftmax(log=log))
    sites = [s for s in report.cost.sites if s.extra]
    assert sites and all(s.remedy.status is RemedyStatus.VERIFIED for s in sites)
    (trial,) = {t for s in sites for t in s.remedy.evidence}
    assert trial.line.endswith(_line(rm.ChannelSoftmax, "# the softmax"))
    assert trial.holds and trial.applied == 1 and trial.extra_bytes_after == 0
    assert trial.max_abs_diff <= trial.tolerance
    assert ("log_softmax(-1)" if log else ".softmax(-1)") in trial.change


def test_a_softmax_over_the_width_is_still_flagged_and_not_changed():
    report = _audit(rm.ChannelSoftmax(dim=-1))
    sites = [s for s in report.cost.sites if s.extra]
    assert sites and report.cost.extra_bytes > 0  # it copies: flagged as before
    assert all(s.remedy.status is RemedyStatus.LEAD and not s.remedy.evidence for s in sites)


@pytest.mark.parametrize("volumes", [False, True], ids=["2d", "3d"])
def test_an_instance_norm_is_normalised_as_a_group_norm_and_verified(volumes):
    torch.manual_seed(0)
    x = _input() if not volumes else torch.randn(2, 3, 8, 8, 8)
    report = audit_model(rm.InstanceNormed(volumes=volumes), x, **ANY)
    sites = [s for s in report.cost.sites if s.extra]
    assert {s.op for s in sites} >= {"F.instance_norm"}
    assert all(s.remedy.status is RemedyStatus.VERIFIED for s in sites)
    (trial,) = {t for s in sites for t in s.remedy.evidence}
    assert trial.line.endswith(_line(rm.InstanceNormed, "# the instance norm"))
    assert trial.holds and trial.applied == 1 and trial.extra_bytes_after == 0
    assert trial.max_abs_diff <= trial.tolerance and "nn.GroupNorm(C, C)" in trial.change


def test_an_instance_norm_with_running_statistics_is_still_flagged_and_not_changed():
    report = _audit(rm.InstanceNormed(tracked=True))
    sites = [s for s in report.cost.sites if s.extra]
    assert {s.op for s in sites} >= {"F.instance_norm"}  # it copies: flagged as before
    assert all(s.remedy.status is RemedyStatus.LEAD and not s.remedy.evidence for s in sites)


def test_planes_merged_from_batch_and_channels_are_filtered_by_a_grouped_convolution():
    report = _audit(rm.PlaneFilter())
    sites = [s for s in report.cost.sites if s.extra]
    merge = _line(rm.PlaneFilter, "# the merge")
    (site,) = [s for s in sites if s.call_site.endswith(merge)]
    assert site.op == "Tensor.reshape" and site.remedy.status is RemedyStatus.VERIFIED
    (trial,) = site.remedy.evidence
    assert trial.holds and trial.applied == 1 and trial.site_bytes_after == 0
    assert trial.max_abs_diff <= trial.tolerance and "groups=c" in trial.change


def test_planes_merged_for_another_purpose_are_still_flagged_and_the_change_refuted():
    report = _audit(rm.PlaneFilter(pooled=True))
    merge = _line(rm.PlaneFilter, "# the merge")
    (site,) = [s for s in report.cost.sites if s.extra and s.call_site.endswith(merge)]
    assert site.op == "Tensor.reshape"  # it copies: flagged as before
    assert site.remedy.status is not RemedyStatus.VERIFIED
    assert any("groups=c" in t.change and not t.holds for t in site.remedy.evidence)


def test_a_restrided_parameter_no_convolution_uses_is_named_and_kept_as_it_was():
    """SAM's pos_embed: a (1, H, W, C) table that Module.to restrides to channels_last, reshaped
    to tokens every forward (a copy in channels_last only). The remedy names it and keeping it
    as it was is verified; the patch convolution's weight is never a candidate."""
    report = _audit(tm.ResizedPositions(resized=False))
    (site,) = [s for s in report.cost.sites if s.extra]
    assert site.kind.value == "parameter" and site.remedy.verified
    assert site.remedy.advice.startswith("keep table as it was")
    (trial,) = site.remedy.evidence
    assert trial.holds and trial.site_bytes_after == 0 and trial.extra_bytes_after == 0
    assert not any("patch.weight" in t.change for s in report.cost.sites for t in s.remedy.evidence)


def test_the_restrided_candidates_leave_out_what_a_convolution_took_as_its_weight():
    model = tm.ResizedPositions(resized=False).to(memory_format=torch.channels_last)
    assert restrided(model, frozenset({"patch.weight"})) == ("table",)
    assert restrided(model, frozenset()) == ("table", "patch.weight")
    # each site tries the tensors its own module or an enclosing one holds, innermost first
    blocks = ("a.0.attn.table", "a.1.attn.table", "pos", "b.table")
    assert nearest(blocks, "a.1.attn.mlp.0") == ("a.1.attn.table", "pos")
    assert nearest(blocks, "c.0") == ("pos",)
    assert nearest(("a.0.t", "b.0.t"), "c") == ("a.0.t", "b.0.t")  # none held there: largest
    # the control: the table given back its NCHW strides is no candidate
    model.table.data = model.table.data.contiguous()
    assert restrided(model, frozenset({"patch.weight"})) == ()


class _PositionsBeside(nn.Module):
    """ResizedPositions inside a model that holds two more restrided tables at its root, the
    larger first: an untried lead names the two its trials would keep (``nearest``: the site's
    own module's table, then the largest its root holds), not every restrided tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.positions = tm.ResizedPositions(resized=False)
        self.register_buffer("large", torch.zeros(1, 8, 6, 6))
        self.register_buffer("small", torch.zeros(1, 8, 2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.positions(x)


def test_an_untried_keep_lead_names_the_tensors_nearest_its_site_not_every_one():
    torch.manual_seed(0)
    report = audit_model(_PositionsBeside(), _input(), train=True, verify=False, **ANY)
    lead = next(s.remedy for s in report.cost.sites if s.op == "Tensor.reshape")
    assert lead.note.endswith("(it would keep one of: positions.table, large)")
    # the control: the model's own ResizedPositions alone names its one table
    alone = audit_model(
        tm.ResizedPositions(resized=False), _input(), train=True, verify=False, **ANY
    )
    (only,) = [s.remedy for s in alone.cost.sites if s.op == "Tensor.reshape"]
    assert only.note.endswith("(it would keep one of: table)")


def test_in_training_the_parameter_and_its_gradient_copy_are_verified_keeping_it():
    """A training step's what-if keeps the table as it was: its reshape and its gradient's copy
    into the restrided layout both go (they were leads while training was not tried)."""
    torch.manual_seed(0)
    report = audit_model(tm.ResizedPositions(resized=False), _input(), train=True, **ANY)
    found = {s.op: s.remedy for s in report.cost.sites if s.extra and s.remedy is not None}
    for op in ("Tensor.reshape", "torch::autograd::AccumulateGrad"):
        assert found[op].status is RemedyStatus.VERIFIED
        (trial,) = found[op].evidence
        assert trial.holds and trial.change.startswith("keep table as it was")
    # the convolution backward's lead is the kernel's, naming no tensor to keep
    assert found["ConvolutionBackward0"].status is RemedyStatus.LEAD
    assert "keep" not in (found["ConvolutionBackward0"].note or "")


# --- remedies tried in a training step (issue #67) --------------------------------------------


def _train(model: nn.Module) -> ModelReport:
    torch.manual_seed(0)
    return audit_model(model, _input(), train=True, **ANY)


def test_a_training_audit_tries_the_group_norm_in_a_step_and_the_backward_site_follows_it():
    """The issue's model: the instance norm's group-norm change is made in a whole training step
    (forward, backward, optimizer step), held to the unchanged step's loss and gradients, and
    verified; the convolution backward reading the instance norm's NCHW gradient gets that
    remedy, where it was told "a kernel matter" before."""
    report = _train(rm.NewUserNet())
    norm_line = _line(rm.NewUserNet, "# the instance norm")
    (norm,) = [s for s in report.cost.sites if s.op == "F.instance_norm" and s.extra]
    assert norm.remedy.status is RemedyStatus.VERIFIED and "GroupNorm" in norm.remedy.advice
    (trial,) = norm.remedy.evidence
    assert trial.line.endswith(norm_line) and trial.applied == 1 and trial.holds
    assert trial.site_bytes_after < trial.site_bytes_before
    backward = [
        s for s in report.cost.sites
        if s.op.startswith("ConvolutionBackward") and s.extra
        and s.fix_site is not None and s.fix_site.call_site.endswith(norm_line)
    ]  # fmt: skip
    assert backward and all(s.remedy.status is RemedyStatus.VERIFIED for s in backward)
    assert all("GroupNorm" in s.remedy.advice for s in backward)
    (merge,) = [s for s in report.cost.sites if s.op == "Tensor.reshape" and s.extra]
    assert merge.remedy.status is RemedyStatus.VERIFIED and "groups=c" in merge.remedy.advice
    # what was held is said as what it was: a step's loss and gradients, a forward's output
    assert "proven: loss and gradients max |diff|" in _printed(report)
    assert "output max |diff|" not in _printed(report)
    assert "proven: output max |diff|" in _printed(_audit(rm.NewUserNet()))  # the control


def _printed(report: ModelReport) -> str:
    from rich.console import Console

    from cl_audit.render.terminal import render_report

    console = Console(width=200, record=True, color_system=None)
    with console.capture() as capture:
        render_report(report, console)
    return capture.get()


def test_the_training_what_ifs_leave_the_model_and_the_random_state_as_the_audit_left_them():
    """The same training audit with and without its what-if steps: the model's parameters and
    buffers and the caller's random state afterwards are the same (each step starts from the
    state the audit left, seeded, and puts it back)."""
    states = []
    for verify in (True, False):
        model = rm.NewUserNet()
        torch.manual_seed(0)
        report = audit_model(model, _input(), train=True, verify=verify, **ANY)
        assert any(s.remedy is not None and s.remedy.evidence for s in report.cost.sites) is verify
        states.append((model.state_dict(), torch.random.get_rng_state()))
    (tried, rng_tried), (plain, rng_plain) = states
    assert torch.equal(rng_tried, rng_plain)
    for name, tensor in plain.items():
        torch.testing.assert_close(tried[name], tensor, rtol=0, atol=0)


def test_an_instance_norm_with_running_statistics_is_not_changed_in_a_training_step():
    report = _train(rm.InstanceNormed(tracked=True))
    sites = [s for s in report.cost.sites if s.op == "F.instance_norm" and s.extra]
    assert sites and all(s.remedy.status is RemedyStatus.LEAD for s in sites)
    assert all(not s.remedy.evidence for s in sites)


@pytest.mark.parametrize(
    "p",
    [
        pytest.param(
            0.5,
            marks=pytest.mark.skipif(
                not dropout_draws_in_memory_order(),
                reason="this torch draws a dropout's mask alike in both layouts",
            ),
            id="dropout",
        ),
        pytest.param(0.0, id="control"),
    ],
)
def test_a_step_whose_layouts_differ_unchanged_holds_no_change_to_either(p):
    report = _train(rm.DroppedInstanceNorm(p))
    (norm,) = [s for s in report.cost.sites if s.op == "F.instance_norm" and s.extra]
    if p:
        assert norm.remedy.status is RemedyStatus.LEAD and not norm.remedy.evidence
        assert "differs between the layouts" in norm.remedy.note
    else:
        assert norm.remedy.status is RemedyStatus.VERIFIED


@needs_node_by_node
def test_a_fake_training_audit_keeps_its_remedies_as_leads_and_says_why():
    models = str(Path(rm.__file__))
    args = [f"{models}:NewUserNet", "--train", "--fake", "--input-size", "3x16x16"]
    result = CliRunner().invoke(app, [*args, "--batch-size", "2", "--json", "-"])
    assert result.exit_code == 1, result.output  # offending by its bytes, as eagerly
    sites = json.loads(result.stdout)["cost"]["sites"]
    remedies = [s["remedy"] for s in sites if s["remedy"] is not None]
    assert remedies and all(r["status"] == "lead" and not r["evidence"] for r in remedies)
    assert all("a fake run computes no values" in r["note"] for r in remedies)


# --- a concatenation of mixed layouts (issue #67) ----------------------------------------------


def test_a_cat_with_a_fresh_nchw_mask_names_the_mask_and_verifies_making_it_channels_last():
    """``torch.cat([map, torch.ones(b, 1, h, w)])``: the one-channel mask's strides suggest NCHW,
    so the cat writes NCHW and the next convolution converts it; the site names the mask (its
    operand, shape and the factory line that made it) and the change holds."""
    report = _audit(rm.NewUserNet())
    mask_line = _line(rm.NewUserNet, "# the mask")
    (site,) = [s for s in report.cost.sites if s.fix_site and s.fix_site.python_op == "torch.cat"]
    assert site.remedy.status is RemedyStatus.VERIFIED
    (trial,) = site.remedy.evidence
    assert trial.holds and trial.site_bytes_after < trial.site_bytes_before
    told = rf"operand 1 \(2x1x32x32, NCHW strides, made by torch\.ones at \S*{mask_line}\)"
    assert re.search(told, trial.change), trial.change


def test_a_cat_with_a_mask_made_like_its_partner_keeps_channels_last():
    report = _audit(rm.NewUserNet(mask_like=True))
    assert not [s for s in report.cost.sites if s.fix_site and s.fix_site.python_op == "torch.cat"]
    assert {s.op for s in report.cost.sites if s.extra} >= {"F.instance_norm"}  # still audited


def test_the_default_loss_is_placed_as_cl_audit_s_own_never_at_the_caller_s_frame():
    """The default training loss is cl-audit's code: its operations (the sum whose backward writes
    the NCHW gradient here) are placed at the training loss, not at the frame that called the
    audit (this file; the CLI library's under ``cl-audit``). The control: a loss the user gives
    is the user's code, placed at its line."""
    from cl_audit.execution.training import LOSS_SITE

    def producers(report: ModelReport) -> set[tuple[str, str]]:
        return {(p.python_op, p.call_site) for s in report.cost.sites for p in s.upstream}

    found = producers(_train(rm.NewUserNet()))
    assert ("Tensor.sum", LOSS_SITE) in found
    assert not [site for _, site in found if site and Path(__file__).name in site]
    torch.manual_seed(0)
    own = audit_model(rm.NewUserNet(), _input(), train=True, loss=lambda out: out.sum(), **ANY)
    sums = {site for op, site in producers(own) if op == "Tensor.sum"}
    assert sums and all(Path(__file__).name in site for site in sums)
