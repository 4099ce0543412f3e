"""The torch internals of timing a compiled model (``--compile --time``, ``bench --compile``):
``torch.compile``'s options checked against this torch, the compile of a configuration's own
copy watched (Dynamo's counters, Inductor's layout decision for each graph it lowers), and the
profiler's events of compiled code classed.

Part of the compat package, the one place torch internals are touched.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from cl_audit.enums import CompiledClass

__all__ = [
    "CompileWatch",
    "GraphDecision",
    "compile_options_problem",
    "compiled_graph_calls",
    "compiled_step_classes",
    "recompile_room",
    "watching_compile",
]


def compile_options_problem(mode: str | None, backend: str) -> str | None:
    """Why this torch cannot compile with ``mode`` and ``backend`` (a name torch knows), or
    None."""
    from torch._dynamo import list_backends

    backends = list_backends(exclude_tags=())
    if backend not in backends:
        return f"--compile-backend {backend!r}: torch {torch.__version__} has " + ", ".join(
            sorted(backends)
        )
    if mode is None:
        return None
    if backend != "inductor":
        return f"--compile-mode {mode!r} is Inductor's: drop it, or --compile-backend inductor"
    from torch._inductor import list_mode_options

    modes = sorted(list_mode_options())
    if mode not in modes:
        return f"--compile-mode {mode!r}: torch {torch.__version__} has " + ", ".join(modes)
    return None


@dataclass(frozen=True)
class GraphDecision:
    """Inductor's layout optimisation for one graph it lowered, in compile order: ``phase``
    is ``inference``, ``forward`` or ``backward``."""

    phase: str
    layout_optimization: bool


@dataclass
class CompileWatch:
    """What compiling one configuration did: its wall time, the graphs Inductor lowered with
    their layout decisions (none for a backend other than Inductor), and Dynamo's frames,
    graphs and graph breaks counted meanwhile."""

    seconds: float = 0.0
    decisions: list[GraphDecision] = field(default_factory=list)
    frames: int = 0
    graphs: int = 0
    graph_breaks: int = 0

    def merge(self, other: CompileWatch) -> None:
        """``other``'s compile added to this one's."""
        self.seconds += other.seconds
        self.decisions += other.decisions
        self.frames += other.frames
        self.graphs += other.graphs
        self.graph_breaks += other.graph_breaks


def _counts() -> tuple[int, int, int]:
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    return counters["frames"]["ok"], counters["stats"]["unique_graphs"], breaks


@contextlib.contextmanager
def watching_compile(watch: CompileWatch) -> Iterator[None]:
    """Inside, what compiles is watched into ``watch``: Inductor's decision of each graph it
    lowers (``GraphLowering.decide_layout_opt`` wrapped, put back on exit), with Inductor's and
    AOTAutograd's caches off so that every graph is lowered (a cached graph is not, and would
    have no decision), and Inductor's CPU kernels compiled with profiler ranges (each named
    after its fused operations: the classes of ``compiled_step_classes``); Dynamo's counters
    read before and after (they are torch's, shared, so their differences are used)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config
    from torch._inductor.graph import GraphLowering

    original = GraphLowering.__dict__["decide_layout_opt"]
    decide = original.__func__

    def recorded(gm: torch.fx.GraphModule, *, is_inference: bool) -> bool:
        decision = decide(gm, is_inference=is_inference)
        watch.decisions.append(GraphDecision(_phase(gm, is_inference), bool(decision)))
        return decision

    before = _counts()
    start = time.perf_counter()
    GraphLowering.decide_layout_opt = staticmethod(recorded)
    # its "no CUDA runtime" warning on a machine without one, when Inductor builds a CPU kernel
    extension_log = logging.getLogger("torch.utils.cpp_extension")
    level = extension_log.level
    extension_log.setLevel(logging.ERROR)
    try:
        with (
            config.patch({"fx_graph_cache": False, "cpp.enable_kernel_profile": True}),
            functorch_config.patch(enable_autograd_cache=False),
            recompile_room(),
        ):
            yield
    finally:
        GraphLowering.decide_layout_opt = original
        extension_log.setLevel(level)
        watch.seconds += time.perf_counter() - start
        after = _counts()
        watch.frames += after[0] - before[0]
        watch.graphs += after[1] - before[1]
        watch.graph_breaks += after[2] - before[2]


# Compiles of a code object that Dynamo allows beyond those made already: each configuration is
# a copy of its own, whose guards (its parameters, its input's strides) fail every earlier
# entry of the same forward's code, so a process that audits a model class many times would
# reach Dynamo's limit (8) and run the rest eagerly, which ``compiled_frames`` would then tell.
_RECOMPILES = 64


def recompile_room() -> contextlib.AbstractContextManager[None]:
    """Inside, Dynamo allows ``_RECOMPILES`` more compiles of each code object."""
    from torch._dynamo import config

    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    return config.patch({name: getattr(config, name) + _RECOMPILES})


def _phase(gm: torch.fx.GraphModule, inference: bool) -> str:
    """A graph's phase: AOTAutograd names a backward graph's incoming gradients ``tangents``."""
    if inference:
        return "inference"
    placeholders = (n.target for n in gm.graph.nodes if n.op == "placeholder")
    return "backward" if any(str(t).startswith("tangents") for t in placeholders) else "forward"


_GRAPH_CALL = "## Call CompiledFxGraph"  # Inductor's range around one compiled graph's call
_COPY_OPS = frozenset({"aten::copy_", "aten::clone", "aten::_to_copy", "aten::contiguous"})
# a generated kernel's name: its graph, its kind and its fused operations' names
_KERNEL = re.compile(r"(?:graph_\d+_)?(?:cpp|triton)_\w*?fused_(\w+?)(?:_\d+)?$")
_COPYING = re.compile(r"(?:^|_)(?:clone|copy)(?:_|$)")


def compiled_graph_calls(events: list[Any]) -> int:
    """How many compiled graphs one profiled step called (forward and backward graphs)."""
    return sum(1 for e in events if e.name.startswith(_GRAPH_CALL))


def compiled_step_classes(
    events: list[Any], step_ms: float, device: torch.device
) -> dict[CompiledClass, float]:
    """A profiled compiled step's milliseconds by class: what each compiled graph's call ran
    directly (an aten operation: an extern kernel, or a copy; a generated kernel: fused, or a
    copy where its fused operations include one, its other work riding along), timed on the
    CPU or by the kernels it launched on CUDA; the rest of the ``step_ms`` is the rest."""
    by_class = dict.fromkeys(CompiledClass, 0.0)
    for event in events:
        parent = event.cpu_parent
        if parent is None or not parent.name.startswith(_GRAPH_CALL):
            continue
        klass = _event_class(event, device)
        if klass is None:
            continue
        us = event.device_time_total if device.type == "cuda" else event.cpu_time_total
        by_class[klass] += us / 1e3
    inside = sum(by_class.values())
    by_class[CompiledClass.REST] = max(step_ms - inside, 0.0)
    return by_class


def _event_class(event: Any, device: torch.device) -> CompiledClass | None:
    name: str = event.name
    if name in _COPY_OPS:
        return CompiledClass.COPIES
    if name.startswith("aten::"):
        return CompiledClass.EXTERN
    names = [name] if device.type == "cpu" else [k.name for k in getattr(event, "kernels", ())]
    kernels = [m.group(1) for m in map(_KERNEL.match, names) if m is not None]
    if not kernels:
        return None
    return CompiledClass.COPIES if any(_COPYING.search(k) for k in kernels) else (
        CompiledClass.FUSED
    )  # fmt: skip
