"""Two versions of cl-audit against each other on the same audits, alternated per model so that
both see the same machine: each version runs in a long-lived parent of its own (its source tree
first on ``PYTHONPATH``), which forks a worker per audit as a sweep does (``audit_job``, one
thread, the parent's objects frozen) and reports the audit's seconds.

    git worktree add /tmp/old a81b24a
    python scripts/alternate_code.py --old /tmp/old --new . --kind training --out /tmp/ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_SERVE = "--serve"


def serve() -> None:
    """The parent of one version: reads ``kind name`` lines, answers ``[seconds, status]``."""
    import gc
    import time

    import torch
    from alternate_audits import KINDS as kinds  # the same two audits, each version's own

    from cl_audit.enums import ModelSource
    from cl_audit.execution.plan import plan_run
    from cl_audit.sources import ModelRef
    from cl_audit.sweep import runner
    from cl_audit.sweep.session import _warm_imports
    from cl_audit.sweep.worker import Job, SweepSettings, audit_job

    _warm_imports([ModelRef(ModelSource.TIMM, "resnet50")])
    for settings in kinds.values():
        plan_run(settings)  # the probes, run once in the parent as the sweep command runs them
    # the worker's process as the sweep's runner sets it up (a tree older than that function:
    # one thread, as its runner did)
    set_up = getattr(runner, "set_up_worker", lambda job: torch.set_num_threads(1))
    print(json.dumps({"ready": __import__("cl_audit").__file__}), flush=True)
    for line in sys.stdin:
        kind, name = line.split()
        read, write = os.pipe()
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            job = Job(ModelRef(ModelSource.TIMM, name), SweepSettings(audit=kinds[kind]))
            set_up(job)
            start = time.perf_counter()
            row = audit_job(job, on_files=None)
            os.write(write, json.dumps([time.perf_counter() - start, row.status.value]).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            answer = pipe.read()
        os.waitpid(pid, 0)
        print(answer, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="the first version's tree")
    parser.add_argument("--new", type=Path, required=True, help="the second version's tree")
    parser.add_argument("--kind", choices=("inference", "training"), required=True)
    parser.add_argument("--shard", default="3/20", help="the sweep's shard of --timm all")
    parser.add_argument("--every", type=int, default=3, help="every Nth model of the shard")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from cl_audit.sweep.selection import Selection

    refs = sorted(Selection(timm=("all",), shard=args.shard).refs(), key=lambda r: r.name)
    names = [ref.name for ref in refs[:: args.every]]
    parents = {}
    for version in ("old", "new"):
        tree = str(getattr(args, version).resolve())
        env = {**os.environ, "PYTHONPATH": tree, "YOLO_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        parents[version] = subprocess.Popen(
            [sys.executable, __file__, _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env, cwd="/",
        )  # fmt: skip
        print(parents[version].stdout.readline().strip(), flush=True)
    rows = []
    for i, name in enumerate(names):
        for version in ("old", "new") if i % 2 == 0 else ("new", "old"):
            parent = parents[version]
            parent.stdin.write(f"{args.kind} {name}\n")
            parent.stdin.flush()
            seconds, status = json.loads(parent.stdout.readline())
            rows.append({"model": name, "version": version, "seconds": seconds, "status": status})
            print(name, version, f"{seconds:.2f}", status, flush=True)
    for parent in parents.values():
        parent.stdin.close()
        parent.wait()
    by = {(r["model"], r["version"]): r["seconds"] for r in rows}
    totals = {v: round(sum(by[(n, v)] for n in names), 1) for v in ("old", "new")}
    summary = {
        "models": len(names),
        **{f"{v}_seconds": t for v, t in totals.items()},
        "new_to_old": round(totals["new"] / totals["old"], 3),
        "median_model_new_to_old": round(
            statistics.median(by[(n, "new")] / by[(n, "old")] for n in names), 3
        ),
    }
    result = {
        "measured": __doc__.split("\n\n")[0],
        "kind": args.kind,
        "old": str(args.old),
        "new": str(args.new),
        "shard": args.shard,
        "every": args.every,
        "summary": summary,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    serve() if sys.argv[1:] == [_SERVE] else main()
