"""What auditing an op-heavy model costs against its plain forward (issue #59's target: 20x).

    python scripts/bench_op_heavy.py --rounds 5 --out reports/op-heavy_torch-2.14.1.json

The model: pytorchcv's SuperPoint (``examples/libraries.py:pytorchcv_superpoint``, random
weights, a 2x1x128x128 input), whose forward loops in Python over its keypoints: many small
operations on small tensors. Each round, back to back: its plain forward (channels_last, eval,
no_grad; the median of ``--forwards`` after one untimed), the same forward under two modes
that pass every call through unchecked (a ``TorchFunctionMode`` and a ``TorchDispatchMode``:
the floor of any audit made of them), and one whole audit as the CLI runs it for one model
(the warm-ups, the audited run in channels_last, the NCHW run, the remedies' what-if runs).
The ratio is the median over rounds of each round's audit over its plain forward (timings on
this machine are noisy: a lone audit varied 11.9 to 17.7 s). One thread. Written whole.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from cl_audit.execution.settings import AuditSettings
from cl_audit.phases.audit_module import audit_module
from cl_audit.report.files import write_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import libraries


class _PassFunctions(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class _PassDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _forward(model: torch.nn.Module, x: torch.Tensor, modes: bool) -> None:
    """One forward, plain or under the two pass-through modes."""
    with torch.no_grad():
        if not modes:
            model(x)
            return
        with _PassFunctions(), _PassDispatch():
            model(x)


def _median_s(call: Callable[[], object], times: int) -> float:
    call()
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        spent.append(time.perf_counter() - started)
    return statistics.median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forwards", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = []
    for _ in range(args.rounds):
        torch.manual_seed(0)
        model, images = libraries.pytorchcv_superpoint()
        model = model.eval().to(memory_format=torch.channels_last)
        x = images.to(memory_format=torch.channels_last)
        forward = _median_s(functools.partial(_forward, model, x, False), args.forwards)
        floor = _median_s(functools.partial(_forward, model, x, True), args.forwards)
        torch.manual_seed(0)
        model, images = libraries.pytorchcv_superpoint()
        started = time.perf_counter()
        report = audit_module(model, (images,), AuditSettings(verify=True), name="superpoint")
        audit = time.perf_counter() - started
        rounds.append(
            {
                "plain_forward_s": round(forward, 4),
                "bare_modes_forward_s": round(floor, 4),
                "audit_s": round(audit, 2),
                "verify_s": report.cost.verify_seconds if report.cost else None,
                "ratio": round(audit / forward, 1),
            }
        )
        print(json.dumps(rounds[-1]), flush=True)
    result = {
        "torch": torch.__version__,
        "model": "pytorchcv_superpoint, 2x1x128x128, one thread",
        "calls_checked": report.summary.calls_checked,
        "rounds": rounds,
        "ratio": statistics.median(r["ratio"] for r in rounds),
        "bare_modes_over_plain": round(
            statistics.median(r["bare_modes_forward_s"] / r["plain_forward_s"] for r in rounds), 2
        ),
    }
    print(json.dumps(result, indent=1))
    write_text(args.out, json.dumps(result, indent=1) + "\n", "--out")


if __name__ == "__main__":
    main()
