"""The compat package: the one home of torch internals, the fake CUDA probe, the divergence
tables by torch version and device, and the CUDA kernel-source overrides."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch_checks import FAKE_CUDA_PROBLEM, fake_cuda_group_norm_returns_nchw, needs_fake_cuda
from typer.testing import CliRunner

from cl_audit import compat
from cl_audit.cli import app
from cl_audit.compat import fake_base, modes, storage, versions
from cl_audit.compat.versions import TORCH_VERSION
from cl_audit.errors import UsageError
from cl_audit.execution.audit_context import audit
from cl_audit.execution.plan import resolve_device
from cl_audit.execution.settings import AuditSettings, TensorMode
from cl_audit.fake import cuda_probe
from cl_audit.fake import mode as fake_mode
from cl_audit.fake import shortcuts as fake_shortcuts
from cl_audit.fake.kernels import KernelSourceMode
from cl_audit.phases.audit_module import audit_module
from cl_audit.predict.divergences import (
    CUDA_KERNEL_OVERRIDES,
    KernelCopies,
    KernelOverride,
    divergence_table,
    kernel_copy_table,
)

PACKAGE = Path(compat.__file__).parent.parent  # cl_audit
COMPAT = Path(compat.__file__).parent  # cl_audit/compat
PRIVATE = re.compile(
    r"torch\._C\b|\._cdata\b|\._base\b|FakeTensor\(|torch\._amp|_python_dispatch"
    r"|torch\._subclasses|\._apply\(|torch\._dynamo|torch\._inductor|torch\._functorch"
    r"|\.meta\[|nn_module_stack|torch\.testing\._internal|torch\.utils\._pytree"
    r"|torch\.distributed\._composable|\._input_metadata\b|\._sequence_nr\b"
    r"|\._schema\b|\._backward_hooks\b|_dispatch_impl\b|_make_subclass\b|torch\.utils\._"
    r"|torch\.fx\.experimental|BackwardCFunction|_get_dispatch_mode"
)


def test_torch_private_names_appear_in_the_compat_package_only():
    offending = {
        str(path.relative_to(PACKAGE)): sorted(set(PRIVATE.findall(path.read_text())))
        for path in PACKAGE.rglob("*.py")
        if COMPAT not in path.parents and PRIVATE.search(path.read_text())
    }
    assert offending == {}
    modules = sorted(COMPAT.glob("*.py"))
    assert sum(bool(PRIVATE.search(m.read_text())) for m in modules) >= 8  # the scan finds them


def test_torch_version_is_read_from_release_and_local_strings():
    assert versions.torch_version("2.15.0+cu132") == (2, 15)
    assert versions.torch_version("2.4.1") == (2, 4)
    assert versions.torch_version("2.16.0.dev20261201+cpu") == (2, 16)
    with pytest.raises(ValueError):
        versions.torch_version("nightly")


def test_storage_key_is_shared_by_views_and_not_by_copies():
    x = torch.randn(2, 3, 4, 4)
    assert storage.storage_key(x.permute(0, 2, 3, 1)) == storage.storage_key(x)
    assert storage.storage_key(x.clone()) != storage.storage_key(x)
    assert storage.view_base(x[:, :1]) is x and storage.view_base(x) is None


def test_fake_tensors_keep_strides_and_device_and_are_recognised():
    mode = fake_mode.new_fake_mode()
    real = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    fake = fake_mode.fake_tensor(mode, real, torch.device("cpu"))
    assert fake_base.is_fake(fake) and not fake_base.is_fake(real)
    assert fake.stride() == real.stride() and fake.device == real.device


@needs_fake_cuda  # each simulates one failure on a torch that passes the probe
def test_the_probe_refuses_a_build_whose_fake_convolution_returns_nchw(monkeypatch):
    convolution = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda *a, **k: convolution(*a, **k).contiguous())
    problem = cuda_probe.fake_cuda_problem.__wrapped__()
    assert problem is not None and "NCHW output in fake mode" in problem


@needs_fake_cuda  # each simulates one failure on a torch that passes the probe
def test_the_probe_refuses_a_torch_whose_fake_cuda_reaches_the_cuda_runtime(monkeypatch):
    def reaches_cuda(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("CUDA error: CUDA driver version is insufficient\nmore lines")

    monkeypatch.setattr(F, "softmax", reaches_cuda)
    problem = cuda_probe.fake_cuda_problem.__wrapped__()
    assert problem == (
        f"on torch {torch.__version__}, a float16 softmax on fake CUDA tensors fails "
        "(CUDA error: CUDA driver version is insufficient)"
    )


@needs_fake_cuda  # each simulates one failure on a torch that passes the probe
def test_the_probe_refuses_bfloat16_where_fake_cuda_predicts_an_nchw_bf16_convolution(
    monkeypatch,
):
    convolution = F.conv2d

    def nchw_for_bfloat16(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        out = convolution(x, *args, **kwargs)
        return out.contiguous() if x.dtype == torch.bfloat16 else out

    monkeypatch.setattr(F, "conv2d", nchw_for_bfloat16)
    assert cuda_probe.fake_cuda_problem.__wrapped__() is None  # float16 and float32 stay honest
    problem = cuda_probe.fake_cuda_problem.__wrapped__(bfloat16=True)
    assert problem is not None and "predicts an NCHW bfloat16 CUDA convolution" in problem


@needs_fake_cuda
def test_fake_cuda_bfloat16_is_refused_exactly_when_this_torch_predicts_it_wrong():
    refused = cuda_probe.fake_cuda_problem(bfloat16=True) is not None
    result = CliRunner().invoke(app, ["resnet18", "--fake", "--device", "cuda", "--amp", "bf16"])
    assert result.exit_code == (2 if refused else 0), result.output
    if refused:
        assert "predicts an NCHW bfloat16 CUDA convolution" in result.output


@pytest.mark.skipif(FAKE_CUDA_PROBLEM is None, reason="this torch passes the fake CUDA probe")
def test_this_torch_fails_the_probe_and_fake_cuda_is_refused_with_its_reason():
    result = CliRunner().invoke(app, ["resnet18", "--fake", "--device", "cuda"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert FAKE_CUDA_PROBLEM.split(" (")[0] in " ".join(result.output.split())


def test_a_failed_probe_refuses_fake_cuda_with_its_reason_and_exit_2(monkeypatch):
    import cl_audit.execution.plan

    monkeypatch.setattr(
        cl_audit.execution.plan, "fake_cuda_problem", lambda bfloat16=False: "the probe's reason"
    )
    with pytest.raises(UsageError, match="no honest prediction here: the probe's reason"):
        resolve_device("cuda", TensorMode.FAKE)
    assert resolve_device("cpu", TensorMode.FAKE) == torch.device("cpu")  # cpu is not probed
    result = CliRunner().invoke(app, ["resnet18", "--fake", "--device", "cuda"])
    assert result.exit_code == 2
    assert "no honest prediction here: the probe's reason" in result.output
    assert "Traceback" not in result.output


def test_divergence_table_is_the_measured_one_else_the_union_said_so():
    measured = divergence_table("cpu", (2, 14))
    assert measured.name.startswith("torch 2.14 cpu (torch 2.14.1")
    assert ("aten.native_group_norm", "forward") in measured
    newer = divergence_table("cpu", (2, 15))
    assert ("aten.native_group_norm", "forward") not in newer  # 2.15's fake kernel keeps it
    oldest = divergence_table("cpu", (2, 4))
    union = divergence_table("cpu", (2, 9))
    assert union.name == "union of torch 2.4, 2.14, 2.15 cpu (torch 2.9 not measured)"
    assert set(union.ops) == set(oldest.ops) | set(measured.ops) | set(newer.ops)
    # CUDA: measured on an H200 with torch 2.11 (reports/gpu-truth/cuda_torch-2.11.0.json)
    cuda = divergence_table("cuda", (2, 11))
    assert cuda.name.startswith("torch 2.11 cuda (torch 2.11.0")
    assert set(cuda.ops) == {("aten.add", "backward"), ("aten.cat", "forward")}
    union_cuda = divergence_table("cuda", (2, 14))
    assert union_cuda.name == "union of torch 2.11 cuda (torch 2.14 not measured)"
    assert divergence_table("mps", (2, 14)).ops == {}


def test_kernel_copy_table_is_the_measured_one_else_the_newest_before_it_said_so():
    measured = kernel_copy_table("cpu", (2, 14))
    assert measured.name.startswith("torch 2.14 cpu (torch 2.14.1")
    assert measured.copied[("aten._softmax", 0, 3, "dense-second")] == 1.0
    assert ("aten.bmm", 0, 3, "dense-second") not in measured.copied  # BLAS reads it so
    later = kernel_copy_table("cpu", (2, 16))
    assert later.name.endswith("; torch 2.16 not measured") and "torch 2.15 cpu" in later.name
    cuda = kernel_copy_table("cuda", (2, 14))  # measured on an H200 with torch 2.11 only
    assert cuda.name.startswith("torch 2.11 cuda (torch 2.11.0")
    assert cuda.name.endswith("; torch 2.14 not measured")
    assert cuda.copied[("aten.cumsum", 0, 3, "dense-second")] == 1.0
    assert ("aten.cumsum", 0, 3, "dense-second") not in measured.copied
    assert kernel_copy_table("mps", (2, 14)) == KernelCopies(
        "none: no kernel copies measured on mps", {}
    )


def test_the_kernel_copy_table_is_what_the_script_measures_on_this_torch(tmp_path):
    """``scripts/kernel_copies.py`` run here (a subprocess) measures the table shipped for
    this torch and CPU; a torch release whose kernels copy otherwise fails this."""
    out = tmp_path / "kernel_copies.json"
    script = Path(__file__).resolve().parents[1] / "scripts" / "kernel_copies.py"
    subprocess.run(
        [sys.executable, str(script), "--out", str(out)], check=True, capture_output=True
    )
    (table,) = json.loads(out.read_text())["tables"]
    shipped = kernel_copy_table("cpu")
    if not shipped.name.startswith(f"torch {table['torch']} cpu"):
        pytest.skip(f"no table shipped for torch {table['torch']}: {shipped.name}")
    measured = {
        (e["op"], e["input"], e["rank"], e["strides"]): e["copied"] for e in table["copies"]
    }
    assert measured == dict(shipped.copied)


def test_kernel_overrides_hold_for_the_versions_their_source_was_read_at():
    override = KernelOverride("aten.x", 0, (2, 4), (2, 14), "source")
    assert [override.holds(v) for v in ((2, 3), (2, 4), (2, 14), (2, 15))] == [
        False,
        True,
        True,
        False,
    ]
    assert all(o.source and o.op.startswith("aten.") for o in CUDA_KERNEL_OVERRIDES)


class GroupNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.out = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.conv(x)))


def _fake_audit(model: nn.Module, device: str):
    x = torch.randn(2, 3, 8, 8)
    settings = AuditSettings(device=device, tensor_mode=TensorMode.FAKE, differential=False)
    return audit_module(model, (x,), settings)


@needs_fake_cuda
def test_fake_cuda_group_norm_follows_the_kernel_source_of_this_torch():
    """torch 2.14 and earlier: CUDA group_norm returns NCHW (kernel source), whatever fake
    says; 2.15 has NHWC CUDA kernels, and the prediction is fake's own."""
    holds = [
        o
        for o in CUDA_KERNEL_OVERRIDES
        if o.op == "aten.native_group_norm" and o.holds(TORCH_VERSION)
    ]
    report = _fake_audit(GroupNormNet(), "cuda")
    assert report.environment.fake_divergences == divergence_table("cuda").name
    if holds:
        (loss,) = report.offenders
        assert loss.aten_op == "aten.native_group_norm" and loss.round_trips == 1
        (applied,) = report.environment.kernel_overrides
        assert (applied.op, applied.applied, applied.source) == (holds[0].op, 1, holds[0].source)
    else:
        assert report.environment.kernel_overrides == ()
        assert bool(report.offenders) == fake_cuda_group_norm_returns_nchw()


