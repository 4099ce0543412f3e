"""``cl-audit table`` end to end, through the real CLI in subprocesses: a table measured within a
budget (the model it was made for measured first), refused where it exists, added to with
``--resume``, kept whole through Ctrl-C, listed, and then the one the next audit predicts with,
named as this machine's; another thread count is another machine's. Only the table's shape and
labels are asserted, never a time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from test_sweep import cl_audit

from cl_audit.report import load_schema

MODELS = str(Path(__file__).with_name("speed_models.py"))
SMALL = ("--input-size", "3x32x32")


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script with ``folder`` as the user's table folder."""
    return cl_audit(*args, cwd=folder, env={"CL_AUDIT_TABLES": str(folder)})


def _flat(text: str) -> str:
    """The terminal's words without its box and line breaks."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def _tables(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


def test_a_table_is_measured_refused_resumed_and_then_predicts_as_this_machines(tmp_path):
    made = _cli(tmp_path, "table", "--budget", "0.15", "--for", f"{MODELS}:steady", *SMALL)
    assert made.returncode == 0, made.stderr
    ((name, table),) = _tables(tmp_path).items()
    jsonschema.validate(table, load_schema("speed-table"))
    assert re.fullmatch(r"cpu-.+-\d+c\d+t_torch-[\d.]+_onednn-[\d.]+", name)
    assert table["models"] == [f"{MODELS}:steady"]
    sources = {c["source"] for c in table["convolutions"]}
    assert "model" in sources  # the model's own convolutions, measured first
    first = table["convolutions"][0]
    assert first["source"] == "model" and first["height"] == 32  # at the model's input
    assert table["host"]["forward"] > 0 and table["ops"]
    assert "table " + name in made.stdout and "wrote" in made.stderr

    again = _cli(tmp_path, "table", "--budget", "0.1")
    assert again.returncode == 2 and "exists" in again.stderr and "--resume" in again.stderr

    resumed = _cli(tmp_path, "table", "--budget", "0.1", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    grown = _tables(tmp_path)[name]
    assert len(grown["convolutions"]) > len(table["convolutions"])
    assert grown["convolutions"][: len(table["convolutions"])] == table["convolutions"]

    audit = _cli(tmp_path, f"{MODELS}:steady", *SMALL, "--no-verify", "--json", "-")
    report = json.loads(audit.stdout)
    assert report["speed"]["table"]["name"] == name
    assert report["speed"]["table"]["match"] == "this-machine"
    assert report["speed"]["table"]["source"].endswith(f"{name}.json")
    assert "predicted with this machine's table" in _flat(audit.stderr)

    listed = _cli(tmp_path, "table", "--list")
    assert listed.returncode == 0 and name in listed.stdout
    assert f"* {name}\n    picked here for float32: this machine's table" in listed.stdout
    assert "cuda-nvidia-h200" in listed.stdout  # the shipped ones beside it

    # another thread count: its own table, and each labels the other as another machine's
    one = _cli(tmp_path, "table", "--budget", "0.1", "--threads", "1")
    assert one.returncode == 0, one.stderr
    (single,) = [n for n in _tables(tmp_path) if n != name]
    assert "1t_torch" in single
    two = _cli(tmp_path, f"{MODELS}:steady", *SMALL, "--no-verify", "--table", single)
    said = _flat(two.stdout)
    if "1t_torch" not in name:  # this machine computes with more than one thread
        assert "another machine's table, chosen" in said
        assert re.search(r"threads \d+ here", said)


def test_ctrl_c_keeps_what_was_measured_whole(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "cl_audit", "table", "--budget", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CL_AUDIT_TABLES": str(tmp_path)},
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # the probes under way
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "interrupted: what was measured is kept" in out
    (table,) = _tables(tmp_path).values()  # whole: it reads and validates
    jsonschema.validate(table, load_schema("speed-table"))
    assert table["host"]["forward"] > 0 and not table["complete"]
    log = next(tmp_path.glob("*.jsonl")).read_text().splitlines()
    assert json.loads(log[0])["part"] == "header"
    resumed = subprocess.run(
        [sys.executable, "-m", "cl_audit", "table", "--budget", "0.1", "--resume"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "CL_AUDIT_TABLES": str(tmp_path)},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert sum(1 for ln in next(tmp_path.glob("*.jsonl")).read_text().splitlines()
               if '"part": "host"' in ln) == 1  # fmt: skip  # the host not measured again


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--device", "mps"), "cl-audit table measures cpu and cuda"),
        (("--device", "cuda"), "CUDA is not available"),
        (("--resume", "--force"), "give one"),
    ],
)
def test_what_cannot_take_effect_is_refused_in_one_line(tmp_path, args, says):
    if "cuda" in args:
        import torch

        if torch.cuda.device_count():
            pytest.skip("this machine has CUDA")
    refused = _cli(tmp_path, "table", *args)
    assert refused.returncode == 2 and says in refused.stderr
    assert "Traceback" not in refused.stderr and not list(tmp_path.iterdir())
