"""The real CLI, in process through CliRunner and as real subprocesses, with every exit code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
from torch_checks import needs_fake_cuda
from typer.testing import CliRunner

from cl_audit.cli import app
from cl_audit.report import load_schema

TOYS = str(Path(__file__).with_name("toy_models.py"))
runner = CliRunner()
ANY_COST = ("--fail-share", "0", "--fail-bytes", "0")  # the toy models' costs are a few KiB


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "120"}, catch_exceptions=False)


def test_clean_torchvision_model_exits_0():
    result = invoke("resnet18", "--input-size", "3x64x64")
    assert result.exit_code == 0, result.output
    assert "cl-audit: clean" in result.output and "channels_last adds 0 B" in result.output
    assert "2x3x64x64" in result.output


def test_offending_user_model_exits_1_with_table_and_json(tmp_path):
    out = tmp_path / "r.json"
    result = invoke(f"{TOYS}:channel_shuffle", "--json", str(out), *ANY_COST)
    assert result.exit_code == 1, result.output
    assert "Tensor.contiguous" in result.output and "torch.conv2d" in result.output
    assert "toy_models.py:" in result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema())
    assert data["offenders"][0]["python_op"] == "Tensor.contiguous"
    assert data["input_shape"] == [2, 3, 16, 16]


def test_json_to_stdout_is_pure_json():
    result = invoke(f"{TOYS}:clean_net", "--json", "-", "--engine", "patch")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["environment"]["engine"] == "patch" and data["offenders"] == []


def test_batch_size_and_input_size_options():
    result = invoke(
        f"{TOYS}:clean_net", "--batch-size", "3", "--input-size", "3x8x8", "--json", "-"
    )
    assert json.loads(result.stdout)["input_shape"] == [3, 3, 8, 8]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["resnet5"], "did you mean: resnet50"),
        (["resnet18", "--input-size", "224"], "expected CxHxW"),
        (["resnet18", "--input-size", "3x0x5"], "each size is at least 1, not 0"),
        ([], "no model selected"),
        (["resnet18", "--confirm"], "use it with --fake"),
        (["resnet18", "resnet34", "--shard", "3/2"], "expected K/N"),
        (["resnet18", "resnet34", "--max-memory", "lots"], "expected a size"),
        (["--timm", "nonexistent*"], "matches no timm model"),
        ([f"{TOYS}:nope"], "has no callable 'nope'"),
        ([f"{TOYS}:not_a_module"], "expected an nn.Module"),
        (["no_such_pkg.models:build"], "no module named 'no_such_pkg'"),
        (["missing/file.py:build"], "no such file"),
        (["resnet18", "--device", "cuda:0"], "CUDA is not available"),
        (["resnet18", "--device", "banana"], "not a torch device"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("spec", "stage"),
    [
        (f"{TOYS}:broken", r"forward failed at toy_models\.py:\d+: RuntimeError: this model"),
        (f"{TOYS}:failing_factory", r"build failed at toy_models\.py:\d+: ValueError"),
    ],
)
def test_model_failures_exit_3_naming_stage_line_and_cause(spec, stage):
    result = invoke(spec)
    assert result.exit_code == 3
    assert re.search(stage, result.output) and "Traceback" not in result.output


def test_typer_usage_error_exits_2():
    assert invoke("resnet18", "--dtype", "float64").exit_code == 2


def test_help_documents_exit_codes():
    result = invoke("--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # as wrapped at any width
    assert "Exit codes" in text and "3 the model failed" in text


def run_cli(
    *args: str, module: bool = False, python_path: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = (
        [sys.executable, "-m", "cl_audit"]
        if module
        else [str(Path(sys.executable).with_name("cl-audit"))]
    )
    env = {**os.environ, "COLUMNS": "120"}
    if python_path is not None:
        env["PYTHONPATH"] = python_path
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def test_console_script_subprocess_exit_codes():
    assert run_cli(f"{TOYS}:clean_net").returncode == 0
    minor = run_cli(f"{TOYS}:channel_shuffle")  # 16 KiB: under the default 1 MiB gate
    assert minor.returncode == 0 and "cl-audit: minor" in minor.stdout
    offending = run_cli(f"{TOYS}:channel_shuffle", *ANY_COST)
    assert offending.returncode == 1 and "Tensor.contiguous" in offending.stdout
    unknown = run_cli("resnet5")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert "did you mean" in unknown.stderr
    broken = run_cli(f"{TOYS}:broken")
    assert broken.returncode == 3 and "Traceback" not in broken.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["resnet18", "--batch-size", "0"], "Invalid value for '--batch-size'"),
        (["resnet18", "--fail-sharee", "1"], "--fail-share"),  # the option meant, suggested
        (["resnet18", "--input-size", "3x0x5"], "not 0"),  # the control: the domain's own
    ],
)
def test_what_click_refuses_is_one_line_exit_2_from_the_console_script(args, said):
    """Issue #67: ``--batch-size 0`` printed click's four-line usage block."""
    result = run_cli(*args)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and said in line


