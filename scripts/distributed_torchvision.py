"""The torchvision registry under DDP and the FSDP pre-flight (``features.distributed``), one
model per builder module (the first in name order: ``compiled_torchvision.one_per_module``).

    python scripts/distributed_torchvision.py --out reports/distributed/torchvision_torch-X.json.gz
    python scripts/distributed_torchvision.py --table ...  # the same file

Each model: ``ddp_check`` (two gloo processes per configuration: converted before and after
wrapping, ``gradient_as_bucket_view`` off and on) and ``fsdp_check`` (two processes), at
``--side`` (default 64: 3x64x64, video 3x4x64x64; the layouts of parameters do not depend on
it; ``--own-size`` for the model's own, as inception_v3 needs), batch 2, with random weights.
A model that fails is a row with its error; ``--models A B`` re-runs those into ``--out``
(a ``.gz`` path is read and written compressed).
``--table`` prints the Markdown summary that reports/pages/distributed.md quotes.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from compiled_torchvision import one_per_module

from cl_audit.enums import BucketMatch, ModelSource, WrapOrder
from cl_audit.errors import ModelFailedError
from cl_audit.execution.plan import plan_run
from cl_audit.execution.settings import AuditSettings
from cl_audit.features.distributed import ddp_check, fsdp_check
from cl_audit.report.envelope import decode_document, encode_document
from cl_audit.sources import ModelRef


def _row(name: str, side: int | None) -> dict[str, object]:
    ref = ModelRef(ModelSource.TORCHVISION, name)
    video = "video" in name or name.startswith(("r3d", "r2plus1d", "mc3", "s3d", "mvit", "swin3d"))
    size = None if side is None else (3, 4, side, side) if video else (3, side, side)
    settings = AuditSettings(train=True, input_size=size, batch_size=2)
    start = time.perf_counter()
    row: dict[str, object] = {"model": name, "input_size": size}
    try:
        ddp = ddp_check(ref, plan_run(settings))
        row["ddp"] = asdict(ddp) | {"advice": ddp.advice}
        row["fsdp"] = asdict(fsdp_check(ref, plan_run(settings)))
    except ModelFailedError as e:
        row["error"] = str(e)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def measure(out: str, side: int | None, models: list[str]) -> None:
    """Each model's row into ``out``, kept as it finishes; with ``models``, those rows replace
    the ones ``out`` holds (a model re-run at another size)."""
    rows = _read(out)["models"] if models else []
    for name in models or one_per_module():
        row = _row(name, side)
        rows = sorted([r for r in rows if r["model"] != name] + [row], key=lambda r: r["model"])
        print(name, row.get("error") or "ok", row["seconds"], flush=True)
        text = json.dumps({"torch": torch.__version__, "models": rows}, indent=1, default=str)
        Path(out).write_bytes(encode_document(text, out.endswith(".gz")))  # every row kept


def _read(path: str) -> dict:
    """A file this script wrote, gzip-compressed (``.gz``) or not."""
    return decode_document(Path(path).read_bytes())


def _count(run: dict, match: BucketMatch) -> int:
    return sum(p["match"] == match.value for p in run["parameters"])


def table(path: str) -> str:
    data = _read(path)
    lines = [
        f"torch {data['torch']}, {len(data['models'])} models",
        "",
        "| model | params 4-D, 5-D | after: mismatched / ambiguous "
        "| before: mismatched / ambiguous | DDP warns (after / before) "
        "| FSDP2 refuses | FSDP1 keeps | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["models"]:
        if "error" in row:
            lines.append(f"| {row['model']} | error: {row['error'][:80]} | | | | | | |")
            continue
        runs = row["ddp"]["runs"]
        after, before = (
            next(r for r in runs if r["order"] == order.value and not r["bucket_view"])
            for order in (WrapOrder.AFTER, WrapOrder.BEFORE)
        )
        fsdp = row["fsdp"]["runs"]
        fsdp2 = next(r for r in fsdp if r["api"] == "fsdp2")
        refused = "error" if fsdp2["error"] else str(len(fsdp2["refused"]))
        kept = [r for r in fsdp if r["api"] == "fsdp1"]
        keeps = "/".join(
            "error" if r["error"] else f"{sum(p['kept'] is True for p in r['parameters'])}"
            for r in kept
        )
        lines.append(
            f"| {row['model']} | {len(after['parameters'])} "
            f"| {_count(after, BucketMatch.MISMATCHED)} / {_count(after, BucketMatch.AMBIGUOUS)} "
            f"| {_count(before, BucketMatch.MISMATCHED)} / {_count(before, BucketMatch.AMBIGUOUS)} "
            f"| {'yes' if after['warning'] else 'no'} / {'yes' if before['warning'] else 'no'} "
            f"| {refused} | {keeps} | {row['seconds']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--table")
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--own-size", action="store_true", help="the models' own input size")
    parser.add_argument("--models", nargs="*", default=[], help="re-run these into --out")
    args = parser.parse_args()
    if args.out:
        measure(args.out, None if args.own_size else args.side, args.models)
    if args.table:
        print(table(args.table))


if __name__ == "__main__":
    main()
