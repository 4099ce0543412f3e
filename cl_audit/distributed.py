"""Channels_last under DistributedDataParallel, checked on this machine (``--ddp``).

Each configuration (the model converted before or after DDP wraps it, with
``gradient_as_bucket_view`` off and on) runs in processes of its own: a gloo process group of
``world_size`` real processes, each building the model, wrapping it, and running one training
step on channels_last input under the profiler. DDP's reducer lays each gradient's bucket view
out with the strides the parameter has when DDP is built (``as_strided(param.sizes(),
param.strides())`` in ``Reducer::initialize_bucket_views``), and warns once per process where a
gradient's strides differ ("Grad strides do not match bucket view strides"): a process per
configuration lets each say its own warning.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from cl_audit.convert import input_to_channels_last, to_channels_last
from cl_audit.enums import BucketMatch, Stage, WrapOrder
from cl_audit.errors import ModelFailedError, UsageError, first_line
from cl_audit.plan import plan_run
from cl_audit.report.ddp import BucketParameter, DdpCheck, DdpRun, bucket_match
from cl_audit.settings import AuditSettings
from cl_audit.sources import ModelRef, load_model
from cl_audit.sources.audit import prepare
from cl_audit.timing import Profiler, copied_bytes
from cl_audit.training import training_loss

__all__ = ["ddp_check"]

_BACKEND = "gloo"
_TIMEOUT = datetime.timedelta(seconds=300)  # a rank that never reaches the collective
_WORST = (BucketMatch.MISMATCHED, BucketMatch.AMBIGUOUS, BucketMatch.MATCHES)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parameters(module: torch.nn.Module, bucket: dict[str, tuple[int, ...]]) -> list[dict]:
    rows = []
    for name, p in module.named_parameters():
        if p.dim() not in (4, 5):
            continue
        shape, strides = tuple(p.shape), tuple(p.stride())
        grad = None if p.grad is None else tuple(p.grad.stride())
        matches = [bucket_match(shape, strides, bucket[name])]
        if grad is not None:
            matches.append(bucket_match(shape, grad, bucket[name]))
        worst = next(m for m in _WORST if m in matches)
        rows.append(
            {
                "name": name,
                "shape": shape,
                "strides": strides,
                "bucket_strides": bucket[name],
                "grad_strides": grad,
                "match": worst.value,
            }
        )
    return rows


def _rank(
    rank: int,
    world_size: int,
    port: int,
    ref: ModelRef,
    settings: AuditSettings,
    order: WrapOrder,
    bucket_view: bool,
    out: str,
) -> None:
    """One rank's step, in a process of its own (``python -m cl_audit.distributed RANK OUT``):
    its findings, or its error's first line, written to ``out/rank<N>.json``."""
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world_size))
    dist.init_process_group(
        _BACKEND,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=_TIMEOUT,
    )
    result: dict[str, Any]
    try:
        plan = plan_run(settings)
        loaded = load_model(ref)
        module, example = prepare(loaded, plan)
        module.train()
        if order is WrapOrder.BEFORE:
            to_channels_last(module)
        ddp = DistributedDataParallel(module, gradient_as_bucket_view=bucket_view)
        bucket = {name: tuple(p.stride()) for name, p in module.named_parameters()}
        if order is WrapOrder.AFTER:
            to_channels_last(module)
        example = example.map(input_to_channels_last)
        loss = loaded.loss or (lambda output: training_loss(output, settings.seed))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Profiler(torch.device("cpu"), shapes=True) as profiler:
                with plan.autocast():
                    value = loss(ddp(*example.args, **example.kwargs))
                value.backward()
        said = [str(w.message) for w in caught if "bucket view" in str(w.message)]
        result = {
            "warning": said[0].splitlines()[0] if said else None,
            "copied": copied_bytes(profiler),
            "parameters": _parameters(module, bucket),
        }
    except Exception as e:  # the parent says which rank and configuration failed
        result = {"error": first_line(e)}
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def _configuration(
    ref: ModelRef, settings: AuditSettings, world_size: int, order: WrapOrder, bucket_view: bool
) -> tuple[DdpRun, bool]:
    """One configuration's run (rank 0's), and whether every rank found the same strides."""
    where = f"under DDP ({order.value} wrapping, gradient_as_bucket_view={bucket_view})"
    with tempfile.TemporaryDirectory(prefix="cl-audit-ddp-") as out:
        args = (world_size, _free_port(), ref, settings, order, bucket_view, out)
        Path(out, "args.pickle").write_bytes(pickle.dumps(args))
        ranks = [
            subprocess.Popen(
                [sys.executable, "-m", "cl_audit.distributed", str(rank), out],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(world_size)
        ]
        errors = [rank.communicate()[1] if rank.wait() else "" for rank in ranks]
        for r, (rank, error) in enumerate(zip(ranks, errors, strict=True)):
            if rank.returncode:
                last = (error.strip().splitlines() or ["no message"])[-1]
                cause = RuntimeError(f"rank {r} {where} exited {rank.returncode}: {last}")
                raise ModelFailedError(Stage.SETUP, ref.key, cause)
        found = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world_size)]
    for r, result in enumerate(found):
        if "error" in result:
            cause = RuntimeError(f"rank {r} {where}: {result['error']}")
            raise ModelFailedError(Stage.SETUP, ref.key, cause)
    agree = all(result["parameters"] == found[0]["parameters"] for result in found)
    first = found[0]
    parameters = tuple(
        BucketParameter(
            p["name"],
            tuple(p["shape"]),
            tuple(p["strides"]),
            tuple(p["bucket_strides"]),
            None if p["grad_strides"] is None else tuple(p["grad_strides"]),
            BucketMatch(p["match"]),
        )
        for p in first["parameters"]
    )
    run = DdpRun(order, bucket_view, first["warning"], first["copied"], parameters)
    return run, agree


def ddp_check(ref: ModelRef, settings: AuditSettings, world_size: int = 2) -> DdpCheck:
    """The model's training step under DDP in each configuration, on ``world_size`` gloo
    processes on this CPU; ``UsageError`` where this torch has no gloo."""
    if not dist.is_available() or not dist.is_gloo_available():
        raise UsageError(
            f"--ddp needs torch.distributed's gloo, which torch {torch.__version__} lacks"
        )
    if torch.device(settings.device).type != "cpu":
        raise UsageError("--ddp runs DDP on gloo processes on this CPU: drop --device")
    found = [
        _configuration(ref, settings, world_size, order, bucket_view)
        for order in WrapOrder
        for bucket_view in (False, True)
    ]
    return DdpCheck(
        world_size, _BACKEND, tuple(run for run, _ in found), all(agree for _, agree in found)
    )


if __name__ == "__main__":  # a rank: python -m cl_audit.distributed RANK OUT
    _out = sys.argv[2]
    _args = pickle.loads(Path(_out, "args.pickle").read_bytes())
    _rank(int(sys.argv[1]), *_args)
