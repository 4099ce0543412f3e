"""What cl-audit knows about each operator, declared in one place and read by the rule (which
operations are pure copies), the cost ledger (which copy, read any strides, read only metadata,
or always copy), the speed model (how each is priced, and the class its time falls in) and the
profiled classes of a measured step.

An operator goes by its dispatcher name, ``aten.clone`` (``torch.ops.aten.clone``'s), or by the
Python-level name the patch engine sees, ``Tensor.reshape``. Operators not declared here are
read from their tags (pointwise, reduction, view) where torch has them, and priced from the
table's samples of their own name.

A user declares their own operator (a ``torch.library`` custom op) the way ``flop_counter``'s
``register_flop_formula`` and fvcore's ``set_op_handle`` do, before the audit::

    from cl_audit.registry import OpClass, register_operator

    register_operator("mylib::blur", OpClass.POINTWISE, priced_like="aten::add")
    register_operator(torch.ops.mylib.mix, OpClass.MATRIX_PRODUCT)

``POINTWISE`` (torch's tag, which a custom op lacks) says the kernel reads inputs of any
strides and converts nothing (a layout mismatch there is strided reads, listed apart, not a
cost) and is as fast in either layout; ``MATRIX_PRODUCT`` prices it as the 1x1 convolution of
its last two inputs' sizes; ``priced_like`` prices it from another operator's samples in the
speed table, scaled by its elements (not a stand-in). The layout its output has is never
declared: the rule reads it from the output's strides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "OpClass",
    "Operator",
    "classes_of",
    "lookup",
    "names_in",
    "on_change",
    "register_operator",
    "registered",
    "unregister_operator",
]


class OpClass(str, Enum):
    """What an operator is, as the parts of cl-audit that read operators need to know."""

    COPY = "copy"  # its only work is to copy its input into a new tensor (the rule's pure copy)
    COPY_INTO = "copy-into"  # an in-place copy into an existing tensor (``copy_``)
    STRIDED_READ = "strided-read"  # reads inputs of any strides, converts nothing
    POINTWISE = "pointwise"  # torch's pointwise tag, for operators without tags: elementwise,
    # reading any strides, converting nothing, and as fast in either layout
    CONCATENATION = "concatenation"  # joins its inputs: its time is an elementwise pass's
    METADATA_READ = "metadata-read"  # reads only its inputs' shape, dtype and device
    ALWAYS_COPIES = "always-copies"  # its kernel copies its input whatever its order
    VIEW = "view"  # no kernel: a new view of its input
    SYNC = "sync"  # the host waits for the device (a value read back, a data-dependent size)
    CONVOLUTION = "convolution"  # forward (and the kernels a convolution runs inside)
    CONVOLUTION_BACKWARD = "convolution-backward"  # both gradients in one operator
    MATRIX_PRODUCT = "matrix-product"  # priced as the 1x1 convolution of the same sizes
    ATTENTION = "attention"  # fused attention, priced as its products
    ATTENTION_BACKWARD = "attention-backward"
    NORMALISATION = "normalisation"  # batch, group, layer and RMS norms and their backwards


@dataclass(frozen=True)
class Operator:
    """An operator's declared classes, and the operator whose table samples price it (None:
    its own, or as its classes say)."""

    name: str
    classes: frozenset[OpClass]
    priced_like: str | None = None
    user: bool = False  # declared by ``register_operator``


def _declare(cls: OpClass, names: str) -> dict[str, frozenset[OpClass]]:
    return {name: frozenset({cls}) for name in names.split()}


_PYTHON_COPIES = (
    "Tensor.contiguous Tensor.clone torch.clone Tensor.to Tensor.type Tensor.float "
    "Tensor.double Tensor.half Tensor.bfloat16 Tensor.cpu Tensor.cuda Tensor.reshape "
    "torch.reshape Tensor.reshape_as Tensor.flatten torch.flatten Tensor.ravel torch.ravel"
)
# At aten level ``contiguous``, ``reshape`` and ``flatten`` are composites that reach the
# dispatcher as ``clone`` (+ ``_unsafe_view``); they are declared for other tracers.
_ATEN_COPIES = (
    "aten.clone aten.copy aten._to_copy aten._reshape_copy aten.contiguous aten.reshape "
    "aten.flatten aten.ravel"
)
_DECLARED: dict[str, frozenset[OpClass]] = {
    **_declare(OpClass.COPY, f"{_ATEN_COPIES} {_PYTHON_COPIES}"),
    **_declare(OpClass.COPY_INTO, "aten.copy_"),
    # a layout mismatch there is strided reads, as in an elementwise operation
    **_declare(
        OpClass.STRIDED_READ,
        "aten.cat aten.stack aten.index aten.index_select aten.gather aten.constant_pad_nd "
        "aten.slice_scatter aten.select_scatter aten.index_put aten.scatter aten.masked_fill "
        "aten.where aten.expand_copy",
    ),
    # ``x.new_full((n, 1), v)`` of a channels_last map converts nothing
    **_declare(
        OpClass.METADATA_READ,
        "aten.new_empty aten.new_empty_strided aten.new_full aten.new_zeros aten.new_ones "
        "aten.empty_like aten.zeros_like aten.ones_like aten.full_like aten.rand_like "
        "aten.randn_like aten.randint_like",
    ),
    # ``slice_backward`` fills zeros and copies the gradient into the slice: a fake run
    # predicts no conversion there (eagerly the two runs copy alike: dpn68b on the CPU and on
    # an H200); a measured run places the profiler's copies there as at any kernel
    **_declare(OpClass.ALWAYS_COPIES, "aten.slice_backward"),
    # a value read back (``.item()``), an output whose size depends on the data, and
    # GradScaler's unscale, whose inf check ``GradScaler.step`` reads with ``.item()`` (a fake
    # run has no value to read, so the fake scaler skips that read: the unscale stands for it)
    **_declare(
        OpClass.SYNC,
        "aten._local_scalar_dense aten.nonzero aten.masked_select aten._unique2 "
        "aten.unique_consecutive aten.unique_dim aten.equal aten.is_nonzero "
        "aten._amp_foreach_non_finite_check_and_unscale_",
    ),
    # the profiler's names of the kernels a convolution runs inside
    **_declare(
        OpClass.CONVOLUTION,
        "aten.convolution aten.mkldnn_convolution aten.cudnn_convolution aten._convolution "
        "aten._conv_depthwise2d aten._slow_conv2d_forward",
    ),
    **_declare(OpClass.CONVOLUTION_BACKWARD, "aten.convolution_backward"),
    **_declare(
        OpClass.MATRIX_PRODUCT, "aten.mm aten.addmm aten.bmm aten.baddbmm aten._addmm_activation"
    ),
    **_declare(
        OpClass.ATTENTION,
        "aten._scaled_dot_product_efficient_attention aten._scaled_dot_product_flash_attention "
        "aten._scaled_dot_product_cudnn_attention aten._flash_attention_forward "
        "aten._scaled_dot_product_flash_attention_for_cpu aten._efficient_attention_forward",
    ),
    **_declare(
        OpClass.ATTENTION_BACKWARD,
        "aten._scaled_dot_product_efficient_attention_backward "
        "aten._scaled_dot_product_flash_attention_backward "
        "aten._scaled_dot_product_cudnn_attention_backward "
        "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    ),
    **_declare(
        OpClass.NORMALISATION,
        "aten.native_batch_norm aten._native_batch_norm_legit "
        "aten._native_batch_norm_legit_no_training aten._native_batch_norm_legit_functional "
        "aten.cudnn_batch_norm aten.miopen_batch_norm aten._batch_norm_with_update "
        "aten.native_group_norm aten.native_layer_norm aten.native_batch_norm_backward "
        "aten.cudnn_batch_norm_backward aten.batch_norm_backward aten.miopen_batch_norm_backward "
        "aten.native_group_norm_backward aten.native_layer_norm_backward aten._fused_rms_norm "
        "aten._fused_rms_norm_backward",
    ),
}
_DECLARED.update(
    {name: _DECLARED[name] | {OpClass.CONCATENATION} for name in ("aten.cat", "aten.stack")}
)
_BUILT_IN = {name: Operator(name, classes) for name, classes in _DECLARED.items()}
_USER: dict[str, Operator] = {}
_LISTENERS: list[Callable[[], None]] = []


def _name(op: object) -> str:
    """``mylib.blur`` for ``"mylib::blur"``, ``torch.ops.mylib.blur`` or its overload."""
    if isinstance(op, str):
        return op.replace("::", ".", 1) if "::" in op else op
    packet = getattr(op, "overloadpacket", op)
    return str(packet)


def lookup(name: str) -> Operator | None:
    """What is declared of the operator ``name`` (a user's declaration first), or None."""
    return _USER.get(name) or _BUILT_IN.get(name)


def classes_of(name: str) -> frozenset[OpClass]:
    """The classes declared of the operator ``name`` (none where it is not declared)."""
    declared = lookup(name)
    return frozenset() if declared is None else declared.classes


def names_in(cls: OpClass) -> frozenset[str]:
    """The operators declared with ``cls``, built-in and the user's."""
    known = {**_BUILT_IN, **_USER}
    return frozenset(name for name, op in known.items() if cls in op.classes)


def register_operator(op: object, *classes: OpClass, priced_like: str | None = None) -> Operator:
    """Declare ``op`` (``"mylib::blur"``, ``torch.ops.mylib.blur`` or an overload of it) with
    ``classes`` and, optionally, the operator whose speed-table samples price it
    (``"aten::add"``); it replaces what was declared of it before. Takes effect for the audits
    that start after it."""
    if not classes and priced_like is None:
        raise ValueError("register_operator: give the operator's classes or priced_like")
    unknown = [c for c in classes if not isinstance(c, OpClass)]
    if unknown:
        raise ValueError(f"register_operator: not an OpClass: {unknown[0]!r}")
    declared = Operator(_name(op), frozenset(classes), priced_like, user=True)
    _USER[declared.name] = declared
    _changed()
    return declared


def unregister_operator(op: object) -> None:
    """Forget the user's declaration of ``op`` (the built-in one, if any, holds again)."""
    if _USER.pop(_name(op), None) is not None:
        _changed()


@contextmanager
def registered(op: object, *classes: OpClass, priced_like: str | None = None) -> Iterator[Operator]:
    """``register_operator`` for the duration of a ``with`` block; what was declared before
    is put back after."""
    name = _name(op)
    before = _USER.get(name)
    declared = register_operator(op, *classes, priced_like=priced_like)
    try:
        yield declared
    finally:
        if before is None:
            unregister_operator(name)
        else:
            _USER[name] = before
            _changed()


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener`` whenever a declaration changes (a cache of what was read clears)."""
    _LISTENERS.append(listener)


def _changed() -> None:
    for listener in _LISTENERS:
        listener()