@needs_fake_cuda
def test_fake_cuda_without_an_overridden_op_applies_nothing():
    control = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1))
    report = _fake_audit(control, "cuda")
    assert report.offenders == () and report.environment.kernel_overrides == ()


def test_fake_cpu_applies_no_cuda_kernel_source():
    report = _fake_audit(GroupNormNet(), "cpu")
    assert report.environment.kernel_overrides == ()


def test_fake_convolution_gradients_keep_channels_last_whatever_the_meta_function_says():
    """pytorch#171622 (the meta function's NCHW convolution gradients, torch 2.4.1) does not
    reach fake runs: fake tensors lay the gradients out by the device's convolution backend,
    channels_last for channels_last data as the real kernel; NCHW data stays NCHW (control)."""
    cl = torch.channels_last
    fake, cpu = fake_mode.new_fake_mode(), torch.device("cpu")

    def gradients(data: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = (data, data, weight, None, [1], [1], [1], False, [0], 1, [True, True, False])
        return torch.ops.aten.convolution_backward.default(*args)[:2]

    for fmt, expected in ((cl, True), (torch.contiguous_format, False)):
        data = torch.randn(2, 4, 5, 5).to(memory_format=fmt)
        weight = torch.randn(4, 4, 3, 3).to(memory_format=fmt)
        real = gradients(data, weight)
        data_f, weight_f = (fake_mode.fake_tensor(fake, t, cpu) for t in (data, weight))
        with fake:
            predicted = gradients(data_f, weight_f)
        for r, p in zip(real, predicted, strict=True):
            assert p.is_contiguous(memory_format=cl) is expected
            assert p.stride() == r.stride()


@needs_fake_cuda
def test_fake_cuda_convolution_gradients_are_laid_out_as_cudnn_lays_them():
    """On fake CUDA the gradients follow cuDNN's choice: channels_last when the data or the
    weight is; NCHW when neither is (control)."""
    cl, cuda = torch.channels_last, torch.device("cuda")
    fake = fake_mode.new_fake_mode()
    for data_fmt, weight_fmt, expected in (
        (cl, torch.contiguous_format, True),
        (torch.contiguous_format, cl, True),
        (torch.contiguous_format, torch.contiguous_format, False),
    ):
        data = fake_mode.fake_tensor(fake, torch.randn(2, 4, 5, 5).to(memory_format=data_fmt), cuda)
        w = fake_mode.fake_tensor(fake, torch.randn(4, 4, 3, 3).to(memory_format=weight_fmt), cuda)
        with fake:
            grads = torch.ops.aten.convolution_backward.default(
                data, data, w, None, [1], [1], [1], False, [0], 1, [True, True, False]
            )[:2]
        assert [g.is_contiguous(memory_format=cl) for g in grads] == [expected, expected]


def _batch_norm_backward(
    data: torch.Tensor,
    grad: torch.Tensor,
    weight: torch.Tensor | None,
    train: bool = True,
    device: str = "cuda",
):
    mode = KernelSourceMode.for_device(torch.device(device))
    fake = fake_mode.new_fake_mode()
    cpu = torch.device("cpu")
    data, grad = (fake_mode.fake_tensor(fake, t, cpu) for t in (data, grad))
    weight = None if weight is None else fake_mode.fake_tensor(fake, weight, cpu)
    stats = [fake_mode.fake_tensor(fake, torch.ones(data.shape[1]), cpu)] * 2
    with fake, mode.over(fake):  # the kernel source first, as in a fake run
        grad_input = torch.ops.aten.native_batch_norm_backward.default(
            grad, data, weight, *stats, *stats, train, 1e-5, [True, weight is not None, False]
        )[0]
    return grad_input, mode.applied_overrides()


def test_a_cuda_batch_norm_backward_lays_its_gradient_out_as_cudas_kernels_do():
    """The trace records the CPU's native batch norm, whose fake backward follows the incoming
    gradient. On CUDA, in training, cuDNN and the native kernel alike (no affine weight,
    bfloat16: measured on an H200) lay the input gradient out as the input; outside training
    the native kernel's is contiguous. A forward traced under CUDA's autocast has cuDNN's
    batch norm itself, the same. Controls: gradients already laid out so."""
    cl = torch.channels_last
    data = torch.randn(2, 4, 5, 5).to(memory_format=cl)
    nchw_grad, cl_grad = torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5).to(memory_format=cl)
    for case, train, expected in (
        ((data, nchw_grad, torch.ones(4)), True, cl),  # cuDNN's
        ((data, nchw_grad, None), True, cl),  # the native kernel's
        ((data.bfloat16(), nchw_grad.bfloat16(), torch.ones(4)), True, cl),
        ((data.contiguous(), cl_grad, torch.ones(4)), True, torch.contiguous_format),
        ((data, cl_grad, torch.ones(4)), False, torch.contiguous_format),
    ):
        grad_input, (applied,) = _batch_norm_backward(*case, train=train)
        assert grad_input.is_contiguous(memory_format=expected)
        assert (applied.op, applied.applied) == ("aten.native_batch_norm_backward", 1)
    assert "cudnn_batch_norm_backward" in applied.source and "Normalization.cu" in applied.source
    # a forward traced under CUDA's autocast runs cuDNN's batch norm itself: the same layout
    fake, cpu = fake_mode.new_fake_mode(), torch.device("cpu")
    data_f, grad_f, w = (
        fake_mode.fake_tensor(fake, t, cpu) for t in (data, nchw_grad, torch.ones(4))
    )
    stats = [fake_mode.fake_tensor(fake, torch.ones(4), cpu) for _ in range(4)]
    reserve = fake_mode.fake_tensor(fake, torch.empty(0, dtype=torch.uint8), cpu)
    mode = KernelSourceMode.for_device(torch.device("cuda"))
    with fake, mode.over(fake):  # fake tensors made before: torch 2.4.1 cannot make them inside
        cudnn = torch.ops.aten.cudnn_batch_norm_backward.default(
            data_f, grad_f, w, *stats, 1e-5, reserve
        )[0]
    assert cudnn.is_contiguous(memory_format=cl)
    assert [a.op for a in mode.applied_overrides()] == ["aten.cudnn_batch_norm_backward"]
    for controls in (
        (data.contiguous(), nchw_grad, torch.ones(4)),
        (data, cl_grad, torch.ones(4)),
        (data, cl_grad, None),
    ):
        assert _batch_norm_backward(*controls)[1] == ()


