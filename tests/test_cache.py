"""The sweep cache (``--cache DIR``): a row is reused while the model's source files, the
settings and the versions are unchanged; real sweeps through the CLI, and the cache's own
guarantees (versioned, atomic, pruned) on literal rows."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from literal_reports import finding, row

import cl_audit
import cl_audit.sweep.cache as cache_module
from cl_audit.execution.settings import AuditSettings
from cl_audit.report import ModelSource, Status, SweepReport
from cl_audit.sources import ModelRef
from cl_audit.sweep.cache import SweepCache
from cl_audit.sweep.worker import SweepSettings

COMMON = """\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))
"""
NET_A = """\
from torch import nn

from common import Block


def build():
    return nn.Sequential(nn.Conv2d(3, 8, 3), Block(8)), (3, 32, 32)
"""
NET_B = """\
from torch import nn


class Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return self.conv(x).contiguous()  # NCHW out of channels_last in: a cost


def build():
    return Flat(), (3, 64, 64)
"""
BROKEN = """\
def build():
    raise RuntimeError("this factory is broken")
"""


def _sweep(folder: Path, *args: str, python_path: str | None = None) -> dict[str, Any]:
    """The real CLI in a subprocess, run in ``folder`` with ``--cache cache``; its JSON."""
    env = {**os.environ, "COLUMNS": "120"}
    if python_path is not None:
        env["PYTHONPATH"] = python_path
    command = [str(Path(sys.executable).with_name("cl-audit")), *args]
    command += ["--cache", "cache", "--json", "out.json"]
    result = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert result.returncode in (0, 1, 3), result.stderr
    data = json.loads((folder / "out.json").read_text())
    data["stderr"] = result.stderr
    return data


def _rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in report["models"]}


def _reran(report: dict[str, Any]) -> set[str]:
    return {name for name, r in _rows(report).items() if not r["cached"]}


def _without_cached(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows = _rows(report).items()
    return {name: {k: v for k, v in r.items() if k != "cached"} for name, r in rows}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name, text in (("common.py", COMMON), ("net_a.py", NET_A), ("net_b.py", NET_B)):
        (tmp_path / name).write_text(text)
    return tmp_path


MODELS = ("net_a.py:build", "net_b.py:build")


def test_unchanged_sweep_reruns_nothing_and_gives_identical_rows(project):
    first = _sweep(project, *MODELS)
    second = _sweep(project, *MODELS)
    assert _reran(first) == {"net_a.py:build", "net_b.py:build"}
    assert _reran(second) == set()
    assert second["summary"]["cached"] == 2 and first["summary"]["cached"] == 0
    assert _without_cached(second) == _without_cached(first)
    # a real finding kept (its copy offends at the gate's batch, 32)
    assert _rows(first)["net_b.py:build"]["summary"]["verdict"] == "offending"
    assert "2 of 2 models reused from the cache" in second["stderr"]
    SweepReport.from_dict({k: v for k, v in second.items() if k != "stderr"})  # reads back


def test_editing_a_file_reruns_only_the_models_whose_audit_ran_through_it(project):
    _sweep(project, *MODELS)
    with open(project / "common.py", "a") as f:
        f.write("# an edit\n")  # imported by net_a only
    assert _reran(_sweep(project, *MODELS)) == {"net_a.py:build"}
    with open(project / "net_b.py", "a") as f:
        f.write("# an edit\n")
    assert _reran(_sweep(project, *MODELS)) == {"net_b.py:build"}
    assert _reran(_sweep(project, *MODELS)) == set()


def test_the_python_api_reuses_rows_from_its_cache(project, monkeypatch):
    monkeypatch.chdir(project)
    specs = [f"{project / name}" for name in MODELS]
    first = cl_audit.audit_models(specs, cache=project / "api-cache", checkpoint="a.jsonl")
    second = cl_audit.audit_models(specs, cache=project / "api-cache", checkpoint="b.jsonl")
    assert [r.cached for r in first.models] == [False, False]
    assert [r.cached for r in second.models] == [True, True] and second.summary.cached == 2
    assert [replace(r, cached=False) for r in second.models] == list(first.models)


def test_changed_settings_rerun_every_model(project):
    _sweep(project, *MODELS)
    assert _reran(_sweep(project, *MODELS, "--fail-share", "60")) == set(MODELS)
    assert _reran(_sweep(project, *MODELS, "--jobs", "1")) == set()  # parallelism is no setting


def test_failed_rows_rerun_unless_cache_failures(project):
    (project / "broken.py").write_text(BROKEN)
    models = ("net_a.py:build", "broken.py:build")
    first = _sweep(project, *models)
    assert _rows(first)["broken.py:build"]["status"] == "error"
    assert _reran(_sweep(project, *models)) == {"broken.py:build"}
    _sweep(project, *models, "--cache-failures")
    kept = _sweep(project, *models, "--cache-failures")
    assert _reran(kept) == set() and _rows(kept)["broken.py:build"]["status"] == "error"


def test_timm_family_file_edit_reruns_only_that_family(tmp_path):
    """In a test environment with its own copy of timm: editing ghostnet.py re-runs the ghostnet
    model only."""
    import timm

    shutil.copytree(
        Path(timm.__file__).parent, tmp_path / "timm", ignore=shutil.ignore_patterns("__pycache__")
    )
    models = ("--timm", "ghostnet_050,lcnet_035", "--fake")
    first = _sweep(tmp_path, *models, python_path=str(tmp_path))
    assert _reran(first) == {"ghostnet_050", "lcnet_035"}
    entry = next((tmp_path / "cache").glob("v*/*/*.json"))
    assert any(name.startswith("./timm/") for name in json.loads(entry.read_text())["files"])
    with open(tmp_path / "timm" / "models" / "ghostnet.py", "a") as f:
        f.write("# an edit\n")
    assert _reran(_sweep(tmp_path, *models, python_path=str(tmp_path))) == {"ghostnet_050"}


SETTINGS = SweepSettings(audit=AuditSettings())
REF = ModelRef(ModelSource.TIMM, "toy")


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    path = tmp_path / "toy.py"
    path.write_text("# the toy model\n")
    return str(path)


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob("v*/*/*.json"))


def test_an_entry_of_another_version_or_setting_is_ignored(tmp_path, model_file, monkeypatch):
    cache = SweepCache(tmp_path / "c", SETTINGS)
    assert cache.store(row("toy", (finding(),)), {model_file})
    assert SweepCache(tmp_path / "c", SETTINGS).lookup(REF).cached
    train = replace(SETTINGS, audit=AuditSettings(train=True))
    assert SweepCache(tmp_path / "c", train).lookup(REF) is None
    # An entry that another cl-audit wrote where this one looks: same file, another key.
    path = _entries(tmp_path / "c")[0]
    entry = json.loads(path.read_text())
    entry["key"]["versions"]["cl_audit_source"] = "another"
    path.write_text(json.dumps(entry))
    assert SweepCache(tmp_path / "c", SETTINGS).lookup(REF) is None
    monkeypatch.setattr(cache_module, "CACHE_VERSION", 2)
    assert SweepCache(tmp_path / "c", SETTINGS).lookup(REF) is None  # looks under v2/


def test_a_half_written_or_foreign_entry_is_a_miss(tmp_path, model_file):
    cache = SweepCache(tmp_path / "c", SETTINGS)
    cache.store(row("toy"), {model_file})
    path = _entries(tmp_path / "c")[0]
    text = path.read_text()
    for broken in (text[: len(text) // 2], "[]", '{"format": "cl-audit-cache"}'):
        path.write_text(broken)
        assert SweepCache(tmp_path / "c", SETTINGS).lookup(REF) is None
    cache.store(row("toy"), {model_file})  # a miss is overwritten by the next store
    assert SweepCache(tmp_path / "c", SETTINGS).lookup(REF) is not None


def test_a_row_with_unknown_files_or_a_failure_is_not_stored(tmp_path, model_file):
    cache = SweepCache(tmp_path / "c", SETTINGS)
    assert not cache.store(row("toy"), set())  # its worker died before naming them
    failed = row("toy", status=Status.ERROR, message="boom")
    assert not cache.store(failed, {model_file})
    assert SweepCache(tmp_path / "c", SETTINGS, failures=True).store(failed, {model_file})
    assert SweepCache(tmp_path / "c", SETTINGS).lookup(REF) is None
    assert SweepCache(tmp_path / "c", SETTINGS, failures=True).lookup(REF) is not None


def _store_repeatedly(root: str, model_file: str, offenders: int) -> None:
    cache = SweepCache(Path(root), SETTINGS)
    for _ in range(150):
        cache.store(row("toy", tuple(finding() for _ in range(offenders))), {model_file})


def test_concurrent_writers_never_leave_a_misread_entry(tmp_path, model_file):
    """Shards sharing a cache write the same entry at once: a reader sees one whole row or
    none, never a mixture or an error."""
    context = multiprocessing.get_context("fork")
    writers = [
        context.Process(target=_store_repeatedly, args=(str(tmp_path / "c"), model_file, n))
        for n in (1, 40)
    ]
    for writer in writers:
        writer.start()
    seen = set()
    while any(w.is_alive() for w in writers):
        found = SweepCache(tmp_path / "c", SETTINGS).lookup(REF)
        if found is not None:
            seen.add(len(found.offenders))
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert seen <= {1, 40} and seen
    assert not list((tmp_path / "c").glob("v*/*/*.tmp"))


def test_prune_removes_least_recently_used_entries_past_the_cap(tmp_path, model_file):
    cache = SweepCache(tmp_path / "c", SETTINGS, max_mb=0.0)
    names = [f"toy{i}" for i in range(4)]
    for i, name in enumerate(names):
        cache.store(row(name), {model_file})
        entry = _entries(tmp_path / "c")
        os.utime(max(entry, key=lambda p: p.stat().st_mtime_ns), (1000 + i, 1000 + i))
    size = sum(p.stat().st_size for p in _entries(tmp_path / "c"))
    # Room for three entries; the oldest (toy0) was used just now, so toy1 goes.
    capped = SweepCache(tmp_path / "c", SETTINGS, max_mb=(size * 3 / 4 + 1) / 2**20)
    assert capped.lookup(ModelRef(ModelSource.TIMM, "toy0")) is not None
    stale = tmp_path / "c" / "v1" / "00" / ".x.tmp"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("{")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert capped.prune() == 1
    kept = {n for n in names if capped.lookup(ModelRef(ModelSource.TIMM, n)) is not None}
    assert kept == {"toy0", "toy2", "toy3"}
    assert not stale.exists()