def test_a_torchvision_that_cannot_load_beside_this_torch_is_one_line_exit_2(tmp_path):
    # what a torchvision built for another torch raises on import
    broken = tmp_path / "torchvision"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n'
    )
    result = run_cli("resnet18", python_path=str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"error: torchvision cannot be imported beside torch {torch.__version__} (RuntimeError: "
        "operator torchvision::nms does not exist); install the torchvision release built for "
        "this torch"
    )
    assert run_cli(f"{TOYS}:clean_net", python_path=str(tmp_path)).returncode == 0  # no import


def test_python_dash_m_runs_a_torchvision_model_without_importing_timm():
    probe = (
        "import sys, runpy; sys.argv=['cl-audit','squeezenet1_0','--input-size','3x64x64'];"
        "import cl_audit.cli as c\n"
        "try:\n    c.main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print('TIMM_IMPORTED' if 'timm' in sys.modules else 'NO_TIMM', code)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False
    )
    assert "NO_TIMM 0" in result.stdout, result.stdout + result.stderr
    module_run = run_cli("squeezenet1_0", "--input-size", "3x64x64", module=True)
    assert module_run.returncode == 0, module_run.stderr


def test_timm_model_through_cli():
    result = invoke("--timm", "resnet10t", "--input-size", "3x64x64", "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"] == "resnet10t" and data["environment"]["timm"]


def test_dict_and_tuple_outputs_are_fine():
    result = invoke(f"{TOYS}:dict_output", "--json", "-", *ANY_COST)
    assert result.exit_code == 1  # the softmax over channels
    assert json.loads(result.stdout)["offenders"][0]["python_op"] == "F.softmax"


@pytest.mark.parametrize(
    ("args", "dtype", "autocast"),
    [
        (["--dtype", "bfloat16"], "bfloat16", None),
        (["--amp", "bf16"], "float32", "cpu:bfloat16"),
    ],
)
def test_dtype_and_autocast_options_reach_the_report(args, dtype, autocast):
    result = invoke(f"{TOYS}:clean_net", "--json", "-", *args)
    assert result.exit_code == 0, result.output
    env = json.loads(result.stdout)["environment"]
    assert (env["dtype"], env["autocast"]) == (dtype, autocast)


def test_interrupt_exits_130_without_traceback():
    interrupted = run_cli(f"{TOYS}:interrupting")
    assert interrupted.returncode == 130
    assert "interrupted" in interrupted.stderr and "Traceback" not in interrupted.stderr


# --- defects found by a new user ------------------------------------------------------------


def test_an_unwritable_json_path_is_refused_before_the_model_is_built(tmp_path):
    # failing_factory would exit 3 at its build: exit 2 proves the path was checked first
    result = invoke(f"{TOYS}:failing_factory", "--json", str(tmp_path / "missing" / "r.json"))
    assert result.exit_code == 2, result.output
    assert "no such directory" in result.output and "Traceback" not in result.output
    sweep = invoke(f"{TOYS}:clean_net", "resnet18", "--junit", str(tmp_path))
    assert sweep.exit_code == 2 and "is a directory" in sweep.output


def test_a_model_file_can_import_its_sibling_modules(tmp_path):
    (tmp_path / "blocks.py").write_text(
        "import torch\n\ndef block():\n    return torch.nn.Conv2d(3, 4, 3)\n"
    )
    (tmp_path / "net.py").write_text(
        "import blocks\n\ndef build():\n    return blocks.block(), (3, 16, 16)\n"
    )
    result = run_cli(f"{tmp_path / 'net.py'}:build")
    assert result.returncode == 0, result.stderr
    assert "cl-audit: clean" in result.stdout


def test_a_batched_factory_shape_gets_a_one_line_hint():
    result = invoke(f"{TOYS}:batched_shape")
    assert result.exit_code == 3
    assert "hint: the factory's input_shape (2, 3, 16, 16) is per sample" in result.output
    assert "Traceback" not in result.output


def test_a_failure_unrelated_to_the_input_gets_no_shape_hint():
    result = invoke(f"{TOYS}:batched_shape_missing_import")
    assert result.exit_code == 3
    assert "ModuleNotFoundError" in result.output and "hint" not in result.output


def test_sweep_only_options_are_reported_for_one_model():
    result = invoke(f"{TOYS}:clean_net", "--timeout", "5", "--max-memory", "1GB")
    assert result.exit_code == 0
    assert "note: --timeout, --max-memory apply to sweeps" in result.output


