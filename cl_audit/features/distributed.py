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

import copy
import datetime
import json
import os
import pickle
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from cl_audit.compat.process_group import fully_shard
from cl_audit.enums import BucketMatch, Stage, WrapOrder
from cl_audit.errors import UsageError, first_line
from cl_audit.execution.convert import input_to_channels_last, to_channels_last
from cl_audit.execution.plan import RunPlan, plan_run
from cl_audit.execution.settings import AuditSettings
from cl_audit.execution.timing import Profiler, copied_bytes
from cl_audit.execution.training import training_loss
from cl_audit.report.distributed_report import (
    BucketParameter,
    DdpCheck,
    DdpRun,
    FsdpCheck,
    FsdpRun,
    ShardedParameter,
    bucket_match,
)
from cl_audit.rule.attribution import model_failed
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.source_audit import prepare

__all__ = ["ddp_check", "fsdp_check"]

_BACKEND = "gloo"
_TIMEOUT = datetime.timedelta(seconds=300)  # a rank that never reaches the collective
_WORST = (BucketMatch.MISMATCHED, BucketMatch.AMBIGUOUS, BucketMatch.MATCHES)


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


def _ddp_step(ref: ModelRef, settings: AuditSettings, order: WrapOrder, bucket_view: bool) -> dict:
    """One rank's training step under DDP in one configuration."""
    plan = plan_run(settings)
    loaded = load_model(ref, BuildOptions(input_size=settings.input_size))
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
    return {
        "warning": said[0].splitlines()[0] if said else None,
        "copied": copied_bytes(profiler),
        "parameters": _parameters(module, bucket),
    }


def _maps(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in module.named_parameters() if p.dim() in (4, 5)}


def _sharded(before: dict[str, tuple], after: dict[str, torch.Tensor]) -> list[dict]:
    """Each parameter's strides before wrapping and as FSDP handed it back."""
    rows = []
    for name, (shape, strides) in before.items():
        back = after.get(name)
        kept = None
        if back is not None and back.shape == shape:
            fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
            kept = back.is_contiguous(memory_format=fmt)
        rows.append(
            {
                "name": name,
                "shape": tuple(shape),
                "strides": strides,
                "unflattened": None if kept is None else tuple(back.stride()),
                "kept": kept,
            }
        )
    return rows


def _fsdp2(ref: ModelRef, settings: AuditSettings, world_size: int) -> dict:
    """FSDP2 on the channels_last model: each parameter it refuses, made contiguous in turn
    (as torchtitan's workaround does) until it wraps, then a training step."""
    shard, why = fully_shard()
    if shard is None:
        return {"api": "fsdp2", "use_orig_params": None, "parameters": [], "error": why}
    from torch.distributed.device_mesh import init_device_mesh

    plan = plan_run(settings)
    loaded = load_model(ref, BuildOptions(input_size=settings.input_size))
    module, example = prepare(loaded, plan)
    to_channels_last(module.train())
    before = {n: (tuple(p.shape), tuple(p.stride())) for n, p in _maps(module).items()}
    mesh = init_device_mesh("cpu", (world_size,))
    given = copy.deepcopy(module)  # a failed fully_shard leaves its mark: each try on a copy
    refused: list[str] = []
    message = None
    for _ in range(len(before) + 1):
        module = copy.deepcopy(given)
        for name in refused:
            p = module.get_parameter(name)
            p.data = p.data.contiguous()
        try:
            shard(module, mesh=mesh)
            break
        except NotImplementedError as e:
            named = [
                n
                for n, p in _maps(module).items()
                if f"param.shape={p.shape} param.stride()={p.stride()}" in str(e)
                and n not in refused
            ]
            if not named:
                raise
            message = message or first_line(e)
            refused.append(named[0])
    example = example.map(input_to_channels_last)
    loss = loaded.loss or (lambda output: training_loss(output, settings.seed))
    loss(module(*example.args, **example.kwargs)).backward()
    rows = _sharded(before, {})  # FSDP2's own parameters are DTensors: no view to read back
    return {
        "api": "fsdp2", "use_orig_params": None, "parameters": rows,
        "refused": refused, "message": message,
    }  # fmt: skip


