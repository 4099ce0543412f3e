"""Audit, on CPU, the torchvision models that PyTorch's memory-format tutorial lists as fully
supporting channels_last, plus a few that are known not to; write every report to one file.

    python scripts/audit_torchvision.py --out reports/torchvision-cpu.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cl_audit.run import RunSettings, audit_loaded
from cl_audit.sources import load_model

TUTORIAL_MODELS = (
    "alexnet",
    "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3",
    "mobilenet_v2",
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    "resnext50_32x4d",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
    "squeezenet1_0", "squeezenet1_1",
    "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn",
    "wide_resnet50_2", "wide_resnet101_2",
)  # fmt: skip
EXTRA_MODELS = ("convnext_tiny", "efficientnet_b0", "vit_b_16", "maxvit_t", "deeplabv3_resnet50")
MODELS = TUTORIAL_MODELS + EXTRA_MODELS
REPORTS_FORMAT = "cl-audit.reports"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--engine", default="dispatch", choices=["dispatch", "patch"])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    torch.manual_seed(0)
    reports = []
    for name in args.models:
        start = time.perf_counter()
        report = audit_loaded(load_model(name), RunSettings(engine=args.engine))
        s = report.summary
        print(
            f"{name:22s} {time.perf_counter() - start:6.1f}s  losses {s.losses:3d} "
            f"(round trips {s.round_trips}, terminal {s.terminal_conversions}) "
            f"ops {sorted({f.op for f in report.offenders})}",
            flush=True,
        )
        reports.append(report.to_dict())
    with open(args.out, "w") as f:
        json.dump({"format": REPORTS_FORMAT, "version": 1, "reports": reports}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
