"""What the audits' warm-up costs: a whole audit with it against the same audit without it.

    python scripts/bench_warm_up.py --rounds 5 --out reports/warm-up/cost.json

The warm-up (2026-11-28) runs an unaudited forward (or step) in each layout before the audited
ones. Without it is the code before: no warm-up for an inference forward, and for a fake
training step only the optimizer's state made (``Step.prime``). For each case the two are
alternated, ``--rounds`` pairs, and the figure is the median of the pairs' time ratios (with
over without). One thread; remedies not tried (``verify`` off, as in sweeps).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torchvision

from cl_audit.execution.settings import Amp, AuditSettings, TensorMode
from cl_audit.execution.training import BoundStep
from cl_audit.phases.audit_module import audit_module
from cl_audit.report.files import write_text

CASES = {
    "resnet50, eager inference": AuditSettings(),
    "resnet50, fake inference": AuditSettings(tensor_mode=TensorMode.FAKE),
    "resnet50, eager training": AuditSettings(train=True),
    "resnet50, fake CUDA training fp16": AuditSettings(
        tensor_mode=TensorMode.FAKE, device="cuda", train=True, amp=Amp.FP16
    ),
}


def _before(self: BoundStep) -> None:
    """The warm-up as it was before: whole steps when training eagerly, the optimizer's state
    alone for a fake step, nothing for an inference forward."""
    if not self.step.plan.workload.train:
        return
    if self._primed:
        self.step.prime()
    else:
        self.run(None)


@contextlib.contextmanager
def _without_warm_up() -> Iterator[None]:
    kept = BoundStep.warm_up
    BoundStep.warm_up = _before  # type: ignore[method-assign]
    try:
        yield
    finally:
        BoundStep.warm_up = kept  # type: ignore[method-assign]


def _seconds(settings: AuditSettings, warm: bool) -> float:
    model = torchvision.models.resnet50()
    example = (torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0)),)
    context = contextlib.nullcontext() if warm else _without_warm_up()
    with context:
        started = time.perf_counter()
        audit_module(model, example, settings)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for name, settings in CASES.items():
        _seconds(settings, True)  # imports and first-call work out of the rounds
        pairs = []
        for _ in range(args.rounds):
            with_it, without = _seconds(settings, True), _seconds(settings, False)
            pairs.append((with_it, without))
        ratio = statistics.median(a / b for a, b in pairs)
        results[name] = {"pairs_s": pairs, "median_ratio": round(ratio, 3)}
        print(f"{name}: with the warm-up {ratio:.3f}x the audit without it", flush=True)
    document = {"torch": torch.__version__, "rounds": args.rounds, "cases": results}
    write_text(args.out, json.dumps(document, indent=1) + "\n", "--out")


if __name__ == "__main__":
    main()
