"""Which registry models do work once: their first forward's operations differ from the second's.

    python scripts/one_time_work.py --timm all --fake --shard 1/2 --out timm-1.json
    python scripts/one_time_work.py --torchvision all --out one-time-work_torchvision.json

Each model is built and given its input as a sweep does (random weights, inputs capped at 256 px,
batch 2), converted to channels_last, and run forward twice (eval, no_grad; fake tensors with
``--fake``, on the CPU), counting the operations by (Python-level name, model-code call site).
A model whose two forwards count the same does nothing once that an audit could charge to the
layout that runs first: the audits' warm-up (an unaudited forward in each layout, 2026-11-28)
cannot move its report. The others are listed with the operations of the first forward only;
their rows are the ones to re-make. Writes the JSON as it goes (whole, by rename).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from cl_audit.enums import ModelSource
from cl_audit.execution.plan import plan_run
from cl_audit.execution.settings import AuditSettings, TensorMode
from cl_audit.intercept.naming import python_op_name
from cl_audit.report.files import write_text
from cl_audit.rule.attribution import call_site
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.source_audit import prepare


class _Count(TorchFunctionMode):
    """Each operation's (name, call site), counted."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[tuple[str, str | None]] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen[(python_op_name(func), call_site(sys._getframe(1)))] += 1
        return func(*args, **(kwargs or {}))


def first_only(ref: ModelRef, settings: AuditSettings) -> dict[str, int]:
    """The operations the first forward ran beyond the second's (name at call site: count)."""
    plan = plan_run(settings)
    meta = plan.tensors.on_meta  # built as a sweep builds it (no random draws for fake runs)
    options = BuildOptions(max_input_size=256, meta=meta, skip_random_init=not meta)
    loaded = load_model(ref, options)
    module, example = prepare(loaded, plan)
    run = plan.tensors.bind(module, example, plan)
    forward = run.converted()
    counts = []
    with torch.no_grad(), run.tensor_mode():
        for _ in range(2):
            with _Count() as count:
                forward()
            counts.append(count.seen)
    extra = counts[0] - counts[1]
    return {f"{name} at {where}": n for (name, where), n in sorted(extra.items(), key=str)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timm", nargs="*", default=[])
    parser.add_argument("--torchvision", nargs="*", default=[])
    parser.add_argument("--fake", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shard", default="1/1", help="K/N: every N-th model from the K-th")
    args = parser.parse_args()
    refs = []
    asked = ((ModelSource.TIMM, args.timm), (ModelSource.TORCHVISION, args.torchvision))
    for source, names in asked:
        if names == ["all"]:
            if source is ModelSource.TIMM:
                from cl_audit.sources.timm_models import names as listed
            else:
                from cl_audit.sources.torchvision_models import names as listed
            names = listed()
        refs += [ModelRef(source, name) for name in names]
    k, n = map(int, args.shard.split("/"))
    refs = refs[k - 1 :: n]
    mode = TensorMode.FAKE if args.fake else TensorMode.EAGER
    settings = AuditSettings(tensor_mode=mode)
    rows: dict[str, dict] = {}
    if args.out.exists():
        rows = json.loads(args.out.read_text())["models"]  # resumed
    started = time.perf_counter()
    for ref in refs:
        if ref.key in rows:
            continue
        began = time.perf_counter()
        try:
            extra = first_only(ref, settings)
            rows[ref.key] = {"status": "ok", "first_only": extra}
        except Exception as e:  # the row says why: a model that cannot run has no answer here
            rows[ref.key] = {"status": "error", "message": f"{type(e).__name__}: {e}"[:300]}
        rows[ref.key]["seconds"] = round(time.perf_counter() - began, 2)
        if rows[ref.key].get("first_only"):
            print(f"{ref.key}: {len(rows[ref.key]['first_only'])} first-only", flush=True)
        document = {
            "torch": torch.__version__,
            "mode": mode.value,
            "seconds": round(time.perf_counter() - started, 1),
            "models": rows,
        }
        write_text(args.out, json.dumps(document, indent=1) + "\n", "--out")
    moved = sorted(k for k, r in rows.items() if r.get("first_only"))
    errors = sum(r["status"] == "error" for r in rows.values())
    print(f"{len(rows)} models, {len(moved)} with first-forward-only work, {errors} errors")
    for key in moved:
        print(" ", key)


if __name__ == "__main__":
    main()
