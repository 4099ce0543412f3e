"""Eager against fake on one device: are cl-audit's fake-mode predictions what really runs?

For each model and configuration (inference forward and training step; float32 and AMP), the
model is audited twice: eagerly on the device, and with fake tensors for the same device (the
prediction sweeps make). The findings are compared as sets of (kind, aten op, phase); every
disagreement is listed, by op, with the models it appears in: candidates for
``cl_audit.fake.kernels.FAKE_DIVERGENCES``. On a CUDA machine (the point of it):

    python scripts/gpu_truth.py --out reports/gpu-truth-cuda.json
    python scripts/gpu_truth.py --out reports/gpu-truth-cuda-timm.json --timm resnet50 ...
    python scripts/gpu_truth.py --out part-1.json --shard 1/4     # one of four processes
    python scripts/gpu_truth.py --out whole.json --merge part-*.json

The file is rewritten after every row, so a run stopped at a time limit keeps what it measured.

On CPU (``--device cpu --amp bf16``) it measures fake against eager CPU the same way. Without a
GPU the CUDA verdicts of cl-audit stay predictions, and the README says so.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from dataclasses import replace

import torch

from cl_audit.execution.settings import Amp, AuditSettings
from cl_audit.report import ModelReport, ModelSource, TensorMode
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.source_audit import audit_loaded
from cl_audit.sources.torchvision_models import CHANNELS_LAST_TIER

# a spread of timm families: convolutional, mobile, transformer, hybrid
TIMM_SAMPLE = (
    "resnet50", "efficientnet_b0", "mobilenetv3_large_100", "convnext_tiny", "regnety_016",
    "densenet121", "vit_small_patch16_224", "swin_tiny_patch4_window7_224", "maxvit_tiny_tf_224",
    "coatnet_0_rw_224", "efficientvit_b0", "levit_128", "poolformer_s12", "resnest14d",
)  # fmt: skip


def _signature(report: ModelReport) -> set[tuple[str, str, str]]:
    findings = report.offenders + report.regains + report.parameter_conversions
    return {(f.kind.value, f.op_id, f.phase.value) for f in findings}


def _audit(ref: ModelRef, settings: AuditSettings, size: int) -> ModelReport:
    fake = settings.tensor_mode is TensorMode.FAKE
    torch.manual_seed(0)
    loaded = load_model(ref, BuildOptions(max_input_size=size, meta=fake))
    return audit_loaded(loaded, replace(settings, differential=False))


def _summary(rows: list[dict], device: str, torch_version: str, gpu: str | None) -> dict:
    divergences: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        for side, key in (("eager only", "eager_only"), ("fake only", "fake_only")):
            for kind, op, phase in row.get(key, ()):
                divergences[f"{op} ({kind}, {phase})"][side].append(
                    f"{row['model']} {row['configuration']}"
                )
    return {
        "device": device,
        "torch": torch_version,
        "gpu": gpu,
        "rows": len(rows),
        "agree": sum(r["status"] == "agree" for r in rows),
        "diverge": sum(r["status"] == "diverge" for r in rows),
        "error": sum(r["status"] == "error" for r in rows),
        "divergences": {op: dict(sides) for op, sides in sorted(divergences.items())},
    }


def _write(path: str, summary: dict, rows: list[dict]) -> None:
    with open(path, "w") as out:
        json.dump({"summary": summary, "rows": rows}, out, indent=1)
        out.write("\n")


def _merge(paths: list[str], out: str) -> dict:
    """One measurement from the parts of a sharded run (one device and torch release)."""
    parts = [json.load(open(path)) for path in paths]
    keys = {(p["summary"]["device"], p["summary"]["torch"], p["summary"]["gpu"]) for p in parts}
    if len(keys) != 1:
        raise SystemExit(f"parts of different runs: {sorted(map(str, keys))}")
    rows = [row for part in parts for row in part["rows"]]
    summary = _summary(rows, *keys.pop())
    _write(out, summary, rows)
    return summary


def _report(summary: dict) -> None:
    print(json.dumps({k: v for k, v in summary.items() if k != "divergences"}))
    for op, sides in summary["divergences"].items():
        for side, where in sides.items():
            print(f"{op}: {side} in {len(where)}: {', '.join(where[:6])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--amp", choices=["fp16", "bf16"], default="fp16")
    parser.add_argument("--max-input-size", type=int, default=160)
    parser.add_argument("--no-train", action="store_true", help="inference forward only")
    parser.add_argument("--shard", default="1/1", help="K/N: every N-th model from the K-th")
    parser.add_argument("--merge", nargs="+", default=None, help="merge these parts into --out")
    parser.add_argument("--timm", nargs="*", default=None, help="timm models (default: a sample)")
    parser.add_argument("models", nargs="*", default=None, help="torchvision models (the tier)")
    args = parser.parse_args()
    if args.merge:
        _report(_merge(args.merge, args.out))
        return
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: the CUDA verdicts stay predictions")
    k, n = (int(x) for x in args.shard.split("/"))
    refs = [ModelRef(ModelSource.TORCHVISION, m) for m in (args.models or CHANNELS_LAST_TIER)]
    refs += [
        ModelRef(ModelSource.TIMM, m) for m in (TIMM_SAMPLE if args.timm is None else args.timm)
    ]
    refs = refs[k - 1 :: n]
    configurations = [(train, amp) for train in (False, True) for amp in (None, Amp(args.amp))]
    if args.no_train:
        configurations = [c for c in configurations if not c[0]]
    gpu = None
    if args.device.startswith("cuda"):  # the device, and the CUDA and cuDNN torch was built with
        gpu = f"{torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}, cuDNN "
        gpu += str(torch.backends.cudnn.version())
    rows: list[dict] = []
    for ref in refs:
        for train, amp in configurations:
            label = ("train" if train else "forward") + (f"+{amp.value}" if amp else "")
            settings = AuditSettings(device=args.device, amp=amp, train=train)
            row = {"model": ref.key, "configuration": label}
            start = time.perf_counter()
            try:
                eager = _audit(ref, settings, args.max_input_size)
                fake = _audit(
                    ref, replace(settings, tensor_mode=TensorMode.FAKE), args.max_input_size
                )
            except Exception as e:  # a model that fails is a row, not the end of the run
                row.update(status="error", message=f"{type(e).__name__}: {e}"[:300])
                rows.append(row)
                _write(args.out, _summary(rows, args.device, torch.__version__, gpu), rows)
                print(f"{ref.key:40s} {label:14s} error {row['message'][:80]}", flush=True)
                continue
            e, f = _signature(eager), _signature(fake)
            row.update(
                status="agree" if e == f else "diverge",
                eager_offenders=len(eager.offenders),
                fake_offenders=len(fake.offenders),
                eager_only=sorted(map(list, e - f)),
                fake_only=sorted(map(list, f - e)),
                seconds=round(time.perf_counter() - start, 1),
            )
            rows.append(row)
            _write(args.out, _summary(rows, args.device, torch.__version__, gpu), rows)
            counts = f"eager {len(eager.offenders)} fake {len(fake.offenders)} offenders"
            print(f"{ref.key:40s} {label:14s} {row['status']:8s} {counts}", flush=True)
    _report(_summary(rows, args.device, torch.__version__, gpu))


if __name__ == "__main__":
    main()
