"""Example inputs: a factory or the Python API gives the model's own arguments (a tensor, a
tuple, a dict of keyword arguments); 4D/5D floating-point tensors are converted, the rest is
passed as given, and every path (CLI, API, fake, training, the NCHW comparison, bench,
sweeps) takes them."""

from __future__ import annotations

import json
from pathlib import Path

import example_models as em
import pytest
import torch
from typer.testing import CliRunner

import cl_audit
from cl_audit.cli import app
from cl_audit.execution.convert import input_to_channels_last, input_to_nchw
from cl_audit.execution.inputs import Example
from cl_audit.report import DifferentialStatus

MODELS = Path(__file__).with_name("example_models.py")


def invoke(*args: str):
    """The CLI, with any channels_last-only cost offending (these models' costs are KiB)."""
    gate = ["--fail-share", "0", "--fail-bytes", "0"] if args[0] != "bench" else []
    return CliRunner().invoke(app, [*args, *gate], env={"COLUMNS": "160"})


def flatten_offender(report) -> None:
    (offender,) = report.offenders
    assert (offender.python_op, offender.aten_op) == ("torch.flatten", "aten.clone")


def test_keyword_example_through_the_api_converts_images_and_passes_the_rest():
    report = cl_audit.audit_model(em.Conditioned(), em.example())
    flatten_offender(report)
    assert report.input_shape == (3, 3, 8, 8)  # the example's own batch
    assert report.differential.status is DifferentialStatus.RAN  # the NCHW run took it too


@pytest.mark.parametrize("factory", ["keywords", "positional"])
def test_factory_examples_are_audited_as_given_by_the_cli(factory):
    result = invoke(f"{MODELS}:{factory}", "--json", "-")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["input_shape"] == [3, 3, 8, 8]
    assert [f["python_op"] for f in data["offenders"]] == ["torch.flatten"]


def test_a_lone_tensor_example_is_the_input():
    result = invoke(f"{MODELS}:tensor_only", "--json", "-")
    assert result.exit_code == 1 and json.loads(result.stdout)["input_shape"] == [3, 3, 8, 8]


def test_fake_mode_takes_an_example_as_fake_tensors_of_its_strides():
    result = invoke(f"{MODELS}:keywords", "--fake", "--json", "-")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["environment"]["mode"] == "fake"
    assert [f["python_op"] for f in data["offenders"]] == ["torch.flatten"]


def test_training_on_an_example_takes_the_loss_of_a_dataclass_output():
    report = cl_audit.audit_model(em.Conditioned(), em.example(), train=True)
    assert report.environment.train and report.offenders
    own = invoke(f"{MODELS}:with_loss", "--train", "--json", "-")
    assert own.exit_code == 1, own.output
    assert json.loads(own.stdout)["environment"]["train"] is True


@pytest.mark.parametrize("option", [["--batch-size", "4"], ["--input-size", "3x16x16"]])
def test_batch_and_size_options_are_refused_with_an_example(option):
    result = invoke(f"{MODELS}:keywords", *option)
    assert result.exit_code == 2
    assert "gives an example input, whose batch and sizes are its own" in result.output


def test_a_factory_returning_something_else_is_a_usage_error():
    result = invoke(f"{MODELS}:not_an_example")
    assert result.exit_code == 2 and "an example input is a tensor" in result.output


def test_bench_takes_an_example():
    result = invoke("bench", f"{MODELS}:keywords", "--rounds", "1", "--warmup", "0", "--steps", "1")
    assert result.exit_code == 0, result.output
    assert "channels-last" in result.output


def test_a_sweep_row_audits_the_example(tmp_path):
    out = tmp_path / "s.json"
    result = invoke(f"{MODELS}:keywords", f"{MODELS}:tensor_only", "--json", str(out))
    assert result.exit_code == 1, result.output
    rows = {r["name"].rsplit(":", 1)[1]: r for r in json.loads(out.read_text())["models"]}
    assert rows["keywords"]["input_shape"] == [3, 3, 8, 8]
    assert rows["keywords"]["status"] == "ok" and rows["tensor_only"]["status"] == "ok"


def test_time_takes_an_example():
    report = cl_audit.audit_model(em.Conditioned(), em.example(), time=True)
    assert report.timing is not None and report.timing.step_ms > 0
    (offender,) = report.offenders
    assert offender.time_ms is not None


def test_a_list_of_images_converts_as_the_batch_it_stacks_to():
    """Detection models take lists of 3-D images: channels_last lays each image out as a slice
    of a channels_last batch; NCHW makes each contiguous; targets pass as given."""
    images = [torch.randn(3, 8, 10), torch.randn(3, 8, 10)]
    target = {"boxes": torch.rand(1, 4), "masks": torch.zeros(1, 8, 10, dtype=torch.uint8)}
    example = Example((images, [target, target]))
    converted = example.map(input_to_channels_last)
    (laid_out, targets) = converted.args
    batch = torch.stack(images).contiguous(memory_format=torch.channels_last)
    assert [t.stride() for t in laid_out] == [batch[0].stride()] * 2 == [(1, 30, 3)] * 2
    assert all(torch.equal(a, b) for a, b in zip(laid_out, images, strict=True))
    assert targets[0]["boxes"] is target["boxes"] and targets[0]["masks"] is target["masks"]
    back = converted.map(input_to_nchw).args[0]
    assert all(t.is_contiguous() for t in back)
    assert example.first.shape == (2, 3, 8, 10)  # the report's input, its batch first


def test_a_list_of_tensors_of_other_shapes_is_converted_item_by_item():
    """The control: tokens of two lengths are no batch of images; 3-D stays as given."""
    tokens = [torch.randn(4, 8, 10), torch.randn(4, 6, 10)]
    laid_out = Example((tokens,)).map(input_to_channels_last).args[0]
    assert [t is u for t, u in zip(laid_out, tokens, strict=True)] == [True, True]