def test_a_sweep_in_which_every_model_was_skipped_does_not_exit_0(tmp_path):
    examples = str(Path(__file__).with_name("example_models.py"))
    factories = (f"{examples}:keywords", f"{examples}:positional")  # their own inputs
    result = run_cli(*factories, "--batch-size", "4", "--json", str(tmp_path / "s.json"))
    assert result.returncode == 2, result.stderr
    assert "no model was audited: all 2 were skipped" in result.stderr
    assert json.loads((tmp_path / "s.json").read_text())["summary"]["skipped"] == 2


@needs_fake_cuda
def test_fake_cuda_with_amp_reports_what_ran():
    result = invoke(
        f"{TOYS}:clean_net", "--fake", "--device", "cuda", "--amp", "fp16", "--json", "-"
    )
    assert result.exit_code == 0, result.output
    env = json.loads(result.stdout)["environment"]
    assert (env["device"], env["autocast"], env["mode"]) == ("cuda", "cuda:float16", "fake")
    assert "Disabling autocast" not in result.output


def test_help_lists_every_command_and_a_model_still_runs_without_one():
    listed = invoke("--help").output
    assert all(command in listed for command in ("audit", "merge", "render"))
    assert "--timm" in invoke("audit", "--help").output
    assert invoke(f"{TOYS}:clean_net").exit_code == 0  # no command word needed


def test_render_writes_html_of_saved_reports_of_either_version(tmp_path):
    data = Path(__file__).with_name("data")
    for name in ("sweep-v1.json", "report-v1.json"):
        page = tmp_path / f"{name}.html"
        result = invoke("render", str(data / name), "--html", str(page))
        assert result.exit_code == 0, result.output
        assert page.read_text().startswith("<!DOCTYPE html>")
    assert "cait_xxs24_224" in (tmp_path / "sweep-v1.json.html").read_text()
    missing = invoke("render", str(tmp_path / "nope.json"), "--html", str(tmp_path / "x.html"))
    assert missing.exit_code == 2 and "No such file" in missing.output


def test_html_of_a_sweep_and_of_one_model_from_the_cli(tmp_path):
    sweep = run_cli(
        f"{TOYS}:clean_net",
        f"{TOYS}:channel_shuffle",
        "--html",
        str(tmp_path / "s.html"),
        *ANY_COST,
    )
    assert sweep.returncode == 1, sweep.stderr
    page = (tmp_path / "s.html").read_text()
    assert "channel_shuffle" in page and 'id="heatmap"' in page
    single = invoke(f"{TOYS}:channel_shuffle", "--html", str(tmp_path / "m.html"), *ANY_COST)
    assert single.exit_code == 1
    assert 'id="timeline"' in (tmp_path / "m.html").read_text()  # recorded because of --html


def test_compile_exits_2_naming_what_this_torch_lacks_or_runs():
    """Where this torch lacks what --compile uses or its probe fails (torch 2.4), --compile is
    refused with the reason."""
    from cl_audit.compat.inductor import compile_problem

    result = run_cli(f"{TOYS}:clean_net", "--compile")
    if compile_problem() is None:
        assert result.returncode == 0 and "torch.compile" in result.stdout
    else:
        assert result.returncode == 2 and "--compile" in result.stderr
        assert compile_problem() in result.stderr and "Traceback" not in result.stderr


@needs_fake_cuda
@pytest.mark.parametrize(("model", "amp"), [("resnet18", ("--amp", "fp16")), ("mobilenet_v2", ())])
def test_cuda_training_is_predicted_without_a_gpu(model, amp):
    """The issue's two commands: a CUDA verdict with its sites, from a step on fake CUDA
    tensors whose backward runs node by node, on a machine without a GPU."""
    result = run_cli(
        model, "--train", "--fake", "--device", "cuda", *amp, "--input-size", "3x64x64",
        "--json", "-",
    )  # fmt: skip
    data = json.loads(result.stdout)
    verdict = data["summary"]["verdict"]
    assert verdict in ("clean", "minor", "offending")
    assert result.returncode == (1 if verdict == "offending" else 0), result.stderr  # its exit
    env = data["environment"]
    assert (env["mode"], env["device"], env["train"]) == ("fake-step", "cuda", True)
    assert env["autocast"] == ("cuda:float16" if amp else None)
    assert data["cost"]["bytes_written"] > 0
    phases = {site["phase"] for site in data["cost"]["sites"]}
    assert phases <= {"forward", "backward", "optimizer"}


def test_what_a_model_prints_goes_to_stderr_and_json_to_stdout_stays_pure(tmp_path):
    """A library announcing itself on stdout (Ultralytics' first run does) while the model is
    built and audited must not spoil ``--json -``."""
    factory = tmp_path / "chatty.py"
    factory.write_text(
        "import torch\n\n"
        "def chatty():\n"
        "    print('Creating new settings file')\n"
        "    return torch.nn.Conv2d(3, 4, 3), (3, 8, 8)\n"
    )
    result = run_cli(f"{factory}:chatty", "--json", "-")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"].endswith("chatty.py:chatty")
    assert "Creating new settings file" in result.stderr
