"""Every path a run will write is checked before any model is built: a bad one is one line and
exit 2, never a traceback, with no model run and no folder made that the user did not ask for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cl_audit.cli import app

FACTORIES = """
import pathlib
import torch

RAN = pathlib.Path(__file__).with_suffix(".ran")


def first():
    RAN.write_text("a model was built")
    return torch.nn.Conv2d(3, 4, 3), (3, 8, 8)


def second():
    RAN.write_text("a model was built")
    return torch.nn.Conv2d(3, 4, 3), (3, 8, 8)
"""

# Where a write cannot go, as the issue found them: a file used as a folder, a folder that does
# not exist, a place nobody may write (root included: /sys), a device that is always full.
PROBLEMS = {
    "file-as-folder": lambda tmp, name: tmp / "a-file" / name,
    "missing-parent": lambda tmp, name: tmp / "missing" / name,
    "unwritable": lambda tmp, name: Path("/sys") / name,
    "dev-full": lambda tmp, name: Path("/dev/full"),
}
SINGLE = ("--json", "--html")
SWEEP = ("--json", "--html", "--junit", "--checkpoint", "--cache")


def _cases() -> list[tuple[str, str, str]]:
    cases = [(p, o, "single") for p in PROBLEMS for o in SINGLE]
    # --cache DIR is a folder the user asks for: its missing parents are made (tested below).
    cases += [
        (p, o, "sweep") for p in PROBLEMS for o in SWEEP if (p, o) != ("missing-parent", "--cache")
    ]
    return cases


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, list[str]]:
    source = tmp_path / "factories.py"
    source.write_text(FACTORIES)
    (tmp_path / "a-file").write_text("not a folder")
    return source.with_suffix(".ran"), [f"{source}:first", f"{source}:second"]


@pytest.mark.parametrize(("problem", "option", "run"), _cases())
def test_a_path_that_cannot_be_written_is_refused_before_any_model_runs(
    tmp_path: Path, models: tuple[Path, list[str]], problem: str, option: str, run: str
) -> None:
    ran, specs = models
    target = PROBLEMS[problem](tmp_path, "out" if option == "--cache" else "out.txt")
    args = specs[:1] if run == "single" else specs
    result = CliRunner().invoke(app, [*args, option, str(target)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, Exception)
    assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1
    assert option in result.output and str(target) in result.output
    assert not ran.exists(), "a model was built before the path was checked"
    assert not (tmp_path / "missing").exists(), "a folder nobody asked for was made"


def test_the_default_checkpoint_follows_an_unwritable_json_path(tmp_path, models):
    ran, specs = models
    json_path = tmp_path / "missing" / "sweep.json"
    result = CliRunner().invoke(app, [*specs, "--json", str(json_path)])
    assert result.exit_code == 2 and "no such directory" in result.output
    assert not ran.exists() and not (tmp_path / "missing").exists()


def test_a_cache_folder_asked_for_is_made_with_its_parents(tmp_path, models):
    ran, specs = models
    cache = tmp_path / "nested" / "cache"
    result = CliRunner().invoke(
        app, [*specs, "--cache", str(cache), "--json", str(tmp_path / "s.json")]
    )
    assert result.exit_code == 0, result.output
    assert ran.exists() and (cache / "v1").is_dir()


def test_the_real_command_refuses_dev_full_in_one_line(tmp_path, models):
    ran, specs = models
    result = subprocess.run(
        [sys.executable, "-m", "cl_audit", *specs, "--junit", "/dev/full"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --junit /dev/full: not writable (No space left on device)"
    ]
    assert not ran.exists()
