"""What the host spends per operation beyond its kernel, by kind, measured on this machine.

Each kind is timed on operations of 8 elements, whose kernels take next to nothing, so that
what is left is the host's: Python and a module's call, dispatch, autograd's record and its
engine, the launch. A deep stack of one-operation modules (``depth``) timed under no gradient
(``forward``) and with autograd recording (``forward_grad``), then its backward alone, run
again on a graph kept for it, per node (``backward``: timed itself, never the difference of two
noisy timings, which a loaded machine can make negative); an SGD step with momentum over
``depth`` parameters, per aten operation it dispatches (``optimizer``); a chain of views
without and with autograd (``view``, ``view_grad``); and a value read back from the device
(``sync``: on a GPU a round trip, on the CPU a read). On CUDA the host's own time is read
without waiting for the device (``Clock.host_us``): tiny kernels finish before the host issues
the next."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cl_audit.compat.modes import TorchDispatchMode
from cl_audit.features.table.clock import Clock

__all__ = ["HOST_BASIS", "measure_host"]

HOST_BASIS = (
    "measured by cl-audit table: per operation of a deep stack of one-operation modules on "
    "8-element tensors (forward without and with autograd, backward per node), per aten "
    "operation of an SGD step, per view, per value read back"
)


class _One(nn.Module):
    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class _Count(TorchDispatchMode):
    """Counts the aten operations dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


def measure_host(
    clock: Clock,
    device: str,
    op: Callable[[torch.Tensor], torch.Tensor] = torch.relu,
    depth: int = 64,
    repeats: int = 5,
) -> dict[str, float]:
    """Microseconds per operation of each kind (see the module docstring), each the median
    of ``repeats`` timings; ``op`` is the operation each module runs."""
    stack = nn.Sequential(*(_One(op) for _ in range(depth))).to(device)
    x = torch.ones(8, device=device)
    leaf = torch.ones(8, device=device, requires_grad=True)

    def forward() -> None:
        with torch.no_grad():
            stack(x)

    def forward_grad() -> None:
        stack(leaf)

    graph = stack(leaf).sum()  # kept (retain_graph): each timing runs its backward alone

    def backward() -> None:
        graph.backward(retain_graph=True)

    params = [torch.ones(8, device=device, requires_grad=True) for _ in range(depth)]
    for p in params:
        p.grad = torch.ones_like(p)
    sgd = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    sgd.step()  # the momentum buffers made: the steady state
    with _Count() as counted:
        sgd.step()
    optimizer_ops = max(counted.calls, 1)

    def views(base: torch.Tensor) -> Callable[[], None]:
        def chain() -> None:
            y = base
            for _ in range(depth // 2):
                y = y.view(2, 4).view(8)

        return chain

    def view() -> None:
        with torch.no_grad():
            views(x)()

    scalar = torch.ones((), device=device)

    def sync() -> None:
        for _ in range(depth):
            scalar.item()

    calls = {
        "forward": forward,
        "forward_grad": forward_grad,
        "backward": backward,
        "optimizer": sgd.step,
        "view": view,
        "view_grad": views(leaf),
        "sync": sync,
    }
    for call in calls.values():
        for _ in range(3):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(repeats):
        for name in calls if r % 2 == 0 else reversed(list(calls)):
            times[name].append(clock.host_us(calls[name], 10))
    us = {name: statistics.median(ts) for name, ts in times.items()}
    per_module = {k: us[k] / depth for k in ("forward", "forward_grad", "backward")}
    return {
        "forward": round(per_module["forward"], 3),
        "forward_grad": round(per_module["forward_grad"], 3),
        "backward": round(per_module["backward"], 3),
        "optimizer": round(us["optimizer"] / optimizer_ops, 3),
        "view": round(us["view"] / depth, 3),
        "view_grad": round(us["view_grad"] / depth, 3),
        "sync": round(us["sync"] / depth, 3),
    }
