"""Where the operator index runs its samples: the CPU, a CUDA device, or fake tensors of one
this machine lacks (a prediction)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from cl_audit.compat.cuda import cuda_present
from cl_audit.errors import UsageError
from cl_audit.fake.cuda_probe import fake_cuda_problem
from cl_audit.fake.kernels import KernelSourceMode
from cl_audit.fake.mode import fake_tensor, meta_failures_quiet, new_fake_mode

__all__ = ["CPU", "Target", "target_for"]


@dataclass(frozen=True)
class Target:
    """Where the samples run: ``place`` puts a CPU tensor there (with its strides), and every
    call runs inside ``context()`` (the fake mode and kernel-source overrides of a predicted
    device)."""

    device: str
    predicted: bool = False
    place: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext


CPU = Target("cpu")


def target_for(device: str) -> Target:
    """The CPU; a CUDA device (fake tensors with the kernel-source overrides, a prediction,
    where this machine has no GPU); ``UsageError`` where fake CUDA cannot predict honestly."""
    kind = torch.device(device).type
    if kind == "cpu":
        return CPU
    if kind != "cuda":
        raise UsageError(f"cl-audit ops runs on cpu or cuda, not {device}")
    if cuda_present():
        return Target("cuda", place=lambda t: t.to("cuda"))
    problem = fake_cuda_problem(runtime=False)  # a call reaching the runtime: its row's error
    if problem is not None:
        raise UsageError(problem)
    mode = new_fake_mode()
    kernels = KernelSourceMode.for_device(torch.device("cuda"))

    @contextlib.contextmanager
    def fake_cuda() -> Iterator[None]:
        with meta_failures_quiet(), mode, kernels.over(mode):
            yield

    cuda = torch.device("cuda")
    return Target("cuda", True, lambda t: fake_tensor(mode, t, cuda), fake_cuda)
