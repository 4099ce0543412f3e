"""Rewrite the version-1 operation time tables (made by the former ``scripts/op_times.py``) as
version 2, the format ``cl-audit table`` writes; run once on 2026-12-01 for the two tables then
shipped, whose version-1 files are kept under ``reports/speed/tables-v1/``.

    python scripts/tables_v2.py reports/speed/tables-v1/*.json --out cl_audit/predict/tables/

What changes: the machine's identity (``identity``, from the file's ``machine``), convolution
rows with their sides apart (``height``, ``width``), and the host's cost per kind of operation
(version 2's ``host``) from what version 1 measured, nothing fitted:

- CPU (a deep stack of tiny modules, per module): ``forward`` the no-gradient figure; a training
  step's figure (forward and backward per module) split in halves as ``forward_grad`` and
  ``backward``; ``optimizer`` as a forward operation; views and a read back at the bare
  operation's launch (a tiny ``torch.add``).
- CUDA (the H200 lease): ``forward`` the probes' host time per kernel launched under no
  gradient, ``forward_grad``, ``backward`` and ``optimizer`` the probes' training steps' host
  time per kernel launched (recomputed from the lease's raw files, ``--raw``); views and a read
  back at a tiny operation's host time. Version 1's ``step_us`` and ``overlap``, fitted to
  measured steps, are kept as ``calibration``, which no prediction reads.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

LAYOUTS = ("channels_last", "nchw")


def cuda_step_host_us(raws: list[dict]) -> float:
    """The probes' training steps' host microseconds per kernel launched (median)."""
    per = []
    for raw in raws:
        for probe in raw["probes"]:
            if "error" in probe:
                continue
            for layout in LAYOUTS:
                calls = sum(r["calls"] for r in probe[layout].get("profile", []))
                if calls:
                    per.append(probe[layout]["step_host_us"] / calls)
    return round(statistics.median(per), 3)


def identity(v1: dict) -> dict:
    m = v1["machine"]
    release = v1["torch"].split("+")[0]
    if v1["device"] == "cpu":
        return {"device": "cpu", "model": m["processor"], "cores": m["cores"],
                "threads": m["threads"], "torch": release, "backend": v1["backend"]}  # fmt: skip
    return {"device": "cuda", "model": m["gpu"], "memory_gib": m["gpu_memory_gib"],
            "multiprocessors": m["multiprocessors"],
            "host": f"{m['processor']} ({m['cores']} cores)",
            "torch": release, "backend": v1["backend"]}  # fmt: skip


def host(v1: dict, raws: list[dict]) -> tuple[dict, dict | None]:
    launch = v1["launch"]["host_us"]
    old = v1["host"]
    if v1["device"] == "cpu":
        half = round(old["step_us"] / 2, 3)
        costs = {"forward": old["forward_us"], "forward_grad": half, "backward": half,
                 "optimizer": old["forward_us"], "view": launch, "view_grad": launch,
                 "sync": launch}  # fmt: skip
        basis = ("converted from version 1: a deep stack of tiny modules, per module (no "
                 "gradient; a training step's forward and backward, halved); views and reads "
                 "back at a tiny torch.add's launch")  # fmt: skip
        return costs | {"basis": basis}, None
    step = cuda_step_host_us(raws)
    costs = {"forward": old["forward_us"], "forward_grad": step, "backward": step,
             "optimizer": step, "view": launch, "view_grad": launch, "sync": launch}  # fmt: skip
    basis = ("converted from version 1: the probes' host time per kernel launched, under no "
             "gradient and in training steps (the lease's raw files); views and reads back at a "
             "tiny torch.add's host time")  # fmt: skip
    calibration = {"step_us": old["step_us"], "overlap": old["overlap"], "basis": old["basis"]}
    return costs | {"basis": basis}, calibration


def convert(v1: dict, raws: list[dict]) -> dict:
    costs, calibration = host(v1, raws)
    convs = []
    for c in v1["convolutions"]:
        row = {k: c[k] for k in ("dtype", "batch", "cin", "cout", "groups", "kernel", "stride")}
        row |= {"height": c["size"], "width": c["size"], "out_height": c["out_size"],
                "out_width": c["out_size"], "source": "grid"}  # fmt: skip
        convs.append(row | {layout: c[layout] for layout in LAYOUTS})
    return {
        "format": "cl-audit.speed-table",
        "version": 2,
        "name": v1["name"],
        "identity": identity(v1),
        "measured": min(v1["measured"]),
        "made_by": "; ".join(v1["script"]) + " (version 1, rewritten by scripts/tables_v2.py)",
        "complete": True,
        "models": [],
        "settings": v1["settings"],
        "host": costs,
        "calibration": calibration,
        "ops": v1["ops"],
        "convolutions": convs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tables", type=Path, nargs="+")
    p.add_argument("--out", type=Path, required=True, help="a folder")
    p.add_argument("--raw", type=Path, nargs="*", default=[], help="the CUDA lease's raw files")
    a = p.parse_args()
    raws = [json.load(gzip.open(r, "rt")) for r in a.raw]
    for path in a.tables:
        v1 = json.loads(path.read_text())
        table = convert(v1, raws if v1["device"] == "cuda" else [])
        target = a.out / path.name
        target.write_text(json.dumps(table, indent=0, separators=(",", ":")) + "\n")
        print(f"wrote {target}: host {table['host']}")


if __name__ == "__main__":
    main()
