"""The gate's projection to another batch checked against an audit run at that batch.

Each model is audited at ``--batch`` (the projection's source) and again at ``--gate-batch``
with the same settings; the first's ``cost.at_gate`` (bytes paid once per forward or step
kept, the rest scaled) is set beside the second's own figures. Written per model: both
batches' extra bytes and bytes written, the projected and the real figures at the gate's
batch, their relative errors, and whether the verdicts agree.

    python scripts/check_gate_projection.py --out reports/gate-projection_torch-2.14.1.json \\
        --input-size 3x128x128 resnet18 shufflenet_v2_x0_5 timm:dm_nfnet_f0
    python scripts/check_gate_projection.py --fake --train --device cuda --amp fp16 ... MODELS
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from cl_audit.enums import Amp, ModelSource, TensorMode
from cl_audit.execution.settings import AuditSettings, parse_input_size
from cl_audit.report import ModelReport
from cl_audit.report.verdict import Gate
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.source_audit import audit_loaded


def _ref(name: str) -> ModelRef:
    source, _, model = name.rpartition(":")
    return ModelRef(ModelSource(source) if source else ModelSource.TORCHVISION, model)


def _error(projected: int, real: int) -> float:
    return (projected - real) / real if real else float(projected != real)


def check(name: str, settings: AuditSettings, batch: int, gate_batch: int) -> dict[str, Any]:
    reports: list[ModelReport] = []
    for size in (batch, gate_batch):
        loaded = load_model(_ref(name), BuildOptions(skip_random_init=True))
        reports.append(audit_loaded(loaded, replace(settings, batch_size=size)))
    small, large = (r.cost for r in reports)
    if small is None or large is None:
        return {"model": name, "error": "no cost weighed"}
    at = small.at_gate
    return {
        "model": name,
        "batch": small.batch,
        "extra_bytes": small.extra_bytes,
        "fixed_bytes": small.fixed_bytes,
        "bytes_written": small.bytes_written,
        "fixed_written_bytes": small.fixed_written_bytes,
        "gate_batch": gate_batch,
        "projected_extra_bytes": at.extra_bytes,
        "real_extra_bytes": large.extra_bytes,
        "extra_error": round(_error(at.extra_bytes, large.extra_bytes), 4),
        "projected_bytes_written": at.bytes_written,
        "real_bytes_written": large.bytes_written,
        "written_error": round(_error(at.bytes_written, large.bytes_written), 4),
        "projected_share": round(at.share, 5),
        "real_share": round(large.share, 5),
        "verdict_at_batch": reports[0].verdict.value,
        "verdict_projected": small.verdict.value,
        "verdict_real": large.verdict.value,
        "verdicts_agree": small.verdict is large.verdict,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="torchvision names, or timm:NAME")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--gate-batch", type=int, default=32)
    parser.add_argument("--input-size", default=None)
    parser.add_argument("--fake", action="store_true")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = AuditSettings(
        input_size=None if args.input_size is None else parse_input_size(args.input_size),
        device=args.device,
        tensor_mode=TensorMode.FAKE if args.fake else TensorMode.EAGER,
        amp=None if args.amp is None else Amp(args.amp),
        train=args.train,
        gate=Gate(batch=args.gate_batch),
    )
    results = []
    for name in args.models:
        start = time.perf_counter()
        try:
            result = check(name, settings, args.batch, args.gate_batch)
        except Exception as e:  # a model that fails is a row, as in a sweep
            result = {"model": name, "error": f"{type(e).__name__}: {e}"[:300]}
        result["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(result), flush=True)
        results.append(result)
    checked = [r for r in results if "error" not in r]
    summary = {
        "models": len(results),
        "errors": len(results) - len(checked),
        "verdicts_agree": sum(r["verdicts_agree"] for r in checked),
        "max_abs_extra_error": max((abs(r["extra_error"]) for r in checked), default=None),
        "max_abs_written_error": max((abs(r["written_error"]) for r in checked), default=None),
    }
    document = {
        "torch": torch.__version__,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "models")},
        "summary": summary,
        "models": results,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
