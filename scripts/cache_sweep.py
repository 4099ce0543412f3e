"""Measures the sweep cache (``--cache``) on a registry: a cold sweep, a re-sweep of the unchanged
set, and a re-sweep after each edit of one model file, in a test environment of its own.

The environment is a folder holding copies of cl-audit (this checkout's package) and of the
installed timm, first on ``PYTHONPATH``, so the edits touch neither the working tree nor the
installed timm, and editing this checkout while it runs cannot invalidate its cache. Each sweep
is the real CLI (``--fake --confirm``, the CI recipe's settings), timed as a whole process. Each
edit appends a comment line to a timm model file; the models expected to re-run are those whose
cache entries list that file, read before the edit.

    python scripts/cache_sweep.py --out reports/cache/timm_torch-2.14.1.json \
        --edit ghostnet.py --edit resnet.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import timm
import torch

import cl_audit

_CL_AUDIT = Path(sys.executable).with_name("cl-audit")


def _sweep(folder: Path, selection: list[str], name: str) -> dict[str, Any]:
    command = [str(_CL_AUDIT), *selection, "--fake", "--confirm", "--cache", "cache"]
    command += ["--json", f"{name}.json", "--checkpoint", f"{name}.jsonl"]
    env = {**os.environ, "PYTHONPATH": str(folder), "COLUMNS": "100"}
    start = time.perf_counter()
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode not in (0, 1, 3):
        raise SystemExit(f"{name}: exit {result.returncode}\n{result.stderr[-2000:]}")
    report = json.loads((folder / f"{name}.json").read_text())
    return {"seconds": round(seconds, 1), "report": report}


def _rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: {k: v for k, v in r.items() if k != "cached"} for r in report["models"]}


def _users_of(folder: Path, relative: str) -> set[str]:
    """Models whose cache entries list the file ``./timm/models/<relative>``."""
    wanted = f"./timm/models/{relative}"
    users = set()
    for entry in (folder / "cache").glob("v*/*/*.json"):
        data = json.loads(entry.read_text())
        if wanted in data["files"]:
            users.add(data["row"]["name"])
    return users


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timm", default="all", help="timm selection (default: all)")
    parser.add_argument("--edit", action="append", default=[], help="timm/models/ file to edit")
    parser.add_argument("--work", type=Path, default=Path("/tmp/cl-audit-cache-sweep"))
    parser.add_argument(
        "--cache-failures", action="store_true", help="reuse failed rows too (--cache-failures)"
    )
    args = parser.parse_args()
    folder = args.work
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(cl_audit.__file__).parent, folder / "cl_audit", ignore=ignore)
    shutil.copytree(Path(timm.__file__).parent, folder / "timm", ignore=ignore)
    selection = ["--timm", args.timm, *(["--cache-failures"] if args.cache_failures else [])]
    runs = []
    previous: dict[str, dict[str, Any]] = {}  # the rows of the run before

    def record(name: str, run: dict[str, Any], expected: set[str] | None) -> None:
        report = run["report"]
        rows = _rows(report)
        reran = sorted(r["name"] for r in report["models"] if not r["cached"])
        reused = [n for n in rows if n not in reran]
        runs.append(
            {
                "run": name,
                "seconds": run["seconds"],
                "models": report["summary"]["models"],
                "cached": report["summary"]["cached"],
                "audited": len(reran),
                "reran": reran if len(reran) <= 200 else f"{len(reran)} models",
                "expected_reran": None if expected is None else sorted(expected),
                "reran_as_expected": None if expected is None else set(reran) == expected,
                "reused_rows_identical": all(rows[n] == previous.get(n) for n in reused),
                "verdicts": {k: report["summary"][k] for k in ("offending", "minor", "clean")},
            }
        )
        print(json.dumps(runs[-1])[:400], flush=True)
        previous.clear()
        previous.update(rows)

    record("cold", _sweep(folder, selection, "cold"), None)
    record("unchanged", _sweep(folder, selection, "unchanged"), set())
    for relative in args.edit:
        expected = _users_of(folder, relative)
        with open(folder / "timm" / "models" / relative, "a") as f:
            f.write("# cl-audit cache measurement: an edit\n")
        record(f"edited {relative}", _sweep(folder, selection, f"edit-{relative}"), expected)
    entries = list((folder / "cache").glob("v*/*/*.json"))
    result = {
        "measured": "scripts/cache_sweep.py: each sweep the real CLI (--fake --confirm --cache), "
        "timed as a whole process, one after another on this machine",
        "torch": torch.__version__,
        "timm": timm.__version__,
        "selection": selection,
        "cache_entries": len(entries),
        "cache_bytes": sum(e.stat().st_size for e in entries),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
