"""Steps timed in alternating rounds: each configuration (a strategy, with or without autocast)
on a copy of the model of its own, converted once, so that the caller's model is never touched
and no conversion is timed; warmed until settled, then rounds that alternate between them, the
order rotating every round (``cl-audit bench`` and the audit's measured speed both time here)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from cl_audit.compat.compile_run import CompileWatch, watching_compile
from cl_audit.enums import Amp, Stage, Strategy
from cl_audit.execution.convert import apply_strategy, strategy_input
from cl_audit.execution.inputs import Example
from cl_audit.execution.plan import RunPlan
from cl_audit.execution.settings import CompileOptions
from cl_audit.execution.timing import timed_ms
from cl_audit.execution.training import Step
from cl_audit.report.bench_report import configuration_name
from cl_audit.rule.attribution import model_failed

__all__ = [
    "ROUNDS", "STEPS", "WARMUP", "Configuration", "alternate", "compile_configuration", "configure",
]  # fmt: skip

# The defaults of every timing: alternating rounds, steps timed a round, least warm-up steps.
ROUNDS, STEPS, WARMUP = 7, 3, 3


@dataclass
class Configuration:
    name: str
    strategy: Strategy
    plan: RunPlan
    step: Step
    forward: Callable[[], object]
    model: nn.Module  # the configuration's own copy
    inputs: Example  # its inputs, converted
    watch: CompileWatch | None = None  # compiled (``compile_configuration``): what compiling did

    @property
    def amp(self) -> Amp | None:
        return self.plan.settings.amp


def configure(
    model: nn.Module,
    example: Example,
    base: RunPlan,
    strategy: Strategy,
    amp: bool,
    loss: Callable[[Any], torch.Tensor] | None,
) -> Configuration:
    plan = base.changed(strategy=strategy, amp=base.settings.amp if amp else None)
    name = configuration_name(strategy, plan.settings.amp and plan.settings.amp.value)
    try:
        copied = apply_strategy(copy.deepcopy(model), strategy).train(plan.workload.train)
        converted = example.map(lambda x: strategy_input(x, strategy))
    except Exception as e:
        raise model_failed(Stage.SETUP, name, e) from e
    step = Step(plan, dict(copied.named_parameters()), loss)
    return Configuration(
        name, strategy, plan, step, lambda: converted.call(copied), copied, converted
    )


COMPILE_STEPS = 4  # steps that may compile (a first, and recompiles) before the warm-up at most


def compile_configuration(
    c: Configuration, options: CompileOptions, device: torch.device
) -> Configuration:
    """``c`` with its forward through ``torch.compile`` of its own copy (``options``: the
    user's mode, backend and dynamic), compiled here by its first steps, each watched
    (``watching_compile``), until a step compiles nothing (at most ``COMPILE_STEPS``): their
    time is the compile's, never a round's; ``ModelFailedError`` at the compile stage."""
    name = f"{c.name}+compiled"
    watch = CompileWatch()
    try:
        model = torch.compile(
            c.model, mode=options.mode, backend=options.backend, dynamic=options.dynamic
        )
        compiled = replace(c, name=name, forward=lambda: c.inputs.call(model), watch=watch)
        for index in range(COMPILE_STEPS):
            step = CompileWatch()
            with watching_compile(step):
                timed_ms(lambda: compiled.step.run(compiled.forward, None), device)
            if index and not step.frames and not step.decisions:
                break
            watch.merge(step)
    except Exception as e:
        raise model_failed(Stage.COMPILE, name, e) from e
    return compiled


WARMUP_LIMIT = 30  # warm-up steps per configuration at most, settled or not
SETTLED = 0.10  # the last SETTLE_STEPS warm-up steps within 10% of each other
SETTLE_STEPS = 3


def _warm_up(c: Configuration, least: int, device: torch.device) -> int:
    """At least ``least`` untimed steps, then more until the last ``SETTLE_STEPS`` step times
    lie within ``SETTLED`` of each other (caches, allocator and a loaded machine settle), at
    most ``WARMUP_LIMIT`` in all; how many ran."""
    times: list[float] = []
    while len(times) < WARMUP_LIMIT:
        times.append(timed_ms(lambda: c.step.run(c.forward, None), device))
        last = times[-SETTLE_STEPS:]
        if (
            len(times) >= least
            and len(last) == SETTLE_STEPS
            and max(last) <= min(last) * (1 + SETTLED)
        ):
            break
    return len(times)


def alternate(
    configurations: list[Configuration],
    rounds_: int,
    warmup: int,
    steps: int,
    device: torch.device,
    label: str,
) -> tuple[dict[str, tuple[float, ...]], dict[str, int]]:
    """Warm-up until settled, then rounds that alternate between the configurations (rotating
    the order), ``steps`` timed a round: the rounds' time per step and the warm-up steps of
    each configuration (at least ``warmup``); ``ModelFailedError`` naming the configuration."""
    rounds: dict[str, list[float]] = {c.name: [] for c in configurations}
    warmed: dict[str, int] = {}
    current = configurations[0]
    try:
        for current in configurations:
            warmed[current.name] = _warm_up(current, warmup, device)
        for index in range(rounds_):
            shift = index % len(configurations)
            for current in configurations[shift:] + configurations[:shift]:
                c = current
                total = sum(
                    timed_ms(lambda c=c: c.step.run(c.forward, None), device) for _ in range(steps)
                )
                rounds[c.name].append(total / steps)
    except Exception as e:
        raise model_failed(current.step.stage, f"{label} ({current.name})", e) from e
    return {name: tuple(values) for name, values in rounds.items()}, warmed
