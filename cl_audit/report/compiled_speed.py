"""The compiled part of the speed section (``speed.compiled``, report version 16): does
channels_last pay when the model runs under ``torch.compile``? Measured with ``compile`` and
``time``: each layout's copy compiled with the user's options, its compile timed apart, then
timed in the same alternating rounds as the eager step and profiled for one step (the time by
class: Inductor's extern kernels, its fused kernels, copies, the rest). No table holds Inductor's
fused kernels, so a compiled step is never predicted: without ``time``, or in a fake run, the
verdict is unknown and the note says why (never the eager verdict in its place)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import ClassVar

from cl_audit.enums import CompiledClass, SpeedVerdict
from cl_audit.report.codec import JsonForm

__all__ = [
    "CompileOptions", "CompiledClassTime", "CompiledLayout", "CompiledSpeed", "GraphLayout",
    "ratio_text",
]  # fmt: skip


@dataclass(frozen=True)
class CompileOptions:
    """What ``torch.compile`` is given where a compiled model is timed (``compile`` with
    ``time``; ``cl-audit bench --compile``): torch's own ``mode``, ``backend`` and
    ``dynamic``, as the user compiles."""

    mode: str | None = None
    backend: str = "inductor"
    dynamic: bool | None = None

    @property
    def described(self) -> str:
        """``inductor, mode default, dynamic auto``."""
        dynamic = {None: "auto", True: "on", False: "off"}[self.dynamic]
        return f"{self.backend}, mode {self.mode or 'default'}, dynamic {dynamic}"


@dataclass(frozen=True)
class GraphLayout:
    """One graph Inductor lowered, in compile order (``inference``, ``forward`` or
    ``backward``), and whether its layout optimisation was on."""

    phase: str
    layout_optimization: bool


@dataclass(frozen=True)
class CompiledClassTime:
    """One class's milliseconds in each layout's profiled compiled step."""

    compiled_class: CompiledClass
    channels_last_ms: float
    nchw_ms: float

    json_form: ClassVar[JsonForm] = JsonForm(keys={"compiled_class": "class"})


@dataclass(frozen=True)
class CompiledLayout:
    """One layout compiled and timed: each round's milliseconds per step, the compile's
    seconds (the first steps, until one compiled nothing: never in a round), Dynamo's graphs
    and graph breaks while it compiled, the graphs one step calls, each graph Inductor lowered
    with its layout decision, and the profiled step's milliseconds (the classes add up to it)."""

    rounds_ms: tuple[float, ...]
    compile_seconds: float
    graphs: int
    graph_breaks: int
    graph_calls: int
    lowered: tuple[GraphLayout, ...]
    profiled_ms: float

    json_form: ClassVar[JsonForm] = JsonForm(derived=("ms",))

    @property
    def ms(self) -> float:
        """The median round's step."""
        return statistics.median(self.rounds_ms)


@dataclass(frozen=True)
class CompiledSpeed:
    """Whether channels_last pays under ``torch.compile`` (``options``: how it was compiled):
    ``speedup`` is NCHW's compiled step over channels_last's (the median round's ratio, with
    the quartiles ``low`` and ``high``), its verdict within the gate's band as the eager one's;
    ``note`` says why where it is unknown, or what of a measured part is not its own (Dynamo
    reuses an earlier compile's graphs in one process where their guards hold)."""

    verdict: SpeedVerdict
    options: CompileOptions
    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    channels_last: CompiledLayout | None = None
    nchw: CompiledLayout | None = None
    classes: tuple[CompiledClassTime, ...] = ()
    note: str | None = None

    json_form: ClassVar[JsonForm] = JsonForm(derived=("known",))

    @property
    def known(self) -> bool:
        return self.verdict is not SpeedVerdict.UNKNOWN

    def headline(self) -> str:
        """``compiled: 1.05x, faster (measured, rounds 1.03-1.07x)``, or why it is unknown."""
        if not self.known or self.speedup is None:
            return f"compiled: unknown ({self.note})" if self.note else "compiled: unknown"
        return f"compiled: {_ratio(self.speedup, self.verdict, self.low, self.high)}"


def ratio_text(speedup: float, verdict: SpeedVerdict, basis: str) -> str:
    """``1.05x, faster (measured, rounds 1.03-1.07x)``: one verdict of the headline's two."""
    return f"{speedup:.2f}x, {verdict.value} ({basis})"


def _ratio(speedup: float, verdict: SpeedVerdict, low: float | None, high: float | None) -> str:
    spread = f", rounds {low:.2f}-{high:.2f}x" if low is not None and high is not None else ""
    return ratio_text(speedup, verdict, f"measured{spread}")
