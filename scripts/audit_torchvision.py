"""Audit, on CPU, the torchvision models that PyTorch's memory-format tutorial lists as fully
supporting channels_last, plus a few that are known not to; write every report to one file.

    python scripts/audit_torchvision.py --out reports/torchvision/cpu_torch-X.Y.Z.json
    python scripts/audit_torchvision.py --train \
        --out reports/torchvision/cpu-train_torch-X.Y.Z.json

X.Y.Z is the torch release: the slow test tier compares with the file of the running release.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cl_audit.report import ModelSource
from cl_audit.settings import AuditSettings, Engine
from cl_audit.sources import ModelRef, load_model
from cl_audit.sources.audit import audit_loaded
from cl_audit.sources.torchvision_models import CHANNELS_LAST_TIER

REPORTS_FORMAT = "cl-audit.reports"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--engine", default="dispatch", choices=["dispatch", "patch"])
    parser.add_argument("--train", action="store_true", help="audit one SGD training step")
    parser.add_argument("models", nargs="*", default=list(CHANNELS_LAST_TIER))
    args = parser.parse_args()
    torch.manual_seed(0)
    reports = []
    for name in args.models:
        start = time.perf_counter()
        loaded = load_model(ModelRef(ModelSource.TORCHVISION, name))
        settings = AuditSettings(engine=Engine(args.engine), train=args.train)
        report = audit_loaded(loaded, settings)
        s = report.summary
        print(
            f"{name:22s} {time.perf_counter() - start:6.1f}s  losses {s.losses:3d} "
            f"(round trips {s.round_trips}, terminal {s.terminal_conversions}) "
            f"ops {sorted({f.op for f in report.offenders})}",
            flush=True,
        )
        reports.append(report.to_dict())
    with open(args.out, "w") as f:
        json.dump({"format": REPORTS_FORMAT, "version": 3, "reports": reports}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
