"""Bench the torchvision tier with ``cl-audit bench`` on this machine: nchw / channels-last /
conv-weights, float32 and (where the CPU has it) bf16 autocast, with the audit's verdict and
the attributed conversion time beside each; every bench report goes to one JSON file and a
Markdown table to stdout. Never mix CPU and GPU figures: ``--device`` names one.

    python scripts/bench_torchvision.py --out reports/bench-torchvision-cpu.json
    python scripts/bench_torchvision.py --out /tmp/r1.json resnet50 mobilenet_v2   # repeatability
    python scripts/bench_torchvision.py --device cuda --batch-size 32 --train --out ...

The file is rewritten after every model, so a run stopped at a time limit keeps what it timed.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cl_audit.execution.settings import Amp, AuditSettings
from cl_audit.features.bench import BenchSettings, bench_module
from cl_audit.report import ModelSource
from cl_audit.sources import ModelRef, load_model
from cl_audit.sources.torchvision_models import CHANNELS_LAST_TIER

# deeplabv3 runs at 520 px: minutes per configuration on 2 cores; bench it by name if wanted
DEFAULT_MODELS = tuple(m for m in CHANNELS_LAST_TIER if not m.startswith("deeplabv3"))


def _bf16_here(device: str) -> bool:
    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", choices=["bf16", "fp16", "none"], default=None,
                        help="default: bf16 where the CPU has it, fp16 on CUDA")  # fmt: skip
    parser.add_argument("--input-size", default="3x224x224")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--train", action="store_true", help="time training steps")
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    args = parser.parse_args()
    amp = args.amp or ("fp16" if args.device.startswith("cuda") else "bf16")
    if amp == "bf16" and not _bf16_here(args.device):
        amp = "none"  # said in the output: this machine has no bf16 kernels
    size = tuple(int(d) for d in args.input_size.split("x"))
    reports = []
    kind = "training steps" if args.train else "inference"
    print(f"device {args.device}, autocast {amp}, {args.batch_size}x{args.input_size}, {kind}")
    errors = []
    for name in args.models:
        start = time.perf_counter()
        torch.manual_seed(0)
        loaded = load_model(ModelRef(ModelSource.TORCHVISION, name))
        settings = BenchSettings(
            AuditSettings(
                batch_size=args.batch_size,
                input_size=size,
                device=args.device,
                amp=None if amp == "none" else Amp(amp),
                train=args.train,
            ),
            rounds=args.rounds,
            steps_per_round=args.steps,
            threads=args.threads,
        )
        x = torch.randn(args.batch_size, *size, generator=torch.Generator().manual_seed(0))
        module = loaded.module.to(args.device)
        try:
            report = bench_module(module, (x.to(args.device),), settings, name=name, source="tv")
        except Exception as e:  # a model that fails is listed, not the end of the run
            errors.append({"model": name, "message": f"{type(e).__name__}: {e}"[:300]})
            print(f"{name:22s} error {errors[-1]['message'][:90]}", flush=True)
        else:
            reports.append(report.to_dict())
            seconds = time.perf_counter() - start
            print(f"{name:22s} {seconds:6.1f}s  {report.verdict_text}", flush=True)
        document = {"format": "cl-audit.bench-reports", "version": 1, "reports": reports}
        with open(args.out, "w") as f:
            json.dump({**document, "errors": errors} if errors else document, f)
            f.write("\n")
        del module, loaded
    if reports:
        print()
        print(markdown(reports))


def markdown(reports: list[dict]) -> str:
    """One row per model: offenders, times, ratios, and whether the attributed losses add up to
    the channels-last - nchw difference."""
    names = [t["name"] for t in reports[0]["timings"]]
    amp = next((n.split("+")[1] for n in names if "+" in n), None)
    head = ["model", "offenders", "nchw ms", "cl/nchw", "cw/nchw"]
    if amp:
        head += [f"nchw+{amp} ms", f"cl/nchw {amp}", f"cw/nchw {amp}"]
    head += ["cl - nchw ms", "losses ms", "share"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in reports:
        t = {x["name"]: x for x in r["timings"]}
        a = r["attribution"]

        def ratio(name: str, t: dict = t) -> str:
            # time ratio: > 1 means slower than nchw at the same autocast
            base = t[name.replace("channels-last", "nchw").replace("conv-weights", "nchw")]
            return f"{t[name]['median_ms'] / base['median_ms']:.2f}"

        row = [r["model"], str(a["offenders"]), f"{t['nchw']['median_ms']:.1f}"]
        row += [ratio("channels-last"), ratio("conv-weights")]
        if amp:
            row += [f"{t['nchw+' + amp]['median_ms']:.1f}"]
            row += [ratio("channels-last+" + amp), ratio("conv-weights+" + amp)]
        cl = t["channels-last+" + amp] if amp else t["channels-last"]
        base = t["nchw+" + amp] if amp else t["nchw"]
        row += [f"{cl['median_ms'] - base['median_ms']:+.1f}", f"{a['losses_ms']:.2f}"]
        row += [f"{a['share']:.1%}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