@pytest.mark.parametrize("train", [True, False])
def test_a_fake_cpu_batch_norm_backward_lays_its_gradient_out_as_the_cpu_kernel_does(train):
    """The CPU's batch norm backward (``batch_norm_backward_cpu_template``) writes the input
    gradient in the input's memory format, in training and outside it, whatever the incoming
    gradient's; torch's fake decomposition follows the incoming gradient (the fake step's
    disagreement with eager CPU training in 9 models of the self-check). Fake CPU runs give
    the kernel's layout: checked against the kernel itself in each pair of layouts, with and
    without affine weights, an override reported exactly where the layouts differ (the
    controls: the pairs already alike)."""
    cl = torch.channels_last
    for data_cl, grad_cl, affine in itertools.product((True, False), repeat=3):
        data, grad = torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5)
        data = data.to(memory_format=cl) if data_cl else data
        grad = grad.to(memory_format=cl) if grad_cl else grad
        weight, stats = (torch.ones(4) if affine else None), torch.ones(4)
        kernel = torch.ops.aten.native_batch_norm_backward.default(
            grad, data, weight, stats, stats, stats, stats, train, 1e-5, [True, affine, False]
        )[0]
        ours, applied = _batch_norm_backward(data, grad, weight, train=train, device="cpu")
        assert ours.stride() == kernel.stride() == data.stride()
        assert [a.op for a in applied] == (
            ["aten.native_batch_norm_backward"] * (data_cl != grad_cl)
        )
        assert all("Normalization.cpp" in a.source for a in applied)


def _cudnn_batch_norm(kernels: bool, data: torch.Tensor, grad: torch.Tensor, training: bool):
    """cuDNN's batch norm and its backward on fake CUDA tensors: under ``KernelSourceMode``
    (``kernels``), or torch's own fake decomposition; with the overrides it applied."""
    fake, cuda = fake_mode.new_fake_mode(), torch.device("cuda")
    mode = KernelSourceMode.for_device(cuda)
    data_f, grad_f = (fake_mode.fake_tensor(fake, t, cuda) for t in (data, grad))
    weight = [fake_mode.fake_tensor(fake, torch.ones(data.shape[1]), cuda) for _ in range(4)]
    with fake, mode.over(fake) if kernels else contextlib.nullcontext():
        out = torch.ops.aten.cudnn_batch_norm.default(data_f, *weight, training, 0.1, 1e-5)
        grads = ()
        if training:
            grads = torch.ops.aten.cudnn_batch_norm_backward.default(
                data_f, grad_f, weight[0], *weight[2:], out[1], out[2], 1e-5, out[3]
            )
    shapes = [(tuple(t.shape), t.stride(), t.dtype, t.device.type) for t in (*out, *grads)]
    return shapes, () if not kernels else mode.applied_overrides()


@needs_fake_cuda
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(2, 8, 5, 5), (2, 8, 1, 1), (1, 8, 5, 5), (2, 8, 3, 4, 5)])
@pytest.mark.parametrize("channels_last", [True, False])
def test_cudnn_batch_norm_outputs_are_allocated_as_its_kernel_does_and_as_torch_fakes_them(
    training, dtype, shape, channels_last
):
    """cuDNN's batch norm and its backward allocate their outputs as BatchNorm.cpp does
    (without torch's fake decomposition, tens of fake operations each): the same shapes,
    strides and dtypes as the decomposition for every input autograd hands them (in its own
    format, the gradient converted to it first), float16 data with float32 weights included."""
    data = torch.randn(shape, dtype=dtype)
    if channels_last:
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        data = data.to(memory_format=fmt)
    grad = torch.randn_like(data)  # in the data's format, as CudnnBatchNormBackward0 passes it
    fast, applied = _cudnn_batch_norm(True, data, grad, training)
    assert fast == _cudnn_batch_norm(False, data, grad, training)[0]
    assert applied == ()
    assert fast[0][1] == data.stride() and fast[0][2] == dtype
    assert fast[1][0] == ((shape[1],) if training else (0,)) and fast[1][2] == torch.float32


@needs_fake_cuda
def test_cudnn_batch_norm_backward_lays_its_gradient_out_as_the_input_whatever_it_is_given():
    """Given a gradient in another format than its input (autograd never does so: its formula
    converts first), the kernel still allocates the input gradient in the input's format, where
    torch's decomposition follows the gradient: counted as applied. Control: the gradient in
    the input's format, nothing counted."""
    cl = torch.channels_last
    for data, grad in (
        (torch.randn(2, 8, 5, 5), torch.randn(2, 8, 5, 5).to(memory_format=cl)),
        (torch.randn(2, 8, 5, 5).to(memory_format=cl), torch.randn(2, 8, 5, 5)),
    ):
        (*_, (_, grad_input, *_), _, _), applied = _cudnn_batch_norm(True, data, grad, True)
        assert grad_input == data.stride()
        assert [(a.op, a.applied) for a in applied] == [("aten.cudnn_batch_norm_backward", 1)]
        decomposed = _cudnn_batch_norm(False, data, grad, True)[0]
        assert decomposed[4][1] == grad.stride()
    data = torch.randn(2, 8, 5, 5).to(memory_format=cl)
    assert _cudnn_batch_norm(True, data, torch.randn_like(data), True)[1] == ()


