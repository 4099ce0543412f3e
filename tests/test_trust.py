"""Outputs a CI can trust: every file written whole or not at all, a failed run leaving a report
that says so (never an earlier run's verdict), stdout holding the one document asked for, a
stream that refuses it one line and exit 2, SIGTERM handled as Ctrl-C is, and documents read
back refused where their schema refuses them. Real subprocesses where the shell is involved."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import torch

from cl_audit import audit_model
from cl_audit.errors import UsageError
from cl_audit.render.outputs import write_outputs
from cl_audit.report import REPORT_VERSION, ModelReport, files, load_schema

TOYS = str(Path(__file__).with_name("toy_models.py"))
SPEED = str(Path(__file__).with_name("speed_models.py"))
OLD = '{"format": "cl-audit.report", "old": true}\n'


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cl_audit", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **kwargs,
    )


def _report() -> ModelReport:
    return audit_model(torch.nn.Conv2d(3, 4, 3), torch.randn(2, 3, 8, 8), verify=False)


@pytest.mark.parametrize("kind", ["json", "html", "json.gz"])
def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary_file(
    tmp_path, monkeypatch, kind
):
    """The disk fills as the new file is synced: the old file is as it was, nothing else is
    left in its folder; the control, the same write without the fault, replaces it."""
    target = tmp_path / f"report.{kind}"
    target.write_text(OLD)
    old = target.read_bytes()
    report = _report()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    option = {"json": "json_path", "json.gz": "json_path", "html": "html"}[kind]
    with pytest.raises(UsageError, match="No space left on device"):
        write_outputs(report, **{option: target})
    assert target.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    monkeypatch.undo()
    write_outputs(report, **{option: target})
    assert target.read_bytes() != old


def test_every_writer_goes_through_the_one_atomic_write(tmp_path, monkeypatch):
    """Merge's output goes through the atomic write (as the cache's entries and the pytest
    plugin's baseline do: ``write_text``), the fault above covering it."""
    seen = []
    real = files._replace

    def recorded(path, data, option):
        seen.append(option)
        return real(path, data, option)

    monkeypatch.setattr(files, "_replace", recorded)
    from literal_reports import row, sweep
    from rich.console import Console

    from cl_audit.cli.merge_command import merge_reports

    one, out = tmp_path / "one.json", tmp_path / "merged.json"
    files.write_json(one, sweep(row("a")), "--json")
    merge_reports(
        [one], out, force=False, baseline=None, console=Console(file=open(os.devnull, "w"))
    )
    assert seen == ["--json", "--output"]


def test_a_full_disk_under_a_real_run_keeps_the_previous_report(tmp_path):
    """The process may write no file past a few kilobytes (``ulimit -f``, as a full disk):
    the audit's JSON fails, exit 2 in one line, and the previous report is whole."""
    target = tmp_path / "report.json"
    previous = _report().to_json()
    target.write_text(previous)
    script = (
        f"trap '' XFSZ; ulimit -f 2; exec {sys.executable} -m cl_audit {TOYS}:clean_net "
        f"--no-verify --json {target}"
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "--json" in done.stderr
    assert target.read_text() == previous


def test_a_failed_run_replaces_an_earlier_verdict_with_its_failure(tmp_path):
    """A model that fails to build leaves, where its JSON and HTML were asked for, a report
    that says so (valid under the schema), exit 3; the control: a run that works writes a
    report with a verdict there."""
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    out.write_text(_report().to_json())
    done = _cli(f"{TOYS}:broken", "--json", str(out), "--html", str(html))
    assert done.returncode == 3, done.stderr
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema())
    assert data["status"] == "error" and data["stage"] == "forward" and "summary" not in data
    assert "failed" in html.read_text()
    with pytest.raises(Exception, match="a failed run's report"):
        ModelReport.from_dict(data)
    rendered = _cli("render", str(out), "--html", str(tmp_path / "again.html"))
    assert rendered.returncode == 2 and "failed run" in rendered.stderr
    works = _cli(f"{TOYS}:clean_net", "--no-verify", "--json", str(out))
    assert works.returncode == 0 and json.loads(out.read_text())["summary"]["verdict"] == "clean"


def test_a_full_standard_output_is_one_line_and_exit_2():
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "cl_audit", TOYS + ":clean_net", "--no-verify", "--json", "-"],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "standard output refused it (No space left on device)" in done.stderr


