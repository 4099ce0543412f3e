"""The models a table is made for (``cl-audit table --for``): a fake run of each lists the
convolutions and the operations it executes, so that those exact configurations are measured
before the general grid, and the model's own layers are looked up, not interpolated."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cl_audit.enums import TensorMode
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.execution.plan import plan_run
from cl_audit.execution.settings import AuditSettings
from cl_audit.phases.audit_module import operations
from cl_audit.predict.speed_table import ConvCall
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.source_audit import prepare

__all__ = ["Target", "target"]


@dataclass(frozen=True)
class Target:
    """One model's convolutions (largest work first) and its maps: the 4-D input shapes of
    the operations the table prices from its samples, by operation (most elements first)."""

    name: str
    convolutions: tuple[ConvCall, ...]
    maps: tuple[tuple[str, tuple[int, ...]], ...]


def target(
    ref: ModelRef,
    device: str,
    batch_size: int | None,
    input_size: tuple[int, ...] | None,
    train: bool,
) -> Target:
    """``ref``'s operations in a fake run on ``device`` (inference, or with ``train`` a
    training step) at the batch and input size given (the audit's defaults otherwise)."""
    settings = AuditSettings(
        batch_size=batch_size,
        input_size=input_size,
        device=device,
        tensor_mode=TensorMode.FAKE,
        train=train,
    )
    plan = plan_run(settings)
    loaded = load_model(ref, BuildOptions(input_size=input_size))
    module, example = prepare(loaded, plan)
    try:
        runs = operations(module, example, plan)
    except ModelFailedError as e:
        raise UsageError(f"--for {ref.name}: {e}") from None
    convs = {call for ledger in runs for call, _, _ in ledger.times.convolutions()}
    maps = {key for ledger in runs for key in ledger.times.maps() if len(key[1]) == 4}
    return Target(
        loaded.name,
        tuple(sorted(convs, key=lambda c: -c.flops)),
        tuple(sorted(maps, key=lambda m: -math.prod(m[1]))),
    )