_ACTIVATION_BACKWARDS = {  # op: its arguments after (grad_output, input)
    "silu_backward": (),
    "sigmoid_backward": (),
    "tanh_backward": (),
    "gelu_backward": (),
    "threshold_backward": (0.0,),
    "hardtanh_backward": (0.0, 6.0),
    "hardswish_backward": (),
    "hardsigmoid_backward": (),
    "leaky_relu_backward": (0.01, False),
    "mish_backward": (),
    "softplus_backward": (1.0, 20.0),
}


@pytest.mark.parametrize("name", [*sorted(_ACTIVATION_BACKWARDS), "elu_backward"])
def test_activation_backwards_are_faked_as_their_kernels_lay_them_out(name):
    """cl-audit's fake mode runs an activation's backward as the binary operation its kernel
    is (a multiplication of its two tensors, in the kernel's order) instead of torch's Python
    decomposition: the same shape, strides and dtype as the real kernel gives, whichever of the
    two is channels_last (the order decides), in 2-D, 4-D and 5-D, float32 and float16. Torch's
    own fake mode agrees wherever both tensors share a layout (and, for the ops whose
    decomposition starts from the gradient, always). Control: a broadcast gradient is left to
    torch."""
    op = getattr(torch.ops.aten, name).default
    cl = {4: torch.channels_last, 5: torch.channels_last_3d}
    cpu = torch.device("cpu")

    def call(grad: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
        if name == "elu_backward":
            return op(grad, 1.0, 1, 1, False, data)
        return op(grad, data, *_ACTIVATION_BACKWARDS[name])

    def fake_run(mode: fake_base.FakeTensorMode, grad: torch.Tensor, data: torch.Tensor):
        grad, data = (fake_mode.fake_tensor(mode, t, cpu) for t in (grad, data))
        with mode:
            out = call(grad, data)
        return tuple(out.shape), out.stride(), out.dtype

    for shape in ((4, 6), (2, 6, 5, 3), (2, 6, 3, 4, 5)):
        for dtype in (torch.float32, torch.float16):
            for grad_cl, data_cl in ((False, False), (True, False), (False, True), (True, True)):
                grad, data = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
                if len(shape) > 2:
                    grad = grad.to(memory_format=cl[len(shape)]) if grad_cl else grad
                    data = data.to(memory_format=cl[len(shape)]) if data_cl else data
                ours = fake_run(fake_mode.new_fake_mode(), grad, data)
                real = call(grad, data)
                assert ours == (tuple(real.shape), real.stride(), real.dtype)
                same = grad_cl == data_cl or len(shape) == 2
                if same or name not in _DECOMPOSED_FROM_THE_INPUT:
                    assert ours == fake_run(fake_base.FakeTensorMode(), grad, data)
                else:  # the case fixed: torch's fake follows the input, its kernel the gradient
                    assert ours != fake_run(fake_base.FakeTensorMode(), grad, data)
    broadcast = torch.randn(1, 6, 5, 3)
    data = torch.randn(2, 6, 5, 3).to(memory_format=torch.channels_last)
    assert fake_shortcuts.binary_operands(op, (broadcast, data, 0.0, 6.0, 0.0, data)) is None


_DECOMPOSED_FROM_THE_INPUT = {  # torch 2.14.1's decompositions whose output follows the input
    "elu_backward",
    "hardsigmoid_backward",
    "hardswish_backward",
    "hardtanh_backward",
    "softplus_backward",
}


@contextlib.contextmanager
def _torch_fake_dispatches() -> Iterator[list[object]]:
    """The operators that reach torch's own fake dispatch (``FakeTensorMode.dispatch``)
    inside, in order."""
    reached: list[object] = []
    dispatch = fake_base.FakeTensorMode.dispatch

    def counted(self, func, types, args=(), kwargs=None):
        reached.append(func)
        return dispatch(self, func, types, args, kwargs)

    with mock.patch.object(fake_base.FakeTensorMode, "dispatch", counted):
        yield reached


def test_a_dense_cast_is_faked_with_its_inputs_strides_as_its_kernel_allocates_it():
    """``_to_copy`` that only changes the dtype of a dense tensor allocates the same strides
    (TensorConversions.cpp): cl-audit's fake mode makes that fake tensor directly, without
    torch's fake dispatch (counted), equal to the real kernel and to torch's fake mode for
    channels_last, NCHW, transposed and size-1 shapes. Controls, left to torch: a non-dense
    view (expanded, sliced) and a memory format asked for."""
    cpu, cl = torch.device("cpu"), torch.channels_last
    ops = torch.ops.aten

    def fake_cast(mode: fake_base.FakeTensorMode, x: torch.Tensor, **kwargs: object):
        fx = fake_mode.fake_tensor(mode, x, cpu)
        with mode:
            out = ops._to_copy.default(fx, **kwargs)
        return out.stride(), out.dtype

    dense = [torch.randn(2, 8, 5, 5), torch.randn(2, 8, 5, 5).to(memory_format=cl)]
    dense += [torch.randn(2, 8, 1, 1).to(memory_format=cl), torch.randn(4, 6).t()]
    dense += [torch.randn(2, 8, 3, 4, 5).to(memory_format=torch.channels_last_3d)]
    for x in dense:
        assert fake_shortcuts.dense_cast(
            (fake_mode.fake_tensor(fake_mode.new_fake_mode(), x, cpu),), {}
        )
        for kwargs in ({"dtype": torch.float16}, {"memory_format": torch.preserve_format}, {}):
            real = ops._to_copy.default(x, **kwargs)
            with _torch_fake_dispatches() as reached:
                ours = fake_cast(fake_mode.new_fake_mode(), x, **kwargs)
            assert reached == []
            assert ours == (real.stride(), real.dtype) == (x.stride(), real.dtype)
            assert ours == fake_cast(fake_base.FakeTensorMode(), x, **kwargs)
    views = (
        (torch.randn(1, 8, 1, 1), lambda t: t.expand(2, 8, 5, 5), {"dtype": torch.float16}),
        (torch.randn(4, 6), lambda t: t[::2], {"dtype": torch.float16}),
        (torch.randn(2, 8, 5, 5), lambda t: t, {"memory_format": cl}),
    )
    for base, view, kwargs in views:
        mode = fake_mode.new_fake_mode()
        fake = fake_mode.fake_tensor(mode, base, cpu)
        with mode:
            fx = view(fake)
            assert not fake_shortcuts.dense_cast((fx,), kwargs)
            with _torch_fake_dispatches() as reached:
                out = ops._to_copy.default(fx, **kwargs)
            assert ops._to_copy.default in reached  # the controls: torch's path
        real = ops._to_copy.default(view(base), **kwargs)
        assert (out.stride(), out.dtype) == (real.stride(), real.dtype)


def test_a_fake_view_gives_size_one_dimensions_the_strides_the_kernels_give_them():
    """Torch 2.14 and 2.15 fake ``view`` and ``_unsafe_view`` by ``_reshape_view_helper``, whose
    stride for a size-1 dimension differs from the kernels' (``computeStride``; 2.4.1 agrees):
    a (1, 24, 64) map viewed as (1, 24, 8, 8) is channels_last to their fake mode and NCHW to
    CPU and meta kernels, which decides the layout of what a kernel makes of it. cl-audit's
    fake mode gives the kernels' strides, on the same storage. Controls: a view without a
    size-1 dimension and size-1 views that torch's fake mode gets right."""
    ops = torch.ops.aten
    tokens = torch.randn(1, 64, 24).transpose(1, 2)  # (1, 24, 64), strides (1536, 1, 24)
    cases = (
        (tokens, lambda t: t.view(1, 24, 8, 8)),
        (tokens, lambda t: t.reshape(1, 24, 8, 8)),
        (tokens, lambda t: ops._unsafe_view.default(t, [1, 24, 8, 8])),
    )
    controls = (
        (torch.randn(2, 64, 24).transpose(1, 2), lambda t: t.view(2, 24, 8, 8)),
        (torch.randn(2, 1, 6), lambda t: t.view(2, 6, 1)),
        (torch.randn(4, 6), lambda t: t.view(1, 24)),
    )
    for number, (base, view) in enumerate(cases + controls):
        kernel = view(base).stride()
        assert view(base.to("meta")).stride() == kernel
        with fake_base.FakeTensorMode() as torch_mode:
            torchs = view(torch_mode.from_tensor(base)).stride()
        assert (torchs == kernel) == (number >= len(cases) or versions.TORCH_VERSION < (2, 14))
        mode = fake_mode.new_fake_mode()
        fake = fake_mode.fake_tensor(mode, base, torch.device("cpu"))
        with mode:
            out = view(fake)
        assert out.stride() == kernel
        assert storage.storage_key(out) == storage.storage_key(fake)


def test_a_fake_view_is_made_by_its_meta_kernel_on_its_arguments_storage():
    """A view (and ``_unsafe_view``) on a fake tensor is made by the operator's own meta kernel
    on a meta tensor laid out as its argument: shape, strides, offset and dtype as the CPU
    kernel gives them, on the fake argument's storage, without torch's general fake path
    (counted). The control, left to torch: a view of a complex tensor."""
    ops = torch.ops.aten
    full = torch.randn(2, 6, 4, 5).to(memory_format=torch.channels_last)
    base = full[:, 1:]
    same = lambda t: t  # noqa: E731
    views = (  # (the argument made of the base, the view of it)
        (same, lambda t: ops.detach.default(t)),
        (lambda t: t[0, 0], lambda t: ops.t.default(t)),
        (same, lambda t: ops.transpose.int(t, 1, 3)),
        (same, lambda t: ops.permute.default(t, [0, 2, 3, 1])),
        (same, lambda t: ops.slice.Tensor(t, 3, 1, 4, 2)),
        (same, lambda t: ops.select.int(t, 1, 2)),
        (lambda t: t[:, :, :1], lambda t: ops.expand.default(t, [2, 5, 3, 5])),
        (same, lambda t: ops.unsqueeze.default(t, 2)),
        (lambda t: t[:, :, :1], lambda t: ops.squeeze.dim(t, 2)),
        (same, lambda t: ops.diagonal.default(t, 0, 2, 3)),
        (same, lambda t: ops.as_strided.default(t, [2, 3], [1, 7], 3)),
        (lambda t: t[0].contiguous(), lambda t: ops.view.default(t, [5, 20])),
        (lambda t: t[0].contiguous(), lambda t: ops._unsafe_view.default(t, [20, 5])),
        (same, lambda t: ops.unfold.default(t, 3, 2, 1)),
        (same, lambda t: ops.alias.default(t)),
        (same, lambda t: ops.view.dtype(t, torch.int32)),
    )
    mode, cpu = fake_mode.new_fake_mode(), torch.device("cpu")
    whole = fake_mode.fake_tensor(mode, full, cpu)
    with mode:
        fake = whole[:, 1:]
    for argument, view in views:
        with mode:
            viewed = argument(fake)
            with _torch_fake_dispatches() as reached:
                out = view(viewed)
        real = view(argument(base))
        assert reached == []
        assert (out.shape, out.stride(), out.dtype, out.storage_offset()) == (
            real.shape,
            real.stride(),
            real.dtype,
            real.storage_offset(),
        )
        assert fake_base.is_fake(out) and storage.storage_key(out) == storage.storage_key(viewed)
    complex_fake = fake_mode.fake_tensor(mode, torch.randn(3, 4, dtype=torch.cfloat), cpu)
    with mode, _torch_fake_dispatches() as reached:
        ops.view_as_real.default(complex_fake)
    assert reached == [ops.view_as_real.default]  # the control: torch's path


def test_the_training_loss_operations_are_faked_by_their_meta_kernels_as_the_cpu_makes_them():
    """Cross-entropy's operations (log-softmax and the negative log-likelihood, forward and
    backward: every training audit's own loss) are faked by their meta kernels on meta
    tensors, without torch's fake dispatch (counted; it runs their Python decompositions):
    outputs as the CPU kernels make them, for each reduction, with and without class weights,
    and a log-softmax over either dimension. The control, left to torch: a real target among
    fake tensors."""
    ops = torch.ops.aten
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, generator=generator)
    target = torch.randint(7, (4,), generator=generator)
    weight = torch.rand(7, generator=generator)
    cases = []
    for dim in (0, 1):
        output = ops._log_softmax.default(logits, dim, False)
        cases.append((ops._log_softmax.default, (logits, dim, False)))
        cases.append((ops._log_softmax_backward_data.default, (output, output, dim, torch.float32)))
    for reduction, w in itertools.product((0, 1, 2), (None, weight)):
        loss, total = ops.nll_loss_forward.default(logits, target, w, reduction, -100)
        cases.append((ops.nll_loss_forward.default, (logits, target, w, reduction, -100)))
        grad = torch.ones_like(loss)
        arguments = (grad, logits, target, w, reduction, -100, total)
        cases.append((ops.nll_loss_backward.default, arguments))
    mode, cpu = fake_mode.new_fake_mode(), torch.device("cpu")
    for func, arguments in cases:
        fakes = tuple(
            fake_mode.fake_tensor(mode, a, cpu) if isinstance(a, torch.Tensor) else a
            for a in arguments
        )
        with mode, _torch_fake_dispatches() as reached:
            ours = func(*fakes)
        assert reached == [] and _metadata(ours) == _metadata(func(*arguments))
    fake_logits = fake_mode.fake_tensor(mode, logits, cpu)
    with _torch_fake_dispatches() as reached, mode, contextlib.suppress(Exception):
        ops.nll_loss_forward.default(fake_logits, target, None, 1, -100)  # torch refuses it
    assert reached[:1] == [ops.nll_loss_forward.default]


