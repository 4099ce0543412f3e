"""The backward run node by node (``cl_audit.fake.backward``), checked against torch's own
autograd engine on fake CPU tensors, where both can run: the same operations, in the same
layouts and dtypes, and the same gradients; then on fake CUDA tensors, where only it can."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torchvision
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch_checks import needs_fake_cuda, needs_node_by_node

from cl_audit.errors import UsageError
from cl_audit.fake.backward import recording_hooks, run_backward
from cl_audit.fake.mode import fake_tensor, new_fake_mode

pytestmark = needs_node_by_node


class _Operations(TorchDispatchMode):
    """Every operation with its outputs' shapes, strides and dtypes (metadata reads aside)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[tuple[str, tuple]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if func.namespace != "prim":
            outputs = result if isinstance(result, (list, tuple)) else [result]
            meta = tuple(
                (tuple(t.shape), t.stride(), t.dtype)
                for t in outputs
                if isinstance(t, torch.Tensor)
            )
            self.seen[(str(func), meta)] += 1
        return result


class _Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        return x * scale

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.contiguous() * 2, None


class _Mixed(nn.Module):
    """What a backward meets beside layers: a parameter used twice, a broadcast bias, a
    custom Function with a non-tensor argument, a hooked activation, a cast."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.scale = nn.Parameter(torch.ones(1, 8, 1, 1))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x) * self.scale + self.scale
        y = _Doubled.apply(y, 2.0)
        y.register_hook(lambda grad: grad * 1)
        return self.head(y.double().mean(dim=(2, 3)).float())


def _step(model: nn.Module, engine: str, device: str = "cpu") -> tuple[Counter, dict]:
    """One forward and backward of ``model`` (channels_last) on fake tensors of ``device``."""
    model = model.to(memory_format=torch.channels_last).train()
    mode = new_fake_mode()
    target = torch.device(device)
    params = {
        n: fake_tensor(mode, p.detach(), target).requires_grad_(True)
        for n, p in model.named_parameters()
    }
    buffers = {n: fake_tensor(mode, b, target) for n, b in model.named_buffers()}
    x = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    seen = _Operations()
    with mode, seen:
        with recording_hooks() as hooks:
            inputs = (fake_tensor(mode, x, target),)
            out = torch.func.functional_call(model, {**params, **buffers}, inputs)
            loss = out.float().sum()
        before = Counter(seen.seen)
        if engine == "torch":
            loss.backward()
        else:
            run_backward(loss, hooks=hooks)
    grads = {n: (p.grad.stride(), p.grad.dtype) for n, p in params.items() if p.grad is not None}
    return seen.seen - before, grads


@pytest.mark.parametrize(
    "build",
    [torchvision.models.resnet18, torchvision.models.mobilenet_v3_small, _Mixed],
    ids=["resnet18", "mobilenet_v3_small", "mixed"],
)
def test_the_backward_runs_the_operations_torchs_engine_runs(build):
    """On fake CPU tensors both engines run: the same backward operations (each with its
    outputs' layouts and dtypes) and the same gradients, parameter by parameter."""
    torch.manual_seed(0)
    model = build()
    ours, our_grads = _step(model, "node-by-node")
    theirs, their_grads = _step(model, "torch")
    assert ours == theirs
    assert our_grads == their_grads and len(our_grads) == len(list(model.parameters()))


def test_a_gradient_that_breaks_the_layout_contract_is_copied_to_the_parameters_strides():
    """AccumulateGrad's contract: a channels_last weight whose gradient comes back NCHW gets a
    copy in its own strides (as torch's engine makes it); one whose gradient matches keeps it
    without a copy (the control)."""

    def copies(weight_format: torch.memory_format) -> tuple[int, tuple[int, ...]]:
        mode = new_fake_mode()
        with mode:
            w = torch.empty(4, 3, 3, 3).to(memory_format=weight_format).requires_grad_(True)
            x = torch.empty(2, 3, 8, 8)  # NCHW input: the weight's gradient comes back NCHW
            seen = _Operations()
            loss = torch.nn.functional.conv2d(x, w.contiguous()).sum()
            with seen:
                run_backward(loss)
        made = sum(n for (op, _), n in seen.seen.items() if op == "aten.copy_.default")
        return made, w.grad.stride()

    assert copies(torch.channels_last) == (1, (27, 1, 9, 3))
    assert copies(torch.contiguous_format) == (0, (27, 9, 3, 1))


def test_a_module_backward_hook_is_refused_naming_it():
    model = nn.Sequential(nn.Conv2d(3, 4, 3))
    model.register_full_backward_hook(lambda module, grad_in, grad_out: None)
    mode = new_fake_mode()
    with mode:
        x = torch.empty(2, 3, 8, 8, requires_grad=True)
        loss = model(x).sum()
        with pytest.raises(UsageError, match="BackwardHookFunctionBackward: a module backward"):
            run_backward(loss)
    assert model(torch.randn(2, 3, 8, 8)).sum().backward() is None  # torch's engine runs it


@needs_fake_cuda
def test_the_backward_runs_on_fake_cuda_tensors_where_torchs_engine_cannot():
    """The point of it: without a GPU, torch's engine asks CUDA for its streams and fails; node
    by node, a CUDA convolution's gradients come back with the layouts of a CUDA backward."""
    ours, grads = _step(torchvision.models.resnet18(), "node-by-node", "cuda")
    assert grads["conv1.weight"] == ((147, 1, 21, 3), torch.float32)
    assert any(op == "aten.convolution_backward.default" for op, _ in ours)
    with pytest.raises(RuntimeError):
        _step(torchvision.models.resnet18(), "torch", "cuda")


@pytest.mark.parametrize(
    "call",
    [lambda x: torch.nn.functional.group_norm(x, 2), lambda x: x, lambda x: x * 2],
    ids=["group_norm (a node of three outputs)", "the leaf itself", "mul (the control)"],
)
def test_a_gradient_given_to_any_output_reaches_the_input_as_torchs_engine_passes_it(call):
    """``backward(gradient)`` from the first output of a node with several (group norm's
    node also takes the mean's and rstd's gradients) and from a leaf (no node: its
    AccumulateGrad): the gradient reaching the input, as torch's engine hands it over."""

    def reached(engine: str) -> tuple[int, ...]:
        with new_fake_mode():
            x = torch.empty(2, 6, 5, 3).to(memory_format=torch.channels_last).requires_grad_()
            seen: list[torch.Tensor] = []
            x.register_hook(seen.append)
            out = call(x)
            gradient = torch.empty(out.shape).to(memory_format=torch.channels_last)
            if engine == "torch":
                out.backward(gradient)
            else:
                run_backward(out, gradient=gradient)
            return seen[0].stride()

    assert reached("node-by-node") == reached("torch")
