"""Audit the popular-libraries tier: models as people have them in Ultralytics, diffusers,
segmentation_models_pytorch, MONAI and transformers (``examples/libraries.py``, each with its
own example input), random weights, no download. Per model: eager CPU inference, an eager CPU
training step, and fake CUDA inference with fp16 autocast (a prediction). Every report goes to
one JSON file and a Markdown table to stdout.

    pip install -e '.[libraries]'
    python scripts/audit_libraries.py --out reports/libraries_torch-2.14.1_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from cl_audit.compat import fake_cuda_problem
from cl_audit.report import ModelReport
from cl_audit.run import audit_module
from cl_audit.settings import Amp, AuditSettings, TensorMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import libraries

CONFIGURATIONS = {
    "inference": AuditSettings(),
    "training": AuditSettings(train=True),
    "fake-cuda-fp16": AuditSettings(device="cuda", tensor_mode=TensorMode.FAKE, amp=Amp.FP16),
}


def _row(name: str, configuration: str, report: ModelReport, seconds: float) -> dict:
    sites = {}
    for f in report.offenders:
        key = (f.op, f.call_site)
        entry = sites.setdefault(
            key, {"op": f.op, "call_site": f.call_site, "count": 0, "bytes": 0}
        )
        entry["count"] += f.count
        entry["bytes"] += f.bytes_converted
    top = sorted(sites.values(), key=lambda s: -s["bytes"])[:3]
    return {
        "model": name,
        "configuration": configuration,
        "status": "ok",
        "offending": bool(report.offenders),
        "offenders": len(report.offenders),
        "bytes_converted": sum(f.bytes_converted for f in report.offenders),
        "input_shape": list(report.input_shape or ()),
        "top_sites": top,
        "seconds": round(seconds, 1),
        "report": report.to_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("models", nargs="*", default=list(libraries.ALL))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.models:
        for configuration, settings in CONFIGURATIONS.items():
            start = time.perf_counter()
            if settings.tensor_mode is TensorMode.FAKE and fake_cuda_problem() is not None:
                rows.append({"model": name, "configuration": configuration,
                             "status": "skipped", "message": fake_cuda_problem()})  # fmt: skip
                continue
            try:
                torch.manual_seed(0)
                model, example = getattr(libraries, name)()
                report = audit_module(model, example, settings, name=name)
                row = _row(name, configuration, report, time.perf_counter() - start)
            except Exception as e:  # a model that fails is a row, not the end of the run
                row = {"model": name, "configuration": configuration, "status": "error",
                       "message": f"{type(e).__name__}: {e}"[:300]}  # fmt: skip
            rows.append(row)
            sites = "; ".join(f"{s['op']} {s['call_site']}" for s in row.get("top_sites", []))
            print(f"{name:20s} {configuration:15s} {row['status']:6s} "
                  f"{row.get('offenders', '-')!s:>3} {sites}", flush=True)  # fmt: skip
    document = {"format": "cl-audit.libraries", "version": 1, "torch": torch.__version__,
                "rows": rows}  # fmt: skip
    args.out.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