def _group_norm_backward_cases() -> Iterator[tuple[object, ...]]:
    """Group norm's backward arguments: channels_last and NCHW maps in float32 and float16, an
    NC11 map, a sequence, a 5D map; with and without a weight; every gradient asked, or some."""
    generator = torch.Generator().manual_seed(0)
    for shape, groups in (
        ((2, 32, 7, 7), 8),
        ((2, 32, 1, 1), 4),
        ((2, 16, 5), 4),
        ((2, 16, 3, 4, 5), 4),
    ):
        for channels_last, dtype in itertools.product(
            (True, False), (torch.float32, torch.float16)
        ):
            data, grad = (torch.randn(shape, generator=generator, dtype=dtype) for _ in "xg")
            if channels_last and len(shape) > 3:
                fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
                data, grad = data.to(memory_format=fmt), grad.to(memory_format=fmt)
            n, c = shape[:2]
            stats = [torch.rand(n, groups, generator=generator, dtype=dtype) for _ in "mr"]
            spatial = data.numel() // (n * c)
            for weight, mask in (
                (torch.rand(c, dtype=dtype), [True] * 3),
                (None, [True, False, True]),
            ):
                yield (grad, data, *stats, weight, n, c, spatial, groups, mask)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_fake_cuda)])
def test_group_norm_backward_is_faked_by_its_meta_kernel_as_torchs_fake_mode_fakes_it(device):
    """Group norm's backward is faked by its kernel for the meta device (the Python
    decomposition torch's fake mode runs too, each of its operations a meta kernel's call, not
    a fake dispatch: 2 against 4-13 ms a call): without torch's fake dispatch (counted), the
    outputs torch's own fake mode gives, in every case. The control, left to torch: a real
    weight among fake tensors."""
    op = torch.ops.aten.native_group_norm_backward.default
    target = torch.device(device)
    for arguments in _group_norm_backward_cases():

        def faked(mode, arguments=arguments) -> tuple[object, ...]:
            return tuple(
                fake_mode.fake_tensor(mode, a, target) if isinstance(a, torch.Tensor) else a
                for a in arguments
            )

        torchs = fake_base.FakeTensorMode(allow_non_fake_inputs=True)
        fakes = faked(torchs)
        with torchs:
            expected = op(*fakes)
        mode = fake_mode.new_fake_mode()
        fakes = faked(mode)
        with mode, _torch_fake_dispatches() as reached:
            ours = op(*fakes)
        assert reached == [] and _metadata(ours) == _metadata(expected)
    grad, data, mean, rstd, weight, *rest = next(_group_norm_backward_cases())
    mode = fake_mode.new_fake_mode()
    fakes = [fake_mode.fake_tensor(mode, t, target) for t in (grad, data, mean, rstd)]
    with _torch_fake_dispatches() as reached, mode, contextlib.suppress(Exception):
        op(*fakes, weight, *rest)  # on fake CUDA, torch refuses the CPU weight
    assert reached[:1] == [op]


