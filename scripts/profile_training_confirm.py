"""Where an eager training audit of a sweep (a confirming job: what a CPU training sweep runs for
every model) spends its wall time, per part, for a few timm models.

Each part is timed by wrapping the function that does it (``time.perf_counter``, one thread as
in a sweep worker): the build, each of the four training steps (the channels_last warm-up, the
audited channels_last step, the NCHW warm-up, the audited NCHW step: a warm-up is a plain step,
so audited / warm-up is the audit's overhead on a step), the profiler's event processing, the
measured-copy attribution, the report, and the fake pass of the same model for comparison.

    python scripts/profile_training_confirm.py --out reports/profile-training-confirm.json
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import cl_audit.phases.audit_module as run_module
import cl_audit.sweep.worker as worker_module
from cl_audit.enums import TensorMode
from cl_audit.execution.settings import AuditSettings
from cl_audit.execution.training import Step
from cl_audit.report import ModelSource
from cl_audit.sources import ModelRef
from cl_audit.sweep.worker import Job, SweepSettings, audit_job

MODELS = (
    "resnet50",
    "mobilenetv3_large_100",
    "convnext_tiny",
    "efficientnet_b0",
    "vit_small_patch16_224",
)


def _timed(parts: dict[str, list[float]], name: str, function: Callable[..., Any]) -> Any:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            parts[name].append(time.perf_counter() - start)

    return wrapper


def profile(name: str, fake: bool) -> dict[str, Any]:
    parts: dict[str, list[float]] = defaultdict(list)
    saved = (Step.run, worker_module.load_model, run_module.copies_by_call)
    saved_exit = run_module.Profiler.__exit__
    saved_compare = run_module.compare_ledgers
    try:
        Step.run = _timed(parts, "step", Step.run)  # type: ignore[method-assign]
        worker_module.load_model = _timed(parts, "build", worker_module.load_model)
        run_module.copies_by_call = _timed(parts, "measured copies", run_module.copies_by_call)
        run_module.Profiler.__exit__ = _timed(parts, "profiler events", saved_exit)  # type: ignore[method-assign]
        run_module.compare_ledgers = _timed(parts, "compare ledgers", saved_compare)
        audit = AuditSettings(
            train=True,
            tensor_mode=TensorMode.FAKE if fake else TensorMode.EAGER,
        )
        job = Job(ModelRef(ModelSource.TIMM, name), SweepSettings(audit=audit), confirming=not fake)
        start = time.perf_counter()
        row = audit_job(job)
        total = time.perf_counter() - start
    finally:
        Step.run, worker_module.load_model, run_module.copies_by_call = saved
        run_module.Profiler.__exit__ = saved_exit  # type: ignore[method-assign]
        run_module.compare_ledgers = saved_compare
    steps = parts.pop("step", [])
    named = dict(
        zip(("cl warm-up", "cl audited", "nchw warm-up", "nchw audited"), steps, strict=False)
    )
    result = {k: round(v, 3) for k, v in named.items()}
    result.update({k: round(sum(v), 3) for k, v in parts.items()})
    result["total"] = round(total, 3)
    result["other"] = round(total - sum(v for k, v in result.items() if k != "total"), 3)
    result["status"] = row.status.value
    result["verdict"] = row.verdict.value if row.verdict else None
    result["input_shape"] = list(row.input_shape or ())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("models", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for name in args.models:
        results[name] = {"eager": profile(name, fake=False), "fake": profile(name, fake=True)}
        print(name, json.dumps(results[name]), flush=True)
    if args.out:
        document = {
            "measured": __doc__.split("\n\n")[1].replace("\n", " "),
            "torch": torch.__version__,
            "models": results,
        }
        args.out.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
