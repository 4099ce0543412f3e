"""How much of a predicted audit is the fake tensors' own dispatch: per model, inference and
CUDA-predicted training audits alternated, each in a forked child as a sweep worker runs it
(``audit_job``, one thread, the parent's objects frozen), timing every operation the fake mode
receives from outside itself (its memo's answers and torch's ``FakeTensorMode`` work below
cl-audit's observer; operations a decomposition issues inside it are part of their caller).

    python scripts/fake_dispatch_share.py --shard 3/20 --every 3 --out /tmp/share.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from alternate_audits import KINDS  # the same two audits, as scripts/ is on sys.path

from cl_audit.enums import ModelSource
from cl_audit.fake import mode as fake_mode
from cl_audit.sources import ModelRef
from cl_audit.sweep.selection import Selection
from cl_audit.sweep.worker import Job, SweepSettings, audit_job


def measured(name: str, kind: str) -> dict[str, object]:
    """One audit in a forked child: its seconds, and the operations and seconds of the fake
    mode's outermost dispatches."""
    read, write = os.pipe()
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        torch.set_num_threads(1)
        depth, spent, calls = [0], [0.0], [0]
        dispatch = fake_mode._FakeMode.__torch_dispatch__

        def timed(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if depth[0]:
                return dispatch(self, func, types, args, kwargs)
            depth[0] += 1
            start = time.perf_counter()
            try:
                return dispatch(self, func, types, args, kwargs)
            finally:
                spent[0] += time.perf_counter() - start
                calls[0] += 1
                depth[0] -= 1

        fake_mode._FakeMode.__torch_dispatch__ = timed
        job = Job(ModelRef(ModelSource.TIMM, name), SweepSettings(audit=KINDS[kind]))
        start = time.perf_counter()
        row = audit_job(job, on_files=None)
        seconds = time.perf_counter() - start
        result = {"seconds": seconds, "fake_seconds": spent[0], "fake_operations": calls[0]}
        os.write(write, json.dumps({**result, "status": row.status.value}).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        result = json.loads(pipe.read())
    os.waitpid(pid, 0)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shard", default="3/20", help="the sweep's shard of --timm all")
    parser.add_argument("--every", type=int, default=1, help="every Nth model of the shard")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    selected = Selection(timm=("all",), shard=args.shard).refs()
    refs = sorted(selected, key=lambda ref: ref.name)[:: args.every]
    rows = []
    for i, ref in enumerate(refs):
        for kind in list(KINDS) if i % 2 == 0 else list(KINDS)[::-1]:
            row = {"model": ref.name, "kind": kind, **measured(ref.name, kind)}
            rows.append(row)
            print(json.dumps(row), flush=True)

    ok = {r["model"] for r in rows if r["status"] == "ok" and r["kind"] == "training"}
    ok &= {r["model"] for r in rows if r["status"] == "ok" and r["kind"] == "inference"}
    rows_ok = [r for r in rows if r["model"] in ok]

    def whole(kind: str, field: str) -> float:
        return sum(r[field] for r in rows_ok if r["kind"] == kind)

    by = {(r["model"], r["kind"]): r for r in rows_ok}
    summary = {
        "models": len(ok),
        "inference_seconds": round(whole("inference", "seconds"), 1),
        "training_seconds": round(whole("training", "seconds"), 1),
        "inference_fake_seconds": round(whole("inference", "fake_seconds"), 1),
        "training_fake_seconds": round(whole("training", "fake_seconds"), 1),
        "inference_fake_operations": int(whole("inference", "fake_operations")),
        "training_fake_operations": int(whole("training", "fake_operations")),
        "median_operations_ratio": round(
            statistics.median(
                by[(m, "training")]["fake_operations"] / by[(m, "inference")]["fake_operations"]
                for m in ok
            ),
            2,
        ),
    }
    summary["ratio"] = round(summary["training_seconds"] / summary["inference_seconds"], 2)
    summary["training_fake_to_inference"] = round(
        summary["training_fake_seconds"] / summary["inference_seconds"], 2
    )
    result = {
        "measured": __doc__.split("\n\n")[0],
        "shard": args.shard,
        "every": args.every,
        "torch": torch.__version__,
        "summary": summary,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
