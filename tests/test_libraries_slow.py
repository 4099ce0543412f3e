"""Slow tier: models from popular libraries (``examples/libraries.py``, each with its own
example input) through the real CLI; each test skips, saying so, when its library is not
installed (``pip install -e '.[libraries]'``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LIBRARIES = Path(__file__).resolve().parents[1] / "examples" / "libraries.py"
CLI = str(Path(sys.executable).with_name("cl-audit"))

# factory: (the library it needs, the offending op, the library file that writes it)
CASES = {
    "hf_segformer": ("transformers", "Tensor.contiguous", "models/segformer/modeling_segformer.py"),
    "diffusers_unet": ("diffusers", "Tensor.contiguous", "models/transformers/transformer_2d.py"),
    "yolo11n": ("ultralytics", "Tensor.matmul", "ultralytics/nn/modules/block.py"),
}


def _exit_code(report: dict) -> int:
    """The exit code a report's verdict gives: 1 only for offending (the cost gate)."""
    return 1 if report["summary"]["verdict"] == "offending" else 0


@pytest.mark.slow
@pytest.mark.parametrize("factory", list(CASES))
def test_library_model_with_its_example_names_the_library_line_that_loses_the_format(
    factory, tmp_path
):
    library, op, source = CASES[factory]
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed (pip install -e '.[libraries]')")
    env = {**os.environ, "YOLO_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "COLUMNS": "160"}
    result = subprocess.run(
        [CLI, f"{LIBRARIES}:{factory}", "--json", "-"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, check=False,
    )  # fmt: skip
    data = json.loads(result.stdout)
    assert result.returncode == _exit_code(data), result.stderr
    offenders = data["offenders"]
    assert any(f["python_op"] == op and source in f["call_site"] for f in offenders), offenders


@pytest.mark.slow
@pytest.mark.parametrize(
    "options", [["--train"], ["--fake", "--device", "cuda", "--amp", "fp16"]], ids=["train", "fake"]
)
@pytest.mark.parametrize(
    ("factory", "library", "source"),
    [("unet", "diffusers", "diffusers/models/"), ("yolo", "ultralytics", "ultralytics/")],
)
def test_the_readme_examples_train_and_predict_cuda_naming_the_library_lines(
    factory, library, source, options, tmp_path
):
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed (pip install -e '.[libraries]')")
    from cl_audit.fake.cuda_probe import fake_cuda_problem

    if "--fake" in options and fake_cuda_problem() is not None:
        pytest.skip(f"fake CUDA is refused here: {fake_cuda_problem()}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "YOLO_OFFLINE": "1", "COLUMNS": "160"}
    spec = f"{LIBRARIES.with_name('from_libraries.py')}:{factory}"
    result = subprocess.run(
        [CLI, spec, *options, "--json", "-"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, check=False,
    )  # fmt: skip
    data = json.loads(result.stdout)
    assert result.returncode == _exit_code(data), result.stderr
    offenders = data["offenders"]
    assert any(source in (f["call_site"] or "") for f in offenders), offenders


@pytest.mark.slow
def test_kornias_disk_gets_its_instance_norms_remedy_verified_through_the_cli(tmp_path):
    """kornia's DISK U-Net normalises channels_last maps with instance norms, each a copy to
    NCHW and back (issue #59): the group-norm remedy is tried on the model and verified."""
    if importlib.util.find_spec("kornia") is None:
        pytest.skip("kornia is not installed (pip install -e '.[libraries]')")
    result = subprocess.run(
        [CLI, f"{LIBRARIES}:kornia_disk", "--json", "-"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600, check=False,
    )  # fmt: skip
    data = json.loads(result.stdout)
    assert result.returncode == _exit_code(data) == 1, result.stderr
    norms = [s for s in data["cost"]["sites"] if s["op"] == "F.instance_norm" and s["extra"]]
    assert norms and all("kornia/feature/disk/" in s["call_site"] for s in norms)
    assert {s["remedy"]["status"] for s in norms} == {"verified"}
    assert all("nn.GroupNorm(C, C)" in s["remedy"]["advice"] for s in norms)
