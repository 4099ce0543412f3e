"""Cost of auditing, as ratios measured within one run (timings on shared machines are noisy).

For each model and engine: a plain forward and an audited forward (batch 2, 224 px,
channels_last, one thread) back to back, --repeats pairs; the ratio is the median of the pairs'
ratios. The budget's guard, ``dispatch_over_bare_modes``: the dispatch audit paired directly
with the bare modes (its floor: the same two modes passing every call through unchecked).
Then the cost per intercepted call: a loop of 2,000 ``relu`` on a (2, 8, 4, 4) channels_last
tensor, audited minus plain, per call.

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
import torch.nn.functional as F
import torchvision
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import cl_audit
from cl_audit.report import Phase

MODELS = ("resnet50", "mobilenet_v2", "convnext_tiny", "vit_b_16")
TRAIN_MODELS = ("resnet50", "mobilenet_v2")
ENGINES = ("dispatch", "patch")


class _BareDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _BareFunction(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def bare_modes(fn: Callable[[], object]) -> Callable[[], object]:
    """The floor of the dispatch engine: its two modes passing everything through unchecked."""

    def run() -> None:
        with _BareFunction(), _BareDispatch():
            fn()

    return run


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def audited(engine: str, fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> None:
        with cl_audit.audit(engine):
            fn()

    return run


def paired_ratio(plain: Callable[[], object], other: Callable[[], object], repeats: int):
    """Median of other/plain over back-to-back pairs (robust to drift), and the median times."""
    plain_times, other_times = [], []
    for _ in range(repeats):
        plain_times.append(timed(plain))
        other_times.append(timed(other))
    ratios = [o / p for p, o in zip(plain_times, other_times, strict=True)]
    return (
        statistics.median(ratios),
        statistics.median(plain_times),
        statistics.median(other_times),
    )


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
    row: dict[str, object] = {"model": name}
    for engine in ENGINES:
        ratio, plain_s, _ = paired_ratio(forward, audited(engine, forward), repeats)
        row.setdefault("plain_s", round(plain_s, 4))
        row[f"{engine}_ratio"] = round(ratio, 3)
    row["bare_modes_ratio"] = round(paired_ratio(forward, bare_modes(forward), repeats)[0], 3)
    # the guard: the dispatch audit against its floor, paired directly
    over = paired_ratio(bare_modes(forward), audited("dispatch", forward), repeats)[0]
    row["dispatch_over_bare_modes"] = round(over, 4)
    return row


def bench_training(name: str, repeats: int) -> dict[str, object]:
    """A plain SGD training step (forward, cross-entropy, backward, step) against the same step
    in a training audit (dispatch engine, phases entered as ``--train`` does)."""
    model = torchvision.models.get_model(name, weights=None).train()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 224, 224).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(1000, (2,), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step(enter: Callable[[Phase], None] = lambda phase: None) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), labels)
        enter(Phase.BACKWARD)
        loss.backward()
        enter(Phase.OPTIMIZER)
        optimizer.step()

    def audited_step() -> None:
        with cl_audit.audit(model=model, training=True) as active:
            step(active.enter_phase)

    step()  # warm-up
    audited_step()
    ratio, plain_s, _ = paired_ratio(step, audited_step, repeats)
    return {
        "model": name,
        "plain_step_s": round(plain_s, 4),
        "training_audit_ratio": round(ratio, 3),
    }


def bench_per_call(repeats: int, calls: int = 2000) -> dict[str, float]:
    x = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)

    def loop() -> None:
        for _ in range(calls):
            torch.relu(x)

    loop()
    result: dict[str, float] = {}
    for engine in ENGINES:
        _, plain_s, audited_s = paired_ratio(loop, audited(engine, loop), repeats)
        result.setdefault("plain_us", round(plain_s / calls * 1e6, 2))
        result[f"{engine}_us_per_call"] = round((audited_s - plain_s) / calls * 1e6, 2)
    _, plain_s, bare_s = paired_ratio(loop, bare_modes(loop), repeats)
    result["bare_modes_us_per_call"] = round((bare_s - plain_s) / calls * 1e6, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--train-models", nargs="*", default=list(TRAIN_MODELS))
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [bench_model(name, args.repeats) for name in args.models]
    training = [bench_training(name, args.repeats) for name in args.train_models]
    per_call = bench_per_call(args.repeats)
    print("| model | plain forward (s) | dispatch | patch | bare modes | dispatch / bare |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['model']} | {row['plain_s']:.3f} | {row['dispatch_ratio']:.3f}x "
            f"| {row['patch_ratio']:.3f}x | {row['bare_modes_ratio']:.3f}x "
            f"| {row['dispatch_over_bare_modes']:.4f}x |"
        )
    print("\n| model | plain training step (s) | training audit |\n|---|---|---|")
    for row in training:
        print(
            f"| {row['model']} | {row['plain_step_s']:.3f} | {row['training_audit_ratio']:.3f}x |"
        )
    print(
        f"\nper intercepted call (2,000 relu, (2,8,4,4) channels_last): plain "
        f"{per_call['plain_us']} us; added by dispatch {per_call['dispatch_us_per_call']} us, "
        f"by patch {per_call['patch_us_per_call']} us; "
        f"by the bare modes {per_call['bare_modes_us_per_call']} us"
    )
    if args.out:
        result = {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": 1,
            "repeats": args.repeats,
            "models": rows,
            "training": training,
            "per_call": per_call,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
