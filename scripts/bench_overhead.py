"""Cost of auditing, as ratios measured within one run (timings on shared machines are noisy).

For each model: plain forward vs audited forward (batch 2, 224 px, channels_last, one thread),
alternating, median of --repeats pairs. Then the cost per intercepted call: a loop of 2,000
``relu`` on a (2, 8, 4, 4) channels_last tensor, audited minus plain, per call.

    python scripts/bench_overhead.py --out reports/bench-overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torchvision

import cl_audit

MODELS = ("resnet50", "mobilenet_v2", "convnext_tiny", "vit_b_16")
ENGINES = ("dispatch", "patch")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def audited(engine: str, fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> None:
        with cl_audit.audit(engine):
            fn()

    return run


def alternate(plain: Callable[[], object], others: dict[str, Callable[[], object]], repeats: int):
    """Median seconds of plain and of each other callable, run in alternation."""
    times: dict[str, list[float]] = {"plain": [], **{k: [] for k in others}}
    for _ in range(repeats):
        times["plain"].append(timed(plain))
        for key, fn in others.items():
            times[key].append(timed(fn))
    return {key: statistics.median(values) for key, values in times.items()}


def bench_model(name: str, repeats: int) -> dict[str, object]:
    model = torchvision.models.get_model(name, weights=None).eval()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 224, 224).contiguous(memory_format=torch.channels_last)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    forward()  # warm-up
    for engine in ENGINES:
        audited(engine, forward)()
    medians = alternate(forward, {e: audited(e, forward) for e in ENGINES}, repeats)
    return {
        "model": name,
        "plain_s": round(medians["plain"], 4),
        **{f"{e}_ratio": round(medians[e] / medians["plain"], 3) for e in ENGINES},
    }


def bench_per_call(repeats: int, calls: int = 2000) -> dict[str, float]:
    x = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)

    def loop() -> None:
        for _ in range(calls):
            torch.relu(x)

    loop()
    medians = alternate(loop, {e: audited(e, loop) for e in ENGINES}, repeats)
    result = {"plain_us": round(medians["plain"] / calls * 1e6, 2)}
    for e in ENGINES:
        result[f"{e}_us_per_call"] = round((medians[e] - medians["plain"]) / calls * 1e6, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [bench_model(name, args.repeats) for name in args.models]
    per_call = bench_per_call(args.repeats)
    print("| model | plain forward (s) | dispatch | patch |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['model']} | {row['plain_s']:.3f} | {row['dispatch_ratio']:.3f}x "
            f"| {row['patch_ratio']:.3f}x |"
        )
    print(
        f"\nper intercepted call (2,000 relu, (2,8,4,4) channels_last): plain "
        f"{per_call['plain_us']} us; added by dispatch {per_call['dispatch_us_per_call']} us, "
        f"by patch {per_call['patch_us_per_call']} us"
    )
    if args.out:
        result = {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": 1,
            "repeats": args.repeats,
            "models": rows,
            "per_call": per_call,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
