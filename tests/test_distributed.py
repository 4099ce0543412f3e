"""Channels_last under DistributedDataParallel (``--train --ddp``) and FSDP (``--train --fsdp``):
real gloo processes on this CPU, a toy converted after wrapping reported with the order as the
fix, the same toy converted before wrapping (the positive control) clean, and FSDP2's refusal
named by parameter."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from test_cli import invoke
from torch_checks import BACKWARD_PROBLEM

from cl_audit.compat.versions import TORCH_VERSION
from cl_audit.enums import BucketMatch, WrapOrder
from cl_audit.report import ModelReport, load_schema
from cl_audit.report.distributed_report import bucket_match

TOY = str(Path(__file__).with_name("ddp_models.py")) + ":small_conv_net"
B = BucketMatch


def test_strides_differing_only_in_size_one_dims_are_ambiguous_not_mismatched():
    """A 1x1 kernel's weight is both orders at once: DDP compares every stride (and warns),
    autograd's layout contract ignores size-1 dims; a 3x3 kernel's orders differ for real."""
    assert bucket_match((16, 8, 1, 1), (8, 1, 8, 8), (8, 1, 1, 1)) is B.AMBIGUOUS
    assert bucket_match((16, 8, 3, 3), (72, 1, 24, 8), (72, 9, 3, 1)) is B.MISMATCHED
    assert bucket_match((16, 8, 3, 3), (72, 1, 24, 8), (72, 1, 24, 8)) is B.MATCHES


@pytest.fixture(scope="module")
def ddp_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "report.json"
    result = invoke(TOY, "--train", "--ddp", "--no-verify", "--json", str(out))
    data = json.loads(out.read_text())
    assert "summary" in data, result.output  # an error report says why the ranks failed
    offending = data["summary"]["verdict"] == "offending"
    assert result.exit_code == (1 if offending else 0), result.output  # exit as the verdict says
    return result.output, data


def test_cl_audit_train_ddp_runs_two_gloo_processes_and_reports_the_buckets(ddp_report):
    output, data = ddp_report
    jsonschema.validate(data, load_schema("report"))
    check = ModelReport.from_dict(data).ddp
    assert check.world_size == 2 and check.backend == "gloo" and check.ranks_agree
    assert {(r.order, r.bucket_view) for r in check.runs} == {
        (order, view) for order in WrapOrder for view in (False, True)
    }
    assert "Under DDP (gloo, 2 processes)" in output


def test_converting_after_wrapping_mismatches_the_buckets_and_the_order_is_the_fix(ddp_report):
    output, data = ddp_report
    check = ModelReport.from_dict(data).ddp
    after = check.run(WrapOrder.AFTER, False)
    by_name = {p.name: p for p in after.parameters}
    first = by_name["features.0.weight"]
    assert first.match is B.MISMATCHED and first.bucket_strides == (27, 9, 3, 1)
    assert first.strides == (27, 1, 9, 3)  # channels_last, where the bucket is NCHW
    assert by_name["features.3.weight"].match is B.AMBIGUOUS  # the 1x1 kernel
    assert after.warning is not None and "bucket view strides" in after.warning
    # gradient_as_bucket_view: the gradients are the NCHW bucket views themselves
    viewed = {p.name: p for p in check.run(WrapOrder.AFTER, True).parameters}
    assert viewed["features.0.weight"].grad_strides == (27, 9, 3, 1)
    assert check.advice is not None and "before wrapping" in check.advice
    assert "remedy: convert the model to channels_last before wrapping it in DDP" in output


def test_converting_before_wrapping_is_clean(ddp_report):
    """The positive control: the buckets are laid out for channels_last, DDP says nothing."""
    check = ModelReport.from_dict(ddp_report[1]).ddp
    for view in (False, True):
        before = check.run(WrapOrder.BEFORE, view)
        assert before.count(B.MISMATCHED) == 0 and before.warning is None
        assert before.count(B.MATCHES) == 3


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((TOY, "--ddp"), "give --train too"),
        ((TOY, "--fsdp"), "give --train too"),
        ((TOY, "--ddp", "--train", "--fake"), "drop --fake"),
        (
            ("--torchvision", "resnet18", "--torchvision", "alexnet", "--train", "--ddp"),
            "one model",
        ),
    ],
)
def test_ddp_refuses_what_it_cannot_run_before_any_model_runs(args, said):
    result = invoke(*args)
    if "--fake" in args and BACKWARD_PROBLEM is not None:
        said = BACKWARD_PROBLEM  # this torch refuses --train --fake itself, first (torch 2.4)
    assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output


@pytest.fixture(scope="module")
def fsdp_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp") / "report.json"
    result = invoke(TOY, "--train", "--fsdp", "--no-verify", "--json", str(out))
    assert result.exit_code in (0, 1), result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema("report"))
    return result.output, ModelReport.from_dict(data).fsdp


def test_fsdp2_refuses_the_channels_last_weights_by_name(fsdp_report):
    """FSDP2 refuses a channels_last 3x3 weight ("non-contiguous parameters"), named by the
    pre-flight; the 1x1 weight, both orders at once, is contiguous and taken (the control)."""
    if TORCH_VERSION < (2, 6):
        pytest.skip(f"torch {torch.__version__}'s FSDP2 does not run on the CPU")
    output, check = fsdp_report
    fsdp2 = next(run for run in check.runs if run.api == "fsdp2")
    assert fsdp2.error is None
    assert fsdp2.refused == ("features.0.weight", "features.5.weight")
    assert "non-contiguous parameters" in fsdp2.message
    assert "FSDP2 (fully_shard): refuses 2 of 3" in output


def test_fsdp1_unflattens_parameters_in_the_order_of_its_release(fsdp_report):
    """FSDP1 flattens every parameter into one buffer. Unflattened, torch 2.4.1 hands each back
    as a ``view`` of it, NCHW (the 1x1 weight, both orders at once, is the control); 2.14.1 and
    2.15.0 keep the strides each parameter was given (pytorch PR #137382), with and without
    use_orig_params (measured on these three; the releases between are not)."""
    _, check = fsdp_report
    fsdp1 = [run for run in check.runs if run.api == "fsdp1"]
    assert {run.use_orig_params for run in fsdp1} == {False, True}
    for run in fsdp1:
        assert run.error is None and len(run.parameters) == 3
        kept = {p.name: p.kept for p in run.parameters}
        assert kept["features.3.weight"] is True
        if TORCH_VERSION <= (2, 4):
            assert kept["features.0.weight"] is False and kept["features.5.weight"] is False
            first = next(p for p in run.parameters if p.name == "features.0.weight")
            assert first.unflattened == (27, 9, 3, 1)
        else:
            assert all(p.unflattened == p.strides for p in run.parameters)