def test_a_fake_layer_norm_backward_writes_its_input_gradient_contiguous_as_its_kernels_do():
    """CPU's and CUDA's layer norm backward allocate the input gradient like the contiguous
    input (``LEGACY_CONTIGUOUS_MEMORY_FORMAT``): contiguous whatever the incoming gradient's
    strides. Torch 2.14's and 2.15's fake gradient follows the incoming one (2.4.1's does not);
    cl-audit's fake mode gives the kernel's. Controls: a contiguous gradient, and the weight's
    and bias's gradients (or none, where the mask or a missing weight says so) as the kernel
    gives them."""
    ops = torch.ops.aten
    tokens = torch.randn(2, 16, 5, 5).to(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    grads = (torch.randn(2, 16, 5, 5).permute(0, 2, 3, 1), torch.randn(2, 5, 5, 16))
    cases = [(torch.randn(16), torch.randn(16), [True] * 3), (None, None, [True, False, False])]
    cases.append((torch.randn(16), torch.randn(16), [True, False, True]))
    cases.append((torch.randn(16), torch.randn(16), [False, True, False]))

    def described(outputs: tuple) -> list:
        return [None if t is None else (t.shape, t.stride(), t.dtype) for t in outputs]

    for (weight, bias, mask), grad in itertools.product(cases, grads):
        _, mean, rstd = ops.native_layer_norm(tokens, [16], weight, bias, 1e-5)
        args = (grad, tokens, [16], mean, rstd, weight, bias, mask)
        kernel = described(ops.native_layer_norm_backward(*args))
        assert kernel[0] is None or kernel[0][1] == (400, 80, 16, 1)
        mode, cpu = fake_mode.new_fake_mode(), torch.device("cpu")
        fakes = [
            t if not isinstance(t, torch.Tensor) else fake_mode.fake_tensor(mode, t, cpu)
            for t in args
        ]
        with mode:
            ours = ops.native_layer_norm_backward(*fakes[:2], [16], *fakes[3:7], mask)
        assert described(ours) == kernel


def test_the_modes_answer_a_fake_tensors_device_query_from_the_tensor():
    """C++ asks the device of every fake tensor an operation touches (``prim.device``): each
    cl-audit mode answers it from the fake tensor, as torch's own handler does; any other
    call, or a real tensor, is passed on."""
    device_of = torch.ops.prim.device.default
    cuda = torch.device("cuda")
    mode = fake_mode.new_fake_mode()
    fake = fake_mode.fake_tensor(mode, torch.empty(2, 3, device="meta"), cuda)
    assert fake_base.device_query(device_of, (fake,)) == fake.device == torch.device("cuda:0")
    assert fake_base.device_query(device_of, (torch.empty(2),)) is None
    assert fake_base.device_query(torch.ops.aten.detach.default, (fake,)) is None
    with mode, KernelSourceMode.for_device(cuda).over(mode), audit(training=True):
        assert device_of(fake) == fake.device
        assert (fake * 2).device == fake.device


class _Seen(modes.TorchDispatchMode):
    """A dispatch mode that notes each operation it passes on, as ``_noted`` describes it;
    metadata queries (``prim``: the fake mode answers a layer's itself) aside."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.namespace != "prim":
            self.log.append(_noted(func, result))
        return result


def _noted(func, result) -> tuple:
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    laid = [(tuple(t.shape), t.stride()) for t in outputs if isinstance(t, torch.Tensor)]
    return str(func), type(result).__name__, laid


def _fakes(mode) -> tuple[torch.Tensor, torch.Tensor]:
    """A channels_last map and a weight, fake CPU tensors of ``mode``."""
    cpu = torch.device("cpu")
    data = torch.empty(2, 8, 4, 4, device="meta").to(memory_format=torch.channels_last)
    weight = torch.empty(8, device="meta")
    return fake_mode.fake_tensor(mode, data, cpu), fake_mode.fake_tensor(mode, weight, cpu)


def _layer_norm_and_lists(x: torch.Tensor, w: torch.Tensor) -> None:
    """A decomposed operation (layer norm over a channels_last map's tokens), tensor lists
    (``unbind``, ``split``) and a plain one."""
    F.layer_norm(x.permute(0, 2, 3, 1), (8,), w, w).unbind(1)
    torch.ops.aten.split.Tensor(x * 2, 4, 1)


def test_a_fake_modes_dispatch_layer_sees_what_a_dispatch_mode_above_it_sees():
    """cl-audit's fake mode runs its layers (the kernel source, an audit's observer) where a
    dispatch mode pushed above it would run, a dispatch hop cheaper: a layer sees the same
    operations with the same outputs as the mode, several outputs as the plain tuple C++ hands
    a mode where torch's decomposition returns a named tuple (layer norm), a tensor list as a
    list, and not the operations the fake mode runs inside (layer norm's decomposition)."""
    by_mode: list = []
    mode = fake_mode.new_fake_mode()
    tensors = _fakes(mode)
    with mode, _Seen(by_mode):
        _layer_norm_and_lists(*tensors)
    by_layer: list = []

    def layer(func, args, kwargs, run):
        result = run(func, args, kwargs)
        by_layer.append(_noted(func, result))
        return result

    mode = fake_mode.new_fake_mode()
    tensors = _fakes(mode)
    with mode, fake_mode.dispatch_layer(mode, layer):
        _layer_norm_and_lists(*tensors)
    assert by_layer == by_mode
    kinds = {name: kind for name, kind, _ in by_layer}
    assert kinds["aten.native_layer_norm.default"] == "tuple"
    assert kinds["aten.unbind.int"] == kinds["aten.split.Tensor"] == "list"
    assert mode.layers == ()  # taken off on exit


def test_a_layer_runs_below_the_layers_pushed_after_it_and_skips_itself_in_what_it_runs():
    """Layers stack as modes do: the one pushed last sees an operation first; what a layer
    runs itself (not passed on by ``run``) goes to the layers below it only."""
    order: list = []
    mode = fake_mode.new_fake_mode()
    x = fake_mode.fake_tensor(mode, torch.empty(4, device="meta"), torch.device("cpu"))

    def inner(func, args, kwargs, run):
        order.append(("inner", str(func)))
        return run(func, args, kwargs)

    def outer(func, args, kwargs, run):
        order.append(("outer", str(func)))
        if func is torch.ops.aten.mul.Tensor:
            torch.ops.aten.neg.default(args[0])  # run by the layer itself
        return run(func, args, kwargs)

    with mode, fake_mode.dispatch_layer(mode, inner), fake_mode.dispatch_layer(mode, outer):
        x * 2
    assert order == [
        ("outer", "aten.mul.Tensor"),
        ("inner", "aten.neg.default"),
        ("inner", "aten.mul.Tensor"),
    ]


_SHAPES = {"nchw": (2, 8, 5, 5), "channels_last": (2, 8, 5, 5)}


def _memo_calls() -> dict[str, tuple[bool, object]]:
    """name -> (whether the output views the first argument, the call)."""
    ops = torch.ops.aten
    conv = ops.convolution.default
    return {
        "mul": (False, lambda x, w: ops.mul.Tensor(x, x)),
        "convolution": (
            False,
            lambda x, w: conv(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        ),
        "batch norm": (
            False,
            lambda x, w: ops.native_batch_norm.default(x, None, None, None, None, True, 0.1, 1e-5),
        ),
        "sum": (False, lambda x, w: ops.sum.dim_IntList(x, [2, 3])),
        "cast": (False, lambda x, w: ops._to_copy.default(x, dtype=torch.float16)),
        "transpose": (True, lambda x, w: ops.transpose.int(x, 1, 2)),
        "detach": (True, lambda x, w: ops.detach.default(x)),
        "select": (True, lambda x, w: ops.select.int(x, 1, 3)),
        "slice": (True, lambda x, w: ops.slice.Tensor(x, 2, 1, 4)),
    }


def _metadata(value: object) -> list[tuple[object, ...]]:
    outputs = value if isinstance(value, (tuple, list)) else (value,)
    return [
        (o.shape, o.stride(), o.dtype, o.device, o.storage_offset())
        for o in outputs
        if isinstance(o, torch.Tensor)
    ]


@pytest.mark.parametrize("layout", sorted(_SHAPES))
@pytest.mark.parametrize("name", sorted(_memo_calls()))
def test_remembered_fake_outputs_are_torchs_own_made_fresh_or_on_the_viewed_storage(layout, name):
    """An operation seen before is answered by the fake mode's memo: outputs with the metadata
    torch's own fake mode gives, each on a new storage (or, for a view, on its argument's
    storage at its offset) so that provenance by storage identity stays right."""
    views, call = _memo_calls()[name]
    cpu = torch.device("cpu")
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.empty(_SHAPES[layout], device="meta").to(memory_format=fmt)
    w = torch.empty(8, 8, 3, 3, device="meta").to(memory_format=fmt)
    reference = fake_base.FakeTensorMode()
    with reference:
        expected = _metadata(call(*(fake_mode.fake_tensor(reference, t, cpu) for t in (x, w))))
    mode = fake_mode.new_fake_mode()
    fx, fw = (fake_mode.fake_tensor(mode, t, cpu) for t in (x, w))
    with mode:
        first = call(fx, fw)
        hits = mode.memo.hits
        second = call(fx, fw)
    assert mode.memo.hits > hits  # answered by the memo (or its parts, where torch decomposes it)
    assert _metadata(first) == _metadata(second) == expected
    firsts = first if isinstance(first, tuple) else (first,)
    seconds = second if isinstance(second, tuple) else (second,)
    for a, b in zip(firsts, seconds, strict=True):
        if a is None:
            continue
        assert fake_base.is_fake(b) and b.fake_mode is mode
        if views:
            assert storage.storage_key(b) == storage.storage_key(fx) == storage.storage_key(a)
        else:
            assert storage.storage_key(b) not in (storage.storage_key(a), storage.storage_key(fx))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_operation_torch_fakes_by_a_decomposition_is_answered_whole_the_second_time(device):
    """Layer norm and inference batch norm are faked by Python decompositions returning named
    tuples (tens of operations, milliseconds): the memo answers a repeated call whole, one hit,
    with outputs laid out as the first call's, on storages of their own."""
    ops = torch.ops.aten
    mode = fake_mode.new_fake_mode()
    where = torch.device(device)
    x = fake_mode.fake_tensor(mode, torch.empty(2, 7, 8, device="meta"), where)
    image = fake_mode.fake_tensor(
        mode, torch.empty(2, 8, 5, 5, device="meta").to(memory_format=torch.channels_last), where
    )
    stats = [fake_mode.fake_tensor(mode, torch.empty(8, device="meta"), where) for _ in range(2)]
    calls = [
        lambda: ops.native_layer_norm.default(x, [8], None, None, 1e-5),
        lambda: ops.native_batch_norm.default(image, None, None, *stats, False, 0.1, 1e-5),
    ]
    with mode:
        for call in calls:
            first = call()
            hits = mode.memo.hits
            second = call()
            assert mode.memo.hits == hits + 1
            assert _metadata(second) == _metadata(first)
            assert len({storage.storage_key(t) for t in (*first, *second)}) == 2 * len(first)


def test_the_memo_answers_in_place_and_storage_sharing_operations_as_torch_does():
    """An in-place operation (and the optimizer's ``_foreach_*_``, which returns nothing) is
    answered by the memo with its written argument itself, and ``_unsafe_view`` (whose schema
    promises a fresh tensor) with a tensor on its argument's storage, as torch's fake mode
    answers them; the controls, an in-place operation that changes its argument's metadata
    and one whose output depends on data, are never remembered."""
    ops = torch.ops.aten
    mode = fake_mode.new_fake_mode()
    x = fake_mode.fake_tensor(mode, torch.empty(2, 6, device="meta"), torch.device("cpu"))
    y = fake_mode.fake_tensor(mode, torch.empty(2, 6, device="meta"), torch.device("cpu"))
    row = fake_mode.fake_tensor(mode, torch.empty(6, device="meta"), torch.device("cpu"))
    with mode:
        for round in range(2):
            hits = mode.memo.hits
            assert ops.add_.Tensor(x, y) is x
            assert ops.mul.out(x, y, out=y) is y
            assert ops._foreach_add_.List([x, y], [row, row]) in (None, ())  # broadcast
            viewed = ops._unsafe_view.default(x, [3, 4])
            assert storage.storage_key(viewed) == storage.storage_key(x) and viewed is not x
            assert (viewed.shape, viewed.stride()) == ((3, 4), (4, 1))
            assert mode.memo.hits - hits == (4 if round else 0)
        ops.unsqueeze_.default(x, 0)  # an in-place view: metadata changed, never remembered
    assert x.shape == (1, 2, 6)
    assert mode.memo.key(ops.unsqueeze_.default, (x, 0), {}) is None
    assert mode.memo.key(ops.nonzero.default, (y,), {}) is None  # a data-dependent output


def test_a_fresh_output_is_remembered_whatever_storage_offsets_its_arguments_have():
    """A fresh output's metadata does not depend on where its arguments start in their
    storages: adding a slice of a buffer at another offset (a backward's gradients) is answered
    by the memo, laid out as torch's fake mode lays it out. The control, ``_unsafe_view``,
    returns a tensor on its argument's storage at its argument's offset: it is keyed with the
    offsets, and each slice gets its own."""
    ops = torch.ops.aten
    cl = torch.channels_last
    mode, reference = fake_mode.new_fake_mode(), fake_base.FakeTensorMode()
    cpu = torch.device("cpu")
    metas = (torch.empty(4, 8, 6, 6, device="meta").to(memory_format=cl),)
    metas += (metas[0][:2].clone(),)
    buffer, other = (fake_mode.fake_tensor(mode, m, cpu) for m in metas)
    rows = fake_mode.fake_tensor(mode, torch.empty(4, 6, device="meta"), cpu)
    with mode:
        first, second, row, next_row = buffer[:2], buffer[2:], rows[1], rows[2]
        ops.add.Tensor(first, other)
        hits = mode.memo.hits
        added = ops.add.Tensor(second, other)
        assert mode.memo.hits == hits + 1
        viewed = [ops._unsafe_view.default(r, [2, 3]) for r in (row, next_row, next_row)]
    with reference:
        whole, part = (fake_mode.fake_tensor(reference, m, cpu) for m in metas)
        expected = ops.add.Tensor(whole[2:], part)
    assert second.storage_offset() == 2 * 8 * 6 * 6
    assert _metadata(added) == _metadata(expected)
    assert storage.storage_key(added) not in (
        storage.storage_key(buffer),
        storage.storage_key(other),
    )
    assert [v.storage_offset() for v in viewed] == [6, 12, 12]
    assert mode.memo.hits == hits + 2  # the second slice's view answered at its own offset
    assert all(storage.storage_key(v) == storage.storage_key(rows) for v in viewed)


class _Layer(modes.FunctionLayer):
    def handle(self, func, args, kwargs):
        return func(*args, **kwargs)


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_a_function_layer_is_taken_off_the_stack_only_where_innermost_and_put_back():
    """``function_layer_taken`` takes the innermost torch function mode off the stack where it
    is a function layer, and puts it back on exit (after an error too); a plain mode innermost
    (the control) leaves the stack as it is."""
    stack = torch.overrides._get_current_function_mode_stack
    layer, mode = _Layer(), _Mode()
    with layer:
        with pytest.raises(RuntimeError), modes.function_layer_taken() as taken:
            assert taken is layer and stack() == []
            raise RuntimeError("the audit failed")
        assert stack() == [layer]
        with mode, modes.function_layer_taken() as taken:
            assert taken is None and stack() == [layer, mode]
    assert stack() == []


def test_an_operation_the_memo_keeps_leaves_no_entry_in_torchs_fake_cache(monkeypatch):
    """The memo answers an operation it keeps from its second call on, so the fake mode does
    not build torch's cache key and entry for it (as costly as the dispatch, never read); the
    control: with the memo off, torch's cache holds the same call's entry and answers it."""
    ops = torch.ops.aten
    shape = (3, 17, 5)  # a shape no other test in this process fakes a multiplication of
    cache = fake_base.FakeTensorMode.cache
    for memo_on in (True, False):
        monkeypatch.setattr(fake_mode, "_MEMO", memo_on)
        mode = fake_mode.new_fake_mode()
        x = fake_mode.fake_tensor(mode, torch.empty(shape, device="meta"), torch.device("cpu"))
        cache.clear()
        with mode:
            first = ops.mul.Tensor(x, x)
            entries = len(cache)
            second = ops.mul.Tensor(x, x)
        assert _metadata(first) == _metadata(second)
        assert entries == (0 if memo_on else 1)
        assert mode.memo.hits == (1 if memo_on else 0)


_CUDA_SWEEP = """
import sys, torch
torch.cuda._device_count_nvml = lambda: 1  # NVML answers: one GPU
if sys.argv[1] == "ask-the-runtime-first":
    torch.cuda.is_available()
from cl_audit.cli import main
sys.argv = ["cl-audit", *sys.argv[2:]]
main()
"""


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="a torch built without CUDA")
@pytest.mark.parametrize("parent", ["asks-nvml", "ask-the-runtime-first"])
def test_an_eager_cuda_sweep_leaves_its_forked_workers_free_to_use_cuda(parent, tmp_path):
    """``torch.cuda.is_available()`` in a sweep's parent made torch refuse CUDA in every forked
    worker: each row of an eager CUDA sweep on an H200 (torch 2.11) failed with "Cannot
    re-initialize CUDA in forked subprocess". The parent now asks through ``cuda_present``
    (NVML, made to answer one GPU here): its workers reach CUDA itself (here they fail for want
    of a driver, on a GPU they run). Control: a parent that asks the runtime first poisons them."""
    report = tmp_path / "sweep.json"
    models = [f"{Path(__file__).with_name('toy_models.py')}:{m}" for m in ("clean_net", "broken")]
    command = [sys.executable, "-c", _CUDA_SWEEP, parent, *models, "--device", "cuda"]
    result = subprocess.run([*command, "--json", str(report)], capture_output=True, text=True)
    assert result.returncode in (0, 1, 3), result.stderr[-2000:]
    rows = json.loads(report.read_text())["models"]
    poisoned = ["re-initialize CUDA in forked subprocess" in (r["message"] or "") for r in rows]
    assert len(rows) == 2
    assert poisoned == [parent == "ask-the-runtime-first"] * 2, [r["message"] for r in rows]


@needs_fake_cuda
def test_an_optimizers_foreach_step_on_fake_tensors_reaches_no_fake_kernel(monkeypatch):
    """SGD's and AMP's foreach operations write lists of tensors in place and return nothing:
    where the lists agree index by index (shape, dtype, device) the fake mode answers them
    from their arguments, without torch's fake kernel (a broadcast check per tensor in
    Python), and every tensor keeps its metadata. Control: lists whose shapes differ index by
    index go to torch's kernel, which refuses them as a device's would."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode, cuda = fake_mode.new_fake_mode(), torch.device("cuda")
    shapes = [(8, 3, 3, 3), (8,)]

    def fakes() -> list[torch.Tensor]:
        metas = [torch.empty(s, device="meta") for s in shapes]
        metas[0] = metas[0].to(memory_format=torch.channels_last)
        return [fake_mode.fake_tensor(mode, m, cuda) for m in metas]

    buffers, grads, found = fakes(), fakes(), fake_mode.fake_tensor(mode, torch.empty(()), cuda)
    scale = fake_mode.fake_tensor(mode, torch.empty(()), cuda)
    reached: list[str] = []
    kernel = FakeTensorMode._dispatch_impl

    def counted(self, func, *args):
        reached.append(str(func))
        return kernel(self, func, *args)

    monkeypatch.setattr(FakeTensorMode, "_dispatch_impl", counted)
    with mode:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, scale)
        torch._foreach_mul_(buffers, 0.9)
        torch._foreach_add_(buffers, grads, alpha=0.1)
    assert reached == []
    assert [(b.shape, b.stride()) for b in buffers] == [((8, 3, 3, 3), (27, 1, 9, 3)), ((8,), (1,))]
    with mode, pytest.raises(RuntimeError):
        torch._foreach_add_(buffers, grads[::-1])
    assert "aten._foreach_add_.List" in reached


def test_a_remembered_output_is_made_as_torchs_fake_tensor_constructor_makes_it(monkeypatch):
    """A memo hit makes its outputs by ``fake_maker``'s faster path: each is what
    ``FakeTensor(mode, meta, device)`` makes (type, attributes, device, dispatch keys, strides,
    a refused data pointer), fresh or a view on its argument's storage. Control: where the
    constructor's attributes are not all plain values, the maker is the constructor."""
    from torch._subclasses.fake_tensor import FakeTensor

    mode, cuda = fake_mode.new_fake_mode(), torch.device("cuda:0")
    x = fake_mode.fake_tensor(mode, torch.empty(4, 6, device="meta"), cuda)
    with mode:
        made = [torch.ops.aten.mul.Tensor(x, x), torch.ops.aten.t.default(x)]
        hits = mode.memo.hits
        made += [torch.ops.aten.mul.Tensor(x, x), torch.ops.aten.t.default(x)]
    assert mode.memo.hits == hits + 2
    for first, again in (made[::2], made[1::2]):
        meta = torch.empty_strided(again.shape, again.stride(), device="meta")
        constructed = FakeTensor(mode, meta, cuda)
        assert fake_base._described(again) == fake_base._described(first)
        assert type(again) is FakeTensor and vars(again) == vars(constructed)
        assert again.device == cuda and again.stride() == first.stride()
    assert storage.storage_key(made[3]) == storage.storage_key(x)
    assert fake_base.fake_maker(mode, cuda).__name__ == "made"
    strict = fake_mode.new_fake_mode()
    strict._allow_unsafe_data_ptr_access = False  # torch's default: a data pointer refused
    for make in (
        fake_base.fake_maker(strict, cuda),
        functools.partial(FakeTensor, strict, device=cuda),
    ):
        with pytest.raises(RuntimeError, match="data pointer"):
            make(torch.empty(2, device="meta")).data_ptr()
    monkeypatch.setattr(fake_base, "_PLAIN_STATE", ())
    maker = fake_base.fake_maker(mode, cuda)
    assert maker.func is FakeTensor and maker.args == (mode,)
