"""Tiny modules for the compiled speed (``--compile --time``): a toy whose compiled channels_last
step is slower by construction and its control, a graph break, and a backend whose compile
takes a known time (registered with Dynamo by name, as a user registers one)."""

from __future__ import annotations

import itertools
import time
import types

import torch
from torch import nn
from torch._dynamo import register_backend

SLOW_COMPILE_S = 1.0
PAUSE_S = 0.02  # far beyond the toys' step (well under a millisecond) and the 5% band


@register_backend(name="cl_audit_test_slow_compile")
def slow_compile(gm: torch.fx.GraphModule, example_inputs: list[object]) -> object:
    """A backend that takes ``SLOW_COMPILE_S`` to compile each graph, then runs it as traced."""
    time.sleep(SLOW_COMPILE_S)
    return gm.forward


@torch.compiler.disable
def _pause() -> None:
    """Run outside the graphs (Dynamo breaks the graph here), as any eager code between two."""
    time.sleep(PAUSE_S)


class PausedWhenCompiled(nn.Module):
    """A convolution, and a pause where the step runs compiled with its activation in
    ``paused_in`` (Dynamo graph-breaks at the pause and runs it between the two graphs): eager,
    neither layout pauses; compiled, the one layout does."""

    def __init__(self, paused_in: torch.memory_format) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.paused_in = paused_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if torch.compiler.is_compiling() and y.is_contiguous(memory_format=self.paused_in):
            _pause()
        return y.relu()


class Broken(nn.Module):
    """Two convolutions with a graph break between them (``with_break``), or none."""

    def __init__(self, with_break: bool) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.with_break = with_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x).relu()
        if self.with_break:
            torch._dynamo.graph_break()
        return self.b(y)


_copies = itertools.count()


def fresh(cls: type[nn.Module]) -> type[nn.Module]:
    """``cls`` with a forward of its own code: Dynamo keeps compiled graphs per code object and
    reuses them for an equal model in one process, so a test that counts what a compile makes
    compiles a class no earlier test compiled."""
    forward = cls.forward
    code = forward.__code__.replace(co_name=f"forward_{next(_copies)}")
    own = types.FunctionType(
        code, forward.__globals__, code.co_name, forward.__defaults__, forward.__closure__
    )
    return type(cls.__name__, (cls,), {"forward": own})


def slower_compiled_channels_last() -> tuple[nn.Module, tuple[int, ...]]:
    return PausedWhenCompiled(torch.channels_last), (3, 16, 16)


def slower_compiled_nchw() -> tuple[nn.Module, tuple[int, ...]]:
    """The control: the pause in NCHW, so compiled channels_last is the faster."""
    return PausedWhenCompiled(torch.contiguous_format), (3, 16, 16)


def with_graph_break() -> tuple[nn.Module, tuple[int, ...]]:
    return Broken(True), (3, 16, 16)


def without_graph_break() -> tuple[nn.Module, tuple[int, ...]]:
    return Broken(False), (3, 16, 16)
