"""The user's model leaves an audit as it came in: its train/eval modes, parameters, buffers and
gradients; only the documented in-place memory-format conversion stays."""

from __future__ import annotations

import copy

import pytest
import torch
import torchvision
from torch_checks import needs_node_by_node

import cl_audit
from cl_audit.compat.fake_base import is_fake
from cl_audit.execution.settings import AuditSettings, TensorMode
from cl_audit.phases.audit_module import audit_module


def _resnet18() -> torch.nn.Module:
    return torchvision.models.resnet18(weights=None, num_classes=10)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def _assert_same_values(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    changed = [name for name, t in before.items() if not torch.equal(after[name], t)]
    assert changed == []


def test_a_training_audit_restores_an_eval_models_mode_weights_and_statistics():
    model = _resnet18().eval()
    before = _state(model)
    x = torch.randn(2, 3, 32, 32)
    report = cl_audit.audit_model(model, x, train=True)
    assert report.environment.train and report.environment.optimizer == "sgd"
    assert not any(m.training for m in model.modules())
    _assert_same_values(model, before)  # weights, batch-norm statistics, num_batches_tracked
    assert all(p.grad is None for p in model.parameters())


def test_the_same_step_without_the_restore_changes_the_weights():
    """Control: the audit's training steps do train, so the test above proves the restore."""
    model = _resnet18()
    before = _state(model)
    plain = copy.deepcopy(model).train()
    optimizer = torch.optim.SGD(plain.parameters(), lr=1e-3, momentum=0.9)
    torch.nn.functional.cross_entropy(
        plain(torch.randn(2, 3, 32, 32)), torch.tensor([1, 2])
    ).backward()
    optimizer.step()
    after = plain.state_dict()
    changed = {name for name, t in before.items() if not torch.equal(after[name], t)}
    assert "conv1.weight" in changed and "bn1.running_mean" in changed


def test_an_inference_audit_keeps_each_modules_own_mode():
    model = _resnet18().train()
    model.layer2.eval()  # a mixed model: its modes come back module by module
    modes = {name: m.training for name, m in model.named_modules()}
    cl_audit.audit_model(model, torch.randn(2, 3, 32, 32))
    assert {name: m.training for name, m in model.named_modules()} == modes


def test_gradients_the_model_held_are_given_back():
    model = _resnet18()
    held = {name: torch.full_like(p, 0.5) for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        p.grad = held[name]
    cl_audit.audit_model(model, torch.randn(2, 3, 32, 32), train=True)
    assert all(p.grad is held[name] for name, p in model.named_parameters())


def test_the_memory_format_conversion_stays_as_documented():
    model = _resnet18().eval()
    before = _state(model)
    cl_audit.audit_model(model, torch.randn(2, 3, 32, 32), train=True)
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    _assert_same_values(model, before)


@needs_node_by_node
def test_a_fake_training_audit_leaves_the_model_untouched():
    model = _resnet18().eval()
    before = _state(model)
    settings = AuditSettings(train=True, tensor_mode=TensorMode.FAKE)
    report = audit_module(model, (torch.randn(2, 3, 32, 32),), settings)
    assert report.predicted
    assert not any(m.training for m in model.modules())
    _assert_same_values(model, before)


class PositionalEncoding(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = torch.nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + x


class Block(torch.nn.Module):
    def __init__(self, position: PositionalEncoding) -> None:
        super().__init__()
        self.position = position  # shared with the other blocks and the model
        self.mix = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(self.position(x))


class SharedBlock(torch.nn.Module):
    """One module held by the model and by two blocks (as CoaT shares its convolutional
    position encoding): named_parameters() lists its tensors once, under the model's name."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.position = PositionalEncoding(8)
        self.blocks = torch.nn.ModuleList([Block(self.position), Block(self.position)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return x


def _own_tensors(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    return [
        (m, n, t)
        for m in model.modules()
        for n, t in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False))
    ]


@pytest.mark.parametrize("train", [False, pytest.param(True, marks=needs_node_by_node)])
def test_a_fake_audit_leaves_no_fake_tensor_on_a_shared_module(train):
    model = SharedBlock()
    held = _own_tensors(model)
    settings = AuditSettings(train=train, tensor_mode=TensorMode.FAKE)
    report = audit_module(model, (torch.randn(2, 3, 16, 16),), settings)
    assert report.predicted  # the control: the audit ran and predicted
    assert all(getattr(m, n) is t for m, n, t in held)
    assert not any(is_fake(t) for t in model.state_dict().values())
    model(torch.randn(2, 3, 16, 16))  # the model still runs for real
