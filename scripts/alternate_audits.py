"""Inference against CUDA-predicted training audits of the same timm models, alternated per
model so that both see the same machine (its speed moves by up to 2x within minutes here):
each audit runs in a forked child as a sweep worker runs it (``audit_job``, one thread, the
parent's objects frozen before the fork), with and without reading the source-file footprint
that only a sweep's cache uses (``--footprint off``: without only, as a sweep without a cache).

    python scripts/alternate_audits.py --shard 3/20 --every 2 --out /tmp/alternate.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

import torch

from cl_audit.enums import Amp, ModelSource, TensorMode
from cl_audit.execution.settings import AuditSettings
from cl_audit.sources import ModelRef
from cl_audit.sweep.selection import Selection
from cl_audit.sweep.worker import Job, SweepSettings, audit_job

KINDS = {
    "inference": AuditSettings(tensor_mode=TensorMode.FAKE),
    "training": AuditSettings(tensor_mode=TensorMode.FAKE, train=True, device="cuda", amp=Amp.FP16),
}
CONFIGS = [(kind, footprint) for footprint in (False, True) for kind in KINDS]


def timed(name: str, kind: str, footprint: bool) -> tuple[float, str]:
    """Seconds of one audit in a forked child, and its row's status."""
    read, write = os.pipe()
    gc.freeze()  # as the sweep's runner does before it forks a worker
    pid = os.fork()
    if pid == 0:
        os.close(read)
        torch.set_num_threads(1)
        job = Job(ModelRef(ModelSource.TIMM, name), SweepSettings(audit=KINDS[kind]))
        start = time.perf_counter()
        row = audit_job(job, on_files=(lambda files: None) if footprint else None)
        os.write(write, json.dumps([time.perf_counter() - start, row.status.value]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seconds, status = json.loads(pipe.read())
    os.waitpid(pid, 0)
    return seconds, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shard", default="3/20", help="the sweep's shard of --timm all")
    parser.add_argument("--every", type=int, default=1, help="every Nth model of the shard")
    parser.add_argument("--footprint", choices=("both", "off"), default="both")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    configs = CONFIGS if args.footprint == "both" else [c for c in CONFIGS if not c[1]]
    selected = Selection(timm=("all",), shard=args.shard).refs()
    refs = sorted(selected, key=lambda ref: ref.name)[:: args.every]  # as a report lists them
    rows = []
    for i, ref in enumerate(refs):
        order = configs if i % 2 == 0 else configs[::-1]
        for kind, footprint in order:
            seconds, status = timed(ref.name, kind, footprint)
            rows.append(
                {
                    "model": ref.name,
                    "kind": kind,
                    "footprint": footprint,
                    "seconds": round(seconds, 3),
                    "status": status,
                }
            )
            print(ref.name, kind, "footprint" if footprint else "-", f"{seconds:.2f}", flush=True)

    def total(kind: str, footprint: bool) -> float:
        return sum(r["seconds"] for r in rows if (r["kind"], r["footprint"]) == (kind, footprint))

    def ratios(footprint: bool) -> list[float]:
        by = {(r["model"], r["kind"]): r["seconds"] for r in rows if r["footprint"] == footprint}
        return [by[(ref.name, "training")] / by[(ref.name, "inference")] for ref in refs]

    summary = {
        f"{kind}{'' if footprint else '_no_footprint'}_seconds": round(total(kind, footprint), 1)
        for kind, footprint in configs
    }
    for footprint, label in ((True, ""), (False, "_no_footprint"))[args.footprint == "off" :]:
        summary[f"ratio{label}"] = round(
            total("training", footprint) / total("inference", footprint), 2
        )
        summary[f"median_model_ratio{label}"] = round(statistics.median(ratios(footprint)), 2)
    result = {
        "measured": __doc__.split("\n\n")[0],
        "shard": args.shard,
        "every": args.every,
        "torch": torch.__version__,
        "models": len(refs),
        "summary": summary,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