def _fsdp1(ref: ModelRef, settings: AuditSettings, use_orig_params: bool) -> dict:
    """FSDP1 on the channels_last model, a training step, then its parameters unflattened."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    plan = plan_run(settings)
    loaded = load_model(ref, BuildOptions(input_size=settings.input_size))
    module, example = prepare(loaded, plan)
    to_channels_last(module.train())
    before = {n: (tuple(p.shape), tuple(p.stride())) for n, p in _maps(module).items()}
    wrapped = FullyShardedDataParallel(
        module, device_id=torch.device("cpu"), use_orig_params=use_orig_params
    )
    example = example.map(input_to_channels_last)
    loss = loaded.loss or (lambda output: training_loss(output, settings.seed))
    loss(wrapped(*example.args, **example.kwargs)).backward()
    with FullyShardedDataParallel.summon_full_params(wrapped):
        after = {n: p.detach() for n, p in _maps(module).items()}
        rows = _sharded(before, after)
    return {"api": "fsdp1", "use_orig_params": use_orig_params, "parameters": rows}


def _fsdp_preflight(ref: ModelRef, settings: AuditSettings, world_size: int) -> dict:
    runs = []
    for name, job in (
        ("fsdp2", lambda: _fsdp2(ref, settings, world_size)),
        ("fsdp1", lambda: _fsdp1(ref, settings, False)),
        ("fsdp1", lambda: _fsdp1(ref, settings, True)),
    ):
        try:
            runs.append(job())
        except Exception as e:  # a wrapping that fails is that run's finding
            orig = None if name == "fsdp2" else len(runs) == 2
            error = first_line(e)
            runs.append({"api": name, "use_orig_params": orig, "parameters": [], "error": error})
    return {"runs": runs}


def _rank(job: str, rank: int, out: str) -> None:
    """One rank, in a process of its own (``python -m cl_audit.features.distributed JOB RANK
    OUT``): the job's findings, or its error's first line, written to ``out/rank<N>.json``."""
    world_size, ref, settings, *rest = pickle.loads(Path(out, "args.pickle").read_bytes())
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world_size))
    dist.init_process_group(
        _BACKEND,
        init_method=Path(out, "store").as_uri(),  # a file store: no port to race others for
        rank=rank,
        world_size=world_size,
        timeout=_TIMEOUT,
    )
    result: dict[str, Any]
    try:
        if job == "ddp":
            result = _ddp_step(ref, settings, *rest)
        else:
            result = _fsdp_preflight(ref, settings, world_size)
    except Exception as e:  # the parent says which rank and configuration failed
        result = {"error": first_line(e)}
    written = Path(out, f"rank{rank}.part")  # renamed whole: the parent reads all or nothing
    written.write_text(json.dumps(result))
    written.rename(Path(out, f"rank{rank}.json"))  # before the teardown, which gloo's threads
    dist.destroy_process_group()  # sometimes abort (seen on torch 2.15.0): the result stands


def _ranks(job: str, ref: ModelRef, world_size: int, where: str, args: tuple) -> list[dict]:
    """Each rank's result of ``job`` on ``world_size`` gloo processes; ``ModelFailedError``
    naming the rank and ``where`` when one fails."""
    with tempfile.TemporaryDirectory(prefix="cl-audit-distributed-") as out:
        Path(out, "args.pickle").write_bytes(pickle.dumps((world_size, *args)))
        ranks = [
            subprocess.Popen(
                [sys.executable, "-m", "cl_audit.features.distributed", job, str(rank), out],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(world_size)
        ]
        errors = [rank.communicate()[1] for rank in ranks]
        for r, (rank, error) in enumerate(zip(ranks, errors, strict=True)):
            if not Path(out, f"rank{r}.json").exists():  # a result written is whole: a crash
                last = (error.strip().splitlines() or ["no message"])[-1]  # after it is not
                cause = RuntimeError(f"rank {r} {where} exited {rank.returncode}: {last}")
                raise model_failed(Stage.SETUP, ref.key, cause)
        found = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world_size)]
    for r, result in enumerate(found):
        if "error" in result:
            cause = RuntimeError(f"rank {r} {where}: {result['error']}")
            raise model_failed(Stage.SETUP, ref.key, cause)
    return found


def _configuration(
    ref: ModelRef, settings: AuditSettings, world_size: int, order: WrapOrder, bucket_view: bool
) -> tuple[DdpRun, bool]:
    """One configuration's run (rank 0's), and whether every rank found the same strides."""
    where = f"under DDP ({order.value} wrapping, gradient_as_bucket_view={bucket_view})"
    found = _ranks("ddp", ref, world_size, where, (ref, settings, order, bucket_view))
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


def fsdp_check(ref: ModelRef, plan: RunPlan, world_size: int = 2) -> FsdpCheck:
    """The FSDP pre-flight of the model made channels_last, on ``world_size`` gloo processes:
    which parameters FSDP2 refuses, and the layouts FSDP1 hands back (rank 0's)."""
    _check_gloo(plan.device, "--fsdp")
    settings = plan.settings
    (first, *_) = _ranks("fsdp", ref, world_size, "under FSDP", (ref, settings))
    runs = tuple(
        FsdpRun(
            run["api"],
            run["use_orig_params"],
            tuple(
                ShardedParameter(
                    p["name"],
                    tuple(p["shape"]),
                    tuple(p["strides"]),
                    None if p["unflattened"] is None else tuple(p["unflattened"]),
                    p["kept"],
                )
                for p in run["parameters"]
            ),
            tuple(run.get("refused", ())),
            run.get("message"),
            run.get("error"),
        )
        for run in first["runs"]
    )
    return FsdpCheck(world_size, _BACKEND, runs)


def _check_gloo(device: torch.device, flag: str) -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        raise UsageError(
            f"{flag} needs torch.distributed's gloo, which torch {torch.__version__} lacks"
        )
    if device.type != "cpu":
        raise UsageError(f"{flag} runs on gloo processes on this CPU: drop `device`")


def ddp_check(ref: ModelRef, plan: RunPlan, world_size: int = 2) -> DdpCheck:
    """The model's training step under DDP in each configuration, on ``world_size`` gloo
    processes on this CPU; ``UsageError`` where this torch has no gloo."""
    _check_gloo(plan.device, "--ddp")
    settings = plan.settings
    found = [
        _configuration(ref, settings, world_size, order, bucket_view)
        for order in WrapOrder
        for bucket_view in (False, True)
    ]
    return DdpCheck(
        world_size, _BACKEND, tuple(run for run, _ in found), all(agree for _, agree in found)
    )


if __name__ == "__main__":  # a rank: python -m cl_audit.features.distributed JOB RANK OUT
    _rank(sys.argv[1], int(sys.argv[2]), sys.argv[3])
