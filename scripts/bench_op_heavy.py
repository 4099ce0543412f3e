"""What auditing an op-heavy model costs against its plain forward (issue #59's target: 20x).

    python scripts/bench_op_heavy.py --out reports/op-heavy_torch-2.14.1.json

The model: pytorchcv's SuperPoint (``examples/libraries.py:pytorchcv_superpoint``, random
weights, a 2x1x128x128 input), whose forward loops in Python over its keypoints: many small
operations on small tensors. Its plain forward (channels_last, eval, no_grad; the median of
``--forwards`` after one untimed) against one whole audit as the CLI runs it for one model: the
warm-ups, the audited run in channels_last, the NCHW run, the remedies' what-if runs. One
thread. Written whole (by rename).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from cl_audit.files import write_text
from cl_audit.run.audit_module import audit_module
from cl_audit.settings import AuditSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import libraries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forwards", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, images = libraries.pytorchcv_superpoint()
    model = model.eval().to(memory_format=torch.channels_last)
    x = images.to(memory_format=torch.channels_last)
    plain = []
    with torch.no_grad():
        model(x)
        for _ in range(args.forwards):
            started = time.perf_counter()
            model(x)
            plain.append(time.perf_counter() - started)
    torch.manual_seed(0)
    model, images = libraries.pytorchcv_superpoint()
    started = time.perf_counter()
    report = audit_module(model, (images,), AuditSettings(verify=True), name="superpoint")
    audit = time.perf_counter() - started
    forward = statistics.median(plain)
    result = {
        "torch": torch.__version__,
        "model": "pytorchcv_superpoint, 2x1x128x128",
        "plain_forward_s": [round(t, 4) for t in plain],
        "audit_s": round(audit, 2),
        "verify_s": report.cost.verify_seconds if report.cost else None,
        "calls_checked": report.summary.calls_checked,
        "ratio": round(audit / forward, 1),
    }
    print(json.dumps(result, indent=1))
    write_text(args.out, json.dumps(result, indent=1) + "\n", "--out")


if __name__ == "__main__":
    main()
