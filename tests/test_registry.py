"""The operator registry (issue #65): what cl-audit knows of each operator declared once and
read by the rule, the ledger and the speed model; a user's own ``torch.library`` operator
declared there changes what an audit reads of it, and only while it is declared. (No
``from __future__ import annotations``: torch 2.4's ``custom_op`` reads the annotations as
types, not strings.)"""

import contextlib

import pytest
import torch
from torch import nn

from cl_audit import OpClass, register_operator
from cl_audit.enums import SpeedClass, TensorMode
from cl_audit.execution.settings import AuditSettings
from cl_audit.intercept.naming import is_copy
from cl_audit.phases.audit_module import audit_module
from cl_audit.phases.timed import profiled_class
from cl_audit.predict.speed_model import speed_kind
from cl_audit.registry import lookup, names_in, registered, unregister_operator
from cl_audit.rule.conversions import is_copy_op


@torch.library.custom_op("cl_audit_tests::blend", mutates_args=())
def blend(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Half of each: elementwise, reading both inputs in their own strides."""
    return x * 0.5 + y * 0.5


@blend.register_fake
def _(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("cl_audit_tests::project", mutates_args=())
def project(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A matrix product the speed model cannot know from its name."""
    return a @ b


@project.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[1])


class CustomOps(nn.Module):
    """A channels_last map blended with a fresh NCHW mask by a custom op, pooled, projected by
    another custom op."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Parameter(torch.randn(8, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = blend(x, torch.ones(x.shape))
        return project(x.mean((2, 3)), self.head)


def _audit(mode: TensorMode, declared: bool):
    with contextlib.ExitStack() as stack:
        if declared:
            blended = "cl_audit_tests::blend"
            stack.enter_context(registered(blended, OpClass.POINTWISE, priced_like="aten::add"))
            product = registered(torch.ops.cl_audit_tests.project, OpClass.MATRIX_PRODUCT)
            stack.enter_context(product)
        torch.manual_seed(0)
        settings = AuditSettings(tensor_mode=mode, verify=False)
        return audit_module(CustomOps(), (torch.randn(2, 3, 16, 16),), settings)


@pytest.mark.parametrize("mode", [TensorMode.EAGER, TensorMode.FAKE])
def test_a_declared_custom_op_is_read_as_declared_by_the_ledger_and_the_speed_model(mode):
    """Declared pointwise and priced like an addition, the blend of a channels_last map and an
    NCHW mask is listed as strided reads (undeclared: a kernel of unknown kind, nothing
    listed) and priced from the addition's samples; declared a matrix product, the projection
    is priced as one (undeclared: each a stand-in, reported as such). The control: the same
    audit without the declarations."""
    plain, declared = _audit(mode, False), _audit(mode, True)
    assert plain.cost.mixed == ()
    (mixed,) = declared.cost.mixed
    assert mixed.op == "torch.ops.cl_audit_tests.blend" and mixed.bytes_read == 2 * 8 * 16 * 16 * 4
    assert set(plain.speed.stand_ins) == {"cl_audit_tests.blend", "cl_audit_tests.project"}
    assert declared.speed.stand_ins == ()
    assert declared.speed.channels_last.ms != plain.speed.channels_last.ms
    assert lookup("cl_audit_tests.blend") is None  # the declarations went with the block


def test_priced_like_takes_another_operators_samples_and_classes_follow_the_declaration():
    op = torch.ops.cl_audit_tests.blend.default
    assert speed_kind(op)[1:3] == (SpeedClass.OTHER, "cl_audit_tests.blend")  # undeclared
    with registered(op, OpClass.POINTWISE, priced_like="aten::mul"):
        _, cls, name, dense = speed_kind(op)
        assert (cls, name, dense) == (SpeedClass.ELEMENTWISE, "aten::mul", True)
    with registered("cl_audit_tests::blend", OpClass.CONVOLUTION):
        assert speed_kind(op)[1] is SpeedClass.CONV_FORWARD


def test_a_copy_declared_is_a_pure_copy_to_the_rule_until_it_is_forgotten():
    op = torch.ops.cl_audit_tests.blend.default
    assert not is_copy(op, None)  # cached per operator...
    register_operator("cl_audit_tests::blend", OpClass.COPY)
    try:
        assert is_copy(op, None) and is_copy_op("cl_audit_tests.blend", None)  # ...cleared
        assert "cl_audit_tests.blend" in names_in(OpClass.COPY)
    finally:
        unregister_operator(op)
    assert not is_copy(op, None)


def test_the_built_in_declarations_hold_what_the_parts_read():
    """The sets each part kept of its own, now one table: the rule's copies, the ledger's
    strided and metadata reads, the speed model's products and norms, the profiler's
    convolution kernels and copies."""
    assert is_copy_op("aten.clone", "torch.flatten") and is_copy_op(None, "Tensor.reshape")
    assert not is_copy_op("aten.copy_", None)  # in place: a copy into, not a pure copy
    assert {"aten.cat", "aten.where"} <= names_in(OpClass.STRIDED_READ)
    assert "aten.empty_like" in names_in(OpClass.METADATA_READ)
    assert speed_kind(torch.ops.aten.bmm.default)[1] is SpeedClass.OTHER
    assert speed_kind(torch.ops.aten.native_group_norm.default)[1] is SpeedClass.NORMALISATION
    assert speed_kind(torch.ops.aten.cat.default)[1] is SpeedClass.ELEMENTWISE
    assert speed_kind(torch.ops.aten.index_select.default)[1] is SpeedClass.OTHER
    assert profiled_class("aten::mkldnn_convolution") is SpeedClass.CONV_FORWARD
    assert profiled_class("aten::copy_") is SpeedClass.CONVERSION


def test_a_declaration_needs_classes_or_a_price_and_takes_only_classes():
    with pytest.raises(ValueError, match="classes or priced_like"):
        register_operator("cl_audit_tests::blend")
    with pytest.raises(ValueError, match="not an OpClass"):
        register_operator("cl_audit_tests::blend", "pointwise")  # type: ignore[arg-type]
    assert lookup("cl_audit_tests.blend") is None