@pytest.mark.parametrize("flag", ["--json", "--html"])
def test_dash_sends_only_that_document_to_stdout(flag):
    done = _cli(TOYS + ":clean_net", "--no-verify", flag, "-")
    assert done.returncode == 0, done.stderr
    out = done.stdout.lstrip()
    assert out.startswith("{" if flag == "--json" else "<!DOCTYPE html>")
    assert "cl-audit: clean" not in done.stdout and "cl-audit: clean" in done.stderr


def test_junit_dash_holds_the_xml_alone(tmp_path):
    done = _cli(TOYS + ":clean_net", f"{SPEED}:steady", "--jobs", "1", "--junit", "-")
    assert done.returncode == 0, done.stderr
    assert done.stdout.lstrip().startswith("<?xml") and "cl-audit sweep" in done.stderr


def test_sigterm_ends_a_sweep_as_ctrl_c_does_keeping_the_partial_report(tmp_path):
    """SIGTERM while the second model sleeps (a sweep runs them in key order): exit 143, the
    first model's row in the partial JSON, and --resume's hint; the control: SIGINT, 130."""
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        out = tmp_path / f"sweep-{code}.json"
        faults = str(Path(__file__).with_name("fault_models.py"))
        process = subprocess.Popen(
            [sys.executable, "-m", "cl_audit", f"{faults}:says_collecting", f"{faults}:sleeps",
             "--jobs", "1", "--json", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "CL_AUDIT_TEST_SLEEP": "30"},
            # a child of a shell's background job starts with SIGINT ignored: Ctrl-C's default
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        deadline = time.monotonic() + 120
        checkpoint = Path(f"{out}.jsonl")
        while time.monotonic() < deadline and not (
            checkpoint.exists() and 'says_collecting"' in checkpoint.read_text()
        ):
            time.sleep(0.2)
        time.sleep(0.5)
        process.send_signal(sig)
        _, err = process.communicate(timeout=120)
        assert process.returncode == code, err
        rows = json.loads(out.read_text())["models"]
        assert [r["name"].rsplit(":", 1)[-1] for r in rows] == ["says_collecting"]
        assert "--resume" in err


def test_a_sweep_ends_without_the_bindings_leak_report_at_exit():
    """A sweep freezes the parent's objects out of its workers' collections; unfrozen at the
    end, or nanobind (triton's bindings, loaded by torchvision's import of torch._dynamo where
    triton is installed) prints ~30 lines of "leaked" objects at exit. The control: the sweep
    ran both models."""
    result = _cli("--timm", "resnet10t", f"{TOYS}:clean_net", "--fake", "--input-size",
                  "3x32x32", "--jobs", "2")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "resnet10t" in result.stdout and "clean_net" in result.stdout
    assert "leaked" not in result.stderr and "nanobind" not in result.stderr


def test_documents_read_back_are_refused_where_their_schema_refuses_them(tmp_path):
    """A report whose counts are negative renders nothing: one line, exit 2; the control,
    the same report as written, renders."""
    good = json.loads(_report().to_json())
    path = tmp_path / "good.json"
    path.write_text(json.dumps(good))
    assert _cli("render", str(path), "--html", str(tmp_path / "good.html")).returncode == 0
    bad = dict(good, summary=dict(good["summary"], losses=-1))
    path.write_text(json.dumps(bad))
    done = _cli("render", str(path), "--html", str(tmp_path / "bad.html"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"not a valid report of version {REPORT_VERSION}: summary/losses" in done.stderr
    assert not (tmp_path / "bad.html").exists()


def test_a_package_in_the_working_folder_is_named_with_the_way_to_import_it(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "models.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Conv2d(3, 4, 3), (3, 8, 8)\n"
    )
    console = str(Path(sys.executable).with_name("cl-audit"))
    done = subprocess.run([console, "mypkg.models:build"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "cl-audit does not import from" in done.stderr and "mypkg/models.py:build" in done.stderr
    elsewhere = subprocess.run([console, "nopkg.models:build"], capture_output=True, text=True,
                               cwd=tmp_path, timeout=300, check=False)  # fmt: skip
    assert "no module named 'nopkg'" in elsewhere.stderr
    assert "working folder" not in elsewhere.stderr  # the control: nothing there to name


def test_a_training_output_without_a_float_tensor_fails_at_the_loss_not_the_forward():
    class Indices(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x).argmax(1)

    from cl_audit.errors import ModelFailedError

    with pytest.raises(ModelFailedError, match="loss failed"):
        audit_model(Indices(), torch.randn(2, 3, 8, 8), train=True)
