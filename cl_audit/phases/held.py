"""What a what-if run is held to (``cl_audit.phases.verify``): the outputs' difference from
the unchanged model's against ``torch.testing``'s default tolerances, and for a training step
its starting state (parameters, buffers, random draws), put back around every step."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from cl_audit.compat.pytree import tensor_leaves
from cl_audit.execution.plan import RunPlan
from cl_audit.execution.tensors import TensorRun

__all__ = ["ACROSS", "StepState", "held_difference", "over"]

_TOLERANCES = {  # torch.testing.assert_close's defaults: (rtol, atol)
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
# A training step's gradients are sums over the batch and the map, whose rounding grows with
# them: each is held to ``_SUMMED`` times the dtype's rtol of the largest gradient; the step's
# two layouts, unchanged, may differ ``ACROSS`` times that (a dropout's mask drawn in memory
# order differs by the gradients' own size).
_SUMMED = 100
ACROSS = 10


class StepState:
    """A training what-if's starting point: the model's parameters and buffers as the audit left
    them (their values, whatever strides a layout gives them), put back before and after each
    step, and the gradients a step leaves."""

    def __init__(self, run: TensorRun) -> None:
        self.run = run
        with torch.no_grad():
            self.saved = {n: t.detach().clone() for n, t in run.named_tensors().items()}

    def restore(self) -> None:
        with torch.no_grad():
            for name, tensor in self.run.named_tensors().items():
                tensor.copy_(self.saved[name])
        for parameter in self.run.trainable().values():
            parameter.grad = None

    def gradients(self) -> list[torch.Tensor]:
        """The trainable parameters' gradients, by name (zeros where none came)."""
        return [
            torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
            for _, p in sorted(self.run.trainable().items())
        ]

    @staticmethod
    @contextmanager
    def seeded(plan: RunPlan) -> Iterator[None]:
        """The step's random draws the same in every what-if run, the caller's state kept."""
        device = plan.device
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=device.type):
            torch.manual_seed(plan.settings.seed)
            yield


def over(pair: tuple[float, float]) -> float:
    """How far a difference is from its tolerance (over 1: outside)."""
    difference, tolerance = pair
    return difference / tolerance if tolerance else (math.inf if difference else 0.0)


def held_difference(
    output: object, reference: object, dtype: torch.dtype | None = None, step: bool = False
) -> tuple[float, float]:
    """The largest absolute difference of ``output``'s floating-point tensors from
    ``reference``'s and the tolerance it is held to (``atol + rtol * max|reference|``, the
    ``torch.testing`` defaults of the reference's dtype), of the tensor nearest its tolerance;
    NaN where both are NaN counts as equal; ``dtype`` (autocast's) overrides the reference's. A
    training step's output is its loss, held to its own magnitude, and its gradients, each
    held to the largest of them all (a gradient that is zero but for rounding, a bias before a
    normalisation, carries the rounding of the step's magnitudes), ``_SUMMED`` times the rtol,
    when ``step``. ``ValueError`` when the outputs differ in structure or shape."""
    got = [t for t in tensor_leaves(output) if t.is_floating_point()]
    want = [t for t in tensor_leaves(reference) if t.is_floating_point()]
    if [t.shape for t in got] != [t.shape for t in want]:
        raise ValueError("the output's tensors or shapes changed")
    scales = [_largest(b) for b in want]
    if step and len(scales) > 1:  # a training step: its loss, then its gradients
        scales[1:] = [max(scales[1:])] * (len(scales) - 1)
    worst: tuple[float, float] = (0.0, 0.0)
    for index, (a, b, scale) in enumerate(zip(got, want, scales, strict=True)):
        rtol, atol = _TOLERANCES.get(dtype or b.dtype, _TOLERANCES[torch.float32])
        a, b = a.detach().double(), b.detach().double()
        gap = torch.where(a.isnan() & b.isnan(), 0.0, (a - b).abs())
        difference = gap.max().item() if gap.numel() else 0.0
        tolerance = atol + rtol * scale * (_SUMMED if step and index else 1)
        if math.isnan(difference):
            raise ValueError("the output has NaN where the unchanged one has none")
        if worst == (0.0, 0.0) or over((difference, tolerance)) > over(worst):
            worst = (difference, tolerance)
    return worst


def _largest(tensor: torch.Tensor) -> float:
    """The largest magnitude of ``tensor``'s values (NaN read as 0), 0 for an empty one."""
    return tensor.detach().double().nan_to_num().abs().max().item() if tensor.numel() else 0.0
