"""Training audits: forward, backward and optimizer step, with phases and attribution."""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch
import training_models as tm
from torch.overrides import TorchFunctionMode
from torch_checks import BACKWARD_PROBLEM, FAKE_CUDA_PROBLEM, needs_fake_cuda, needs_node_by_node
from typer.testing import CliRunner

from cl_audit import compat
from cl_audit.cli import app
from cl_audit.compat import fake_base, modes
from cl_audit.errors import ModelFailedError, Stage, UsageError
from cl_audit.execution.settings import Amp, AuditSettings, Engine, Optimizer, Strategy, TensorMode
from cl_audit.fake import memo as fake_memo
from cl_audit.fake import mode as fake_mode
from cl_audit.fake.backward import recording_hooks
from cl_audit.fake.cuda_probe import fake_cuda_problem
from cl_audit.intercept import dispatch
from cl_audit.phases.audit_module import audit_module
from cl_audit.report import Phase, RegainSource, Verdict
from cl_audit.report.codec import encode

SPEC = f"{Path(__file__).with_name('training_models.py')}:activation_before_pool"
ANY_COST = ("--fail-share", "0", "--fail-bytes", "0")  # these models' costs are KiB
# the runs a fake rule is checked in: eager CPU (the reference), fake CPU, fake CUDA
EAGER_AND_FAKE = (
    {},
    {"tensor_mode": TensorMode.FAKE},
    {"tensor_mode": TensorMode.FAKE, "device": "cuda"},
)


def train(model: torch.nn.Module, **settings: object):
    return audit_module(model, (torch.randn(2, 3, 16, 16),), AuditSettings(train=True, **settings))


def line_of(text: str) -> str:
    lines, first = inspect.getsourcelines(tm.ActivationBeforePool.forward)
    return f"training_models.py:{first + next(i for i, t in enumerate(lines) if text in t)}"


@pytest.mark.parametrize("optimizer", list(Optimizer))
def test_activation_before_a_pool_loses_the_format_in_backward_caused_by_the_pool(optimizer):
    report = train(tm.ActivationBeforePool(), optimizer=optimizer)
    (loss,) = report.offenders
    assert loss.phase is Phase.BACKWARD
    assert (loss.python_op, loss.aten_op) == ("HardtanhBackward0", "aten.hardtanh_backward")
    assert (loss.module_path, loss.module_class) == ("act", "Hardtanh")
    assert loss.call_site.endswith(line_of("self.fc(")) and loss.round_trips == 1
    root = loss.root_cause
    assert (root.python_op, root.module_path) == ("MeanBackward1", "pool")
    (regain,) = [f for f in report.regains if f.phase is Phase.BACKWARD]
    assert regain.aten_op == "aten.convolution_backward" and regain.module_path == "conv"
    assert regain.regain_source is RegainSource.LOSS
    env = report.environment
    assert (env.train, env.optimizer) == (True, optimizer.value)


def test_the_same_model_keeps_channels_last_in_inference():
    """The control: forward only, nothing is lost."""
    report = audit_module(tm.ActivationBeforePool(), (torch.randn(2, 3, 16, 16),), AuditSettings())
    assert report.offenders == () and not report.environment.train


def test_a_gradient_laid_out_unlike_its_parameter_is_listed():
    report = train(tm.NonDenseWeight(), strategy=Strategy.AS_GIVEN)
    (mismatch,) = report.gradient_layouts
    assert mismatch.parameter == "weight" and mismatch.shape == (8, 3, 3, 3)
    assert mismatch.parameter_strides == (54, 18, 3, 1)
    assert mismatch.gradient_strides == (27, 9, 3, 1)
    assert train(tm.ActivationBeforePool()).gradient_layouts == ()  # the control


def test_bf16_autocast_is_reported_and_fp16_uses_a_scaler_eagerly():
    assert train(tm.ActivationBeforePool(), amp=Amp.BF16).environment.autocast == "cpu:bfloat16"
    fp16 = train(tm.ActivationBeforePool(), amp=Amp.FP16)
    assert fp16.environment.autocast == "cpu:float16"


@needs_node_by_node
def test_fake_training_loses_the_format_where_eager_does_at_the_activations_backward():
    """mobilenet_v2's head: the activation's backward kernel iterates over the pool's NCHW
    gradient first, so it returns NCHW, in a fake step as in eager (torch's own fake
    decomposition followed the channels_last input instead: the divergence the measured
    tables name); the report names the table fake runs apply."""
    from cl_audit.predict.divergences import divergence_table

    fake = train(tm.ActivationBeforePool(), tensor_mode=TensorMode.FAKE)
    eager = train(tm.ActivationBeforePool())
    assert fake.predicted and fake.environment.train
    for report in (fake, eager):
        (loss,) = [f for f in report.offenders if f.aten_op == "aten.hardtanh_backward"]
        assert loss.root_cause.python_op == "MeanBackward1"
    assert fake.environment.fake_divergences == divergence_table("cpu").name


def test_training_refuses_what_it_cannot_do():
    with pytest.raises(UsageError, match="`train` needs `engine` dispatch"):
        train(tm.ActivationBeforePool(), engine=Engine.PATCH)


@needs_node_by_node
def test_fake_fp16_training_runs_under_autocast_with_the_scalers_arithmetic():
    report = train(tm.ActivationBeforePool(), tensor_mode=TensorMode.FAKE, amp=Amp.FP16)
    assert report.predicted and report.environment.autocast == "cpu:float16"
    backward = [f for f in report.offenders + report.regains if f.phase is Phase.BACKWARD]
    assert backward and any(t.dtype == "float16" for f in backward for t in f.inputs)


def _site(model: type, text: str) -> str:
    lines, first = inspect.getsourcelines(model.forward)
    return f"training_models.py:{first + next(i for i, t in enumerate(lines) if text in t)}"


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", marks=needs_node_by_node),
        pytest.param("cuda", marks=[needs_fake_cuda, needs_node_by_node]),
    ],
)
def test_a_fake_step_finds_the_backward_only_loss_at_its_forward_line(device):
    """Fake training runs its backward node by node on the device's fake tensors: the loss that
    only the backward makes (a custom Function's) is found and placed as the eager audit
    places it."""
    eager = train(tm.BackwardOnlyLoss())
    report = train(tm.BackwardOnlyLoss(), tensor_mode=TensorMode.FAKE, device=device)
    assert report.environment.mode is TensorMode.FAKE_STEP and report.predicted
    assert report.environment.device == device
    (loss,) = report.offenders
    assert loss.phase is Phase.BACKWARD
    assert (loss.python_op, loss.aten_op) == ("_ContiguousGradientBackward", "aten.clone")
    assert (loss.module_path, loss.call_site) == ("head", _site(tm.BackwardOnlyLoss, "self.head("))
    assert loss.inputs[0].device.startswith(device)
    (regain,) = [f for f in report.regains if f.phase is Phase.BACKWARD]
    assert regain.aten_op == "aten.convolution_backward" and regain.module_path == "conv"
    same = ("phase", "python_op", "aten_op", "module_path", "call_site", "count")
    assert [[getattr(f, k) for k in same] for f in eager.offenders + eager.regains] == [
        [getattr(f, k) for k in same] for f in report.offenders + report.regains
    ]


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", marks=needs_node_by_node),
        pytest.param("cuda", marks=[needs_fake_cuda, needs_node_by_node]),
    ],
)
def test_a_fake_step_of_a_model_that_keeps_the_format_is_clean(device):
    """The control: the node-by-node backward adds no loss of its own."""
    report = train(tm.KeepsFormat(), tensor_mode=TensorMode.FAKE, device=device)
    assert report.environment.mode is TensorMode.FAKE_STEP
    assert report.offenders == () and report.verdict is Verdict.CLEAN


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", marks=needs_node_by_node),
        pytest.param("cuda", marks=[needs_fake_cuda, needs_node_by_node]),
    ],
)
def test_a_fake_step_runs_the_hooks_a_forward_registers_on_its_activations(device):
    """A hook the model's forward registers on an activation (under the audit, which hears
    every call) runs in the node-by-node backward as torch's engine runs it: its contiguous
    gradient is found in the backward, as the eager audit finds it; the control, the same model
    without the hook, is clean. ``Tensor.register_hook`` is torch's own again afterwards."""
    register = torch.Tensor.register_hook
    eager = train(tm.HookedActivation())
    report = train(tm.HookedActivation(), tensor_mode=TensorMode.FAKE, device=device)
    assert torch.Tensor.register_hook is register
    (loss,) = report.offenders
    assert (loss.phase, loss.aten_op) == (Phase.BACKWARD, "aten.clone")
    same = ("phase", "python_op", "aten_op", "module_path", "call_site", "count")
    assert [[getattr(f, k) for k in same] for f in eager.offenders] == [
        [getattr(f, k) for k in same] for f in report.offenders
    ]
    control = train(tm.HookedActivation(hooked=False), tensor_mode=TensorMode.FAKE, device=device)
    assert control.offenders == ()


def test_recording_hooks_gives_torch_its_register_hook_back_when_the_forward_fails():
    """``recording_hooks`` wraps ``Tensor.register_hook`` only while the forward runs."""
    register = torch.Tensor.register_hook
    with pytest.raises(RuntimeError, match="the forward failed"), recording_hooks():
        assert torch.Tensor.register_hook is not register
        raise RuntimeError("the forward failed")
    assert torch.Tensor.register_hook is register


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", marks=needs_node_by_node),
        pytest.param("cuda", marks=[needs_fake_cuda, needs_node_by_node]),
    ],
)
def test_a_fake_step_lays_an_activations_gradient_out_as_its_kernel(device):
    """A hard-swish given NCHW input before a channels_last convolution: its backward kernel
    iterates over the channels_last gradient first and keeps it (eager CPU training, the
    kernel, says so); the fake step agrees instead of reporting the loss torch's fake
    decomposition made up. Positive control: the forward's own loss (``.contiguous()``) is
    still found, in both."""
    eager = train(tm.ActivationAfterLostFormat())
    fake = train(tm.ActivationAfterLostFormat(), tensor_mode=TensorMode.FAKE, device=device)
    for report in (eager, fake):
        found = [(f.phase, f.python_op, f.module_path) for f in report.offenders]
        assert found == [(Phase.FORWARD, "Tensor.contiguous", "")]


@needs_fake_cuda
@needs_node_by_node
def test_a_fake_cuda_step_finds_cudnn_batch_norm_converting_its_gradient():
    """A batch norm given NCHW input between channels_last convolutions: on CUDA its backward
    (CudnnBatchNormBackward0) converts the channels_last gradient to its input's layout, found
    at the batch norm; cuDNN's outputs come from its kernel's allocations, not torch's fake
    decomposition. Control: channels_last input, no backward loss."""
    report = train(tm.NormAfterLostFormat(), tensor_mode=TensorMode.FAKE, device="cuda")
    found = [(f.phase, f.python_op, f.module_path) for f in report.offenders]
    assert (Phase.BACKWARD, "CudnnBatchNormBackward0", "bn") in found
    control = train(tm.NormAfterLostFormat(lost=False), tensor_mode=TensorMode.FAKE, device="cuda")
    assert control.offenders == ()


@needs_fake_cuda
@needs_node_by_node
def test_a_fake_cuda_step_lays_batch_norm_gradients_out_as_cuda_kernels_do():
    """CUDA's batch norm backward lays the input gradient out as its input in training, the
    native kernel (no affine weight; bfloat16, measured on an H200) as cuDNN's: a channels_last
    input given an NCHW gradient regains the format at the norm, an NCHW input given a
    channels_last gradient loses it there; a frozen (eval-mode) norm's backward is contiguous
    whatever it is given, a loss. Torch's fake decomposition followed the gradient in each.
    Control: cuDNN's (affine, float32), which converts the incoming gradient first, as before."""

    def at_norm(model: torch.nn.Module) -> list[tuple[str, str]]:
        report = train(model, tensor_mode=TensorMode.FAKE, device="cuda")
        return [
            (kind, f.aten_op)
            for kind, found in (("loss", report.offenders), ("regain", report.regains))
            for f in found
            if f.phase is Phase.BACKWARD and f.module_path == "bn"
        ]

    native = "aten.native_batch_norm_backward"
    assert at_norm(tm.NormBeforeLostFormat(affine=False)) == [("regain", native)]
    assert at_norm(tm.NormAfterLostFormat(affine=False)) == [("loss", native)]
    assert at_norm(tm.NormAfterLostFormat(lost=False, frozen=True)) == [("loss", native)]
    assert at_norm(tm.NormBeforeLostFormat()) == [("regain", "aten.clone")]  # cuDNN converts


class _CallsSeen(TorchFunctionMode):
    """A model's own torch function mode: what it is handed, by the file that called it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[tuple[str, str]] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame.f_code.co_name == "__torch_function__" or frame.f_code.co_filename.endswith(
            ("torch/overrides.py", "torch/_compile.py", "torch/_dynamo/eval_frame.py")
        ):
            frame = frame.f_back  # modes' handlers and torch's handing out: not the caller
        operator = isinstance(func, torch._ops.OpOverload)
        name = f"{func.namespace}.{func.__name__}" if operator else func.__name__
        self.seen[(name, frame.f_code.co_filename)] += 1
        return func(*args, **(kwargs or {}))


_OWN = [
    Path(compat.__file__).parents[1] / p
    for p in ("intercept", "rule/layout.py", "execution/training.py", "fake/backward.py")
]
assert all(p.exists() for p in _OWN), _OWN  # a moved file would leave its calls unchecked
_READS = {"stride", "dim", "numel", "element_size", "untyped_storage", "__get__", "__set__"}


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param(EAGER_AND_FAKE[0], id="eager"),
        pytest.param(EAGER_AND_FAKE[1], id="fake-cpu", marks=needs_node_by_node),
        pytest.param(
            EAGER_AND_FAKE[2], id="fake-cuda", marks=[needs_fake_cuda, needs_node_by_node]
        ),
    ],
)
def test_a_models_torch_function_mode_sees_its_calls_and_none_of_the_audits_bookkeeping(settings):
    """The checker's reads of every operation's tensors, the operators its dispatch observer
    passes on and the node-by-node backward's bookkeeping are no calls of the model: a torch
    function mode (the model's, or cl-audit's own, each of which costs a call about 1 µs) is
    handed none of them, nor the operations torch's engine runs in C++ (adding a residual's
    gradients, summing a broadcast scale's). The control: the model's own calls reach it."""
    mode = _CallsSeen()
    with mode:
        train(tm.ResidualScaled(), **settings)
    assert {"conv2d", "hardtanh", "linear", "add", "mul"} <= {n for n, _ in mode.seen}
    assert not [(n, f) for n, f in mode.seen if n.startswith("aten.")]
    own = [(n, f) for n, f in mode.seen if n in _READS and any(f.startswith(str(p)) for p in _OWN)]
    assert own == []
    engine = [(n, f) for n, f in mode.seen if f == str(_OWN[-1])]
    assert engine == []


@needs_fake_cuda
@needs_node_by_node
def test_a_resized_position_table_copies_its_gradient_in_both_layouts_as_kernels_do():
    """A (1, H, W, C) position table resized to the tokens' grid (timm's naflexvit): its
    gradient comes back through a view whose size-1 batch stride the kernels make NCHW, so the
    table's gradient is NCHW in either run and AccumulateGrad copies it in both: no loss, as the
    eager CPU step and an H200 (naflexvit's radio models, clean) measure. The fake steps, CPU
    and CUDA, found a channels_last-only AccumulateGrad copy of the whole table while torch's
    fake view gave that stride otherwise. Control: the table added unresized, reshaped, whose
    gradient AccumulateGrad copies into the channels_last table only: found by all three."""

    def accumulated(resized: bool, **settings: object) -> list[str]:
        report = train(tm.ResizedPositions(resized), **settings)
        return [s.op for s in report.cost.sites if s.op == "torch::autograd::AccumulateGrad"]

    for settings in EAGER_AND_FAKE:
        assert accumulated(True, **settings) == []
        assert accumulated(False, **settings) == ["torch::autograd::AccumulateGrad"]


@needs_fake_cuda
@needs_node_by_node
def test_a_layer_norms_input_gradient_is_contiguous_in_fake_steps_as_its_kernels_write_it():
    """A layer norm over a channels_last map's permuted tokens given a strided gradient (a
    global pool's, permuted): the CPU and CUDA kernels write the input gradient contiguous, so
    the map's gradient is channels_last once permuted back and the stem's convolution keeps it.
    Torch 2.14's fake gradient followed the strided one: the fake steps found the convolution
    regaining the format where eager does not (CoAtNet's ``LayerNorm2d``: a backward ``add`` of
    two layouts in 16 models). Control: tokens scaled by a vector, whose backward keeps the
    strided gradient: a regain at the convolution in every run."""

    def regains(norm: bool, **settings: object) -> list[str]:
        report = train(tm.NormedTokensPooled(norm), **settings)
        return [f.module_path for f in report.regains if f.phase is Phase.BACKWARD]

    for settings in EAGER_AND_FAKE:
        assert regains(True, **settings) == []
        assert regains(False, **settings) == ["stem"]


@needs_fake_cuda
@needs_node_by_node
def test_a_fake_cuda_step_runs_the_attention_kernel_a_gpu_picks():
    """Fake tensors without a GPU take attention's math path. A Hopper GPU runs cuDNN's kernel
    for float16 attention and the memory-efficient one where the mask learns (an H200 measured
    both): the fake step runs those kernels' operators, so their backward, not the math path's
    copies, is what it finds at the attention's line (CoAtNet's blocks, which the math path
    predicted offending and the H200 measured minor or clean). Control: transposed queries,
    dense in their last dimension only where the map is channels_last: the NCHW run keeps the
    math path (no fused kernel takes them), the channels_last run gets the kernel."""
    lines, first = inspect.getsourcelines(tm.MapAttention.forward)
    line = first + next(i for i, t in enumerate(lines) if "scaled_dot_product_attention(" in t)

    def at_attention(model: torch.nn.Module) -> tuple[set[str], dict[str, int]]:
        report = train(model, tensor_mode=TensorMode.FAKE, device="cuda", amp=Amp.FP16)
        found = {
            f.aten_op
            for f in report.offenders
            if f.phase is Phase.BACKWARD and f.call_site.endswith(f"training_models.py:{line}")
        }
        return found, {o.op: o.applied for o in report.environment.kernel_overrides}

    efficient, cudnn = "aten._scaled_dot_product_efficient_attention", (
        "aten._scaled_dot_product_cudnn_attention"
    )  # fmt: skip
    assert at_attention(tm.MapAttention()) == ({f"{efficient}_backward"}, {efficient: 2})
    assert at_attention(tm.MapAttention(learned=False)) == ({f"{cudnn}_backward"}, {cudnn: 2})
    assert at_attention(tm.MapAttention(dense=False))[1] == {efficient: 1}


@needs_node_by_node
@needs_fake_cuda
@pytest.mark.parametrize(("amp", "dtype"), [(Amp.FP16, "float16"), (Amp.BF16, "bfloat16")])
def test_a_fake_cuda_step_runs_in_the_dtypes_cuda_autocast_chooses(amp, dtype):
    """CUDA's autocast policy, applied by CUDA's autocast to the forward on fake CUDA tensors:
    the backward of the activation after the convolution runs in the low dtype, as on a
    GPU."""
    problem = fake_cuda_problem(bfloat16=True) if amp is Amp.BF16 else None
    if problem is not None:
        pytest.skip(f"this torch refuses fake CUDA bfloat16: {problem}")
    report = train(tm.ActivationBeforePool(), tensor_mode=TensorMode.FAKE, device="cuda", amp=amp)
    assert report.environment.autocast == f"cuda:{dtype}"
    (activation,) = [f for f in report.offenders if f.python_op == "HardtanhBackward0"]
    assert {t.dtype for t in activation.inputs} == {dtype} and activation.module_path == "act"
    fp32 = train(tm.ActivationBeforePool(), tensor_mode=TensorMode.FAKE, device="cuda")
    (control,) = [f for f in fp32.offenders if f.python_op == "HardtanhBackward0"]
    assert {t.dtype for t in control.inputs} == {"float32"}


@needs_node_by_node
@needs_fake_cuda
def test_a_custom_autograd_functions_backward_runs_under_cuda_autocast():
    """The Function's own backward runs on the fp16 gradient autocast's forward gave it, and
    its NCHW copy is found at its forward line; without it (KeepsFormat) no loss."""
    report = train(tm.BackwardOnlyLoss(), tensor_mode=TensorMode.FAKE, device="cuda", amp=Amp.FP16)
    (loss,) = report.offenders
    assert (loss.python_op, loss.aten_op) == ("_ContiguousGradientBackward", "aten.clone")
    assert loss.module_path == "head" and {t.dtype for t in loss.inputs} == {"float16"}
    control = train(tm.KeepsFormat(), tensor_mode=TensorMode.FAKE, device="cuda", amp=Amp.FP16)
    assert control.offenders == ()


class _PassedOn(modes.TorchDispatchMode):
    """Another dispatch mode, passing every operation on."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@needs_node_by_node
@needs_fake_cuda
@pytest.mark.parametrize("model", [tm.BackwardOnlyLoss, tm.KeepsFormat])
def test_an_audit_in_cl_audits_fake_mode_observes_as_a_layer_of_it_and_reports_as_a_mode(model):
    """Inside cl-audit's fake mode with no other dispatch mode active, the audit's observer
    runs as a layer of the fake mode (a dispatch hop less an operation: ~5% of a fake training
    step); with another mode active, as a dispatch mode above it, as before. A training step
    predicted for CUDA with AMP reports alike both ways (every field): the backward-only loss
    at its forward line, the control clean."""
    settings = {"tensor_mode": TensorMode.FAKE, "device": "cuda", "amp": Amp.FP16}
    layered = mock.patch.object(dispatch, "dispatch_layer", wraps=fake_mode.dispatch_layer)
    with layered as as_layer:
        report = train(model(), **settings)
    assert as_layer.call_count == 2  # the audited run's observer and the NCHW run's
    with layered as as_layer, _PassedOn():
        under_mode = train(model(), **settings)
    assert as_layer.call_count == 0
    assert json.dumps(encode(report)) == json.dumps(encode(under_mode))
    assert len(report.offenders) == (model is tm.BackwardOnlyLoss)


@needs_node_by_node
@needs_fake_cuda
@pytest.mark.parametrize("model", [tm.MapAttention, tm.KeepsFormat])
def test_the_audits_function_mode_does_the_attention_kernels_work_and_reports_alike(model):
    """On fake CUDA, the attention kernels' function mode is the innermost when an audit
    begins: the audit's own function mode does its work in its place (a function hop less a
    call: 1.7% of a fake training audit), in the audited run and the NCHW run. A training step
    with attention reports alike (every field, the kernels' counts too) with the mode kept as
    before (the control); the attention model's fused kernels are applied in both."""
    settings = {"tensor_mode": TensorMode.FAKE, "device": "cuda", "amp": Amp.FP16}
    taken: list[str] = []

    @contextlib.contextmanager
    def noting() -> Iterator[modes.FunctionLayer | None]:
        with modes.function_layer_taken() as layer:
            taken.append(type(layer).__name__)
            yield layer

    with mock.patch.object(dispatch, "function_layer_taken", noting):
        report = train(model(), **settings)
    assert taken == ["AttentionKernelMode", "AttentionKernelMode"]
    with mock.patch.object(dispatch, "function_layer_taken", lambda: contextlib.nullcontext()):
        as_mode = train(model(), **settings)
    assert json.dumps(encode(report)) == json.dumps(encode(as_mode))
    assert bool(report.environment.kernel_overrides) == (model is tm.MapAttention)


_META_FAKED = {
    torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default,
    torch.ops.aten._scaled_dot_product_efficient_attention_backward.default,
    torch.ops.aten.native_batch_norm_backward.default,
}


@needs_node_by_node
@pytest.mark.parametrize(
    "model, settings",
    [
        pytest.param(lambda: tm.MapAttention(learned=False), {"device": "cuda", "amp": Amp.FP16}),
        pytest.param(tm.MapAttention, {"device": "cuda"}),
        pytest.param(tm.NormAfterLostFormat, {}),
    ],
    ids=["cudnn-attention", "efficient-attention", "cpu-batch-norm"],
)
def test_backward_operations_faked_by_their_meta_kernels_report_as_torchs_fake_path(
    model, settings
):
    """The fused attention kernels' backward (cuDNN's under float16, the memory-efficient one
    for a mask that learns) and batch norm's (the CPU's) are faked by their kernels for the
    meta device, 0.1 against 0.7 ms a call, never reaching torch's fake dispatch (counted):
    the training step's report is field for field the one torch's fake path gives (the same
    step with them left to torch: the control, which reaches it)."""
    if settings.get("device") == "cuda" and FAKE_CUDA_PROBLEM:
        pytest.skip(FAKE_CUDA_PROBLEM)
    settings = {"tensor_mode": TensorMode.FAKE, **settings}
    reached: list = []
    dispatch = fake_base.FakeTensorMode.dispatch

    def counted(self, func, types, args=(), kwargs=None):
        reached.append(func)
        return dispatch(self, func, types, args, kwargs)

    with mock.patch.object(fake_base.FakeTensorMode, "dispatch", counted):
        report = train(model(), **settings)
        ours = set(reached)
        reached.clear()
        with mock.patch.object(fake_mode, "ON_META", fake_mode.ON_META - _META_FAKED):
            control = train(model(), **settings)
    assert not ours & _META_FAKED and set(reached) & _META_FAKED
    assert json.dumps(encode(report)) == json.dumps(encode(control))


def _cli(factory: str, *options: str):
    spec = f"{Path(tm.__file__)}:{factory}"
    return CliRunner().invoke(app, [spec, *options], env={"COLUMNS": "400"})


@needs_node_by_node
@pytest.mark.parametrize(
    "device",
    [pytest.param("cpu"), pytest.param("cuda", marks=needs_fake_cuda)],
)
def test_a_step_the_trace_cannot_follow_fails_in_one_line_naming_the_op_and_line(device):
    """Data-dependent control flow in a fake step: exit 3, one line naming the operation and
    the model's line, with what to do; the same model without the branch is audited."""
    options = ("--train", "--fake", "--device", device)
    result = _cli("branches_on_value", *options)
    assert result.exit_code == 3, result.output
    (line,) = result.stderr.strip().splitlines()
    branch = _line(tm.BranchesOnValue.forward, "if y.mean()")
    assert f"forward failed in aten._local_scalar_dense at training_models.py:{branch}:" in line
    assert "audit it eagerly, without --fake" in line and "Traceback" not in result.output
    assert _cli("keeps_format", *options, "--json", "-").exit_code == 0  # the control


@needs_node_by_node
@needs_fake_cuda
@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the LSTM's CUDA path runs")
def test_an_op_that_asks_the_cuda_runtime_fails_naming_it_never_on_the_cpu_silently():
    """An LSTM's CUDA path asks cuDNN about the device: a fake CUDA audit without a GPU says
    which operation at which line, and that the CPU can be audited; --device cpu audits it."""
    amp = ("--train", "--fake", "--device", "cuda", "--amp", "fp16")
    for options in (("--fake", "--device", "cuda"), amp):
        result = _cli("recurrent_head", *options)
        assert result.exit_code == 3, result.output
        (line,) = result.stderr.strip().splitlines()[-1:]
        rnn = _line(tm.RecurrentHead.forward, "self.rnn(")
        assert f"failed in torch.lstm at training_models.py:{rnn}:" in line
        assert "asks the device runtime" in line and "--device cpu" in line
    assert _cli("recurrent_head", "--train", "--fake", "--json", "-").exit_code in (0, 1)


@needs_node_by_node  # the prime serves fake steps, which run their backward node by node
@pytest.mark.parametrize("optimizer", list(Optimizer))
def test_priming_a_step_makes_the_optimizer_state_in_each_parameters_layout(optimizer):
    """A fake step warms up without running a first step: ``Step.prime`` makes the optimizer's
    state (momentum, Adam's moments) as fake tensors laid out as their channels_last parameter,
    on its device, as a real first step does (the control: the same state tensors, the same
    strides, on the CPU), and leaves no gradient behind. Parameters alike (two convolutions of
    one shape) share one meta step, yet each gets state on a storage of its own."""
    from cl_audit.compat.fake_base import is_fake
    from cl_audit.compat.storage import storage_key
    from cl_audit.execution.plan import plan_run
    from cl_audit.execution.training import Step
    from cl_audit.fake.mode import fake_tensor, new_fake_mode

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 3), torch.nn.Conv2d(8, 8, 3)
    ).to(memory_format=torch.channels_last)
    weight = model[1].weight
    mode, cpu = new_fake_mode(), torch.device("cpu")
    fakes = {n: fake_tensor(mode, p.detach(), cpu) for n, p in model.named_parameters()}
    fake_plan = plan_run(
        AuditSettings(train=True, optimizer=optimizer, tensor_mode=TensorMode.FAKE)
    )
    primed = Step(fake_plan, {n: t.requires_grad_() for n, t in fakes.items()})
    with mode:
        primed.prime()
    assert all(t.grad is None for t in fakes.values())
    stepped = Step(
        plan_run(AuditSettings(train=True, optimizer=optimizer)), dict(model.named_parameters())
    )
    stepped.run(lambda: model(torch.randn(2, 3, 12, 12)), None)  # a real first step: the control
    assert weight.grad is not None
    for step in (primed, stepped):
        state = step.state_tensors()
        weights = [t for t in state if t.shape == weight.shape]
        assert len(weights) >= 2 and all(t.stride() == weight.stride() for t in weights)
    made, real = primed.state_tensors(), stepped.state_tensors()
    assert [(t.shape, t.stride(), t.dtype) for t in made] == [
        (t.shape, t.stride(), t.dtype) for t in real
    ]
    assert all(is_fake(t) and t.device == cpu for t in made)
    assert len({storage_key(t) for t in made}) == len(made)


def test_fake_scaler_does_what_grad_scaler_does_when_no_gradient_overflows():
    from cl_audit.execution.training import FakeScaler

    def step(scaler_for: object) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Conv2d(3, 4, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = scaler_for
        scaler.scale(model(torch.randn(2, 3, 8, 8)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        return [p.detach().clone() for p in model.parameters()]

    fake = step(FakeScaler(torch.device("cpu")))
    real = step(torch.amp.GradScaler("cpu"))
    assert all(torch.allclose(a, b) for a, b in zip(fake, real, strict=True))


def test_a_batch_of_one_with_batch_norm_fails_in_forward_with_a_hint():
    pool = torch.nn.AdaptiveAvgPool2d(1)  # then one value per channel: train-mode BN refuses
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), pool, torch.nn.BatchNorm2d(4))
    with pytest.raises(ModelFailedError, match="batch of at least 2") as failed:
        audit_module(model, (torch.randn(1, 3, 8, 8),), AuditSettings(train=True))
    assert failed.value.stage is Stage.FORWARD


@pytest.mark.parametrize("train", [False, True])
def test_a_model_only_channels_last_breaks_is_said_so_beside_its_error(train):
    """The failure is tried again in NCHW: where that runs, channels_last is what breaks the
    model, and the error says so; where NCHW fails too (MisViewed), it says nothing of it.
    ReshapedLogits, which copies instead, is audited and its reshape flagged."""
    x = (torch.randn(2, 3, 8, 8),)
    settings = AuditSettings(train=train)
    with pytest.raises(ModelFailedError, match="view size is not compatible") as failed:
        audit_module(tm.ViewedLogits(), x, settings)
    assert "channels_last breaks the model here: the same step runs in NCHW" in str(failed.value)
    assert failed.value.site is not None and failed.value.site.startswith("training_models.py:")
    with pytest.raises(ModelFailedError) as own:
        audit_module(tm.MisViewed(), x, settings)
    assert "channels_last breaks" not in str(own.value)
    report = audit_module(tm.ReshapedLogits(), x, settings)
    assert [f.python_op for f in report.offenders] == ["Tensor.reshape"]


def test_cli_train_reports_the_backward_loss():
    result = CliRunner().invoke(
        app, [SPEC, "--train", "--json", "-", *ANY_COST], env={"COLUMNS": "120"}
    )
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert [f["phase"] for f in data["offenders"]] == ["backward"]
    assert data["environment"]["train"] is True and data["environment"]["optimizer"] == "sgd"


def test_a_factorys_own_loss_is_the_one_back_propagated():
    spec = f"{Path(tm.__file__)}:own_loss"
    result = CliRunner().invoke(
        app, [spec, "--train", "--json", "-", *ANY_COST], env={"COLUMNS": "120"}
    )
    assert result.exit_code == 1, result.output
    (copy,) = json.loads(result.stdout)["offenders"]
    assert copy["python_op"] == "Tensor.contiguous" and copy["phase"] == "forward"
    assert copy["call_site"].endswith(f"training_models.py:{_line(tm.map_loss, 'contiguous')}")
    # the default loss (the sum of the output) makes no such copy: the control
    model = torch.nn.Conv2d(3, 8, 3, padding=1)
    assert (
        audit_module(model, (torch.randn(2, 3, 16, 16),), AuditSettings(train=True)).offenders == ()
    )
    called = []

    def loss(output):
        called.append(output.shape)
        return output.sum()

    from cl_audit.phases.audit_module import audit_model

    conv, x = torch.nn.Conv2d(3, 8, 3), torch.randn(2, 3, 8, 8)
    audit_model(conv, x, train=True, loss=loss, verify=False)
    assert called == [torch.Size([2, 8, 6, 6])] * 4  # a warm-up and the audited step, each format
    called.clear()
    report = audit_model(conv, x, train=True, loss=loss, fail_share=0.0, fail_bytes=0)
    trials = {t for s in report.cost.sites if s.remedy for t in s.remedy.evidence}
    # with the what-if steps: the unchanged step in each layout, then two steps per change, once
    assert len(called) == 4 + 2 + 2 * len(trials)


def _line(function: object, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, t in enumerate(lines) if text in t)


@pytest.mark.skipif(BACKWARD_PROBLEM is None, reason="this torch runs a backward node by node")
def test_a_torch_that_cannot_run_a_backward_node_by_node_refuses_fake_training_with_the_reason():
    with pytest.raises(UsageError, match="a backward run node by node"):
        train(tm.KeepsFormat(), tensor_mode=TensorMode.FAKE)


@pytest.mark.parametrize(
    ("device", "model"),
    [
        pytest.param("cpu", tm.ActivationBeforePool, marks=needs_node_by_node),
        pytest.param("cuda", tm.NormAfterLostFormat, marks=[needs_fake_cuda, needs_node_by_node]),
    ],
)
def test_a_fake_step_reports_the_same_with_or_without_the_fake_modes_memo(
    device, model, monkeypatch
):
    """The fake mode's memo (fake/memo.py) answers repeated operations from their outputs'
    metadata: the whole report, findings, sites and bytes, is the one torch's fake mode alone
    gives; and the memo did answer (the model has a loss to find: the positive control)."""
    hits = []
    lookup = fake_memo.OutputMemo.lookup

    def counted(self, key, func, args, kwargs):
        found = lookup(self, key, func, args, kwargs)
        hits.append(found is not fake_memo.MISSING)
        return found

    monkeypatch.setattr(fake_memo.OutputMemo, "lookup", counted)
    settings = {"tensor_mode": TensorMode.FAKE, "device": device, "amp": Amp.FP16}
    remembered = encode(train(model(), **settings))
    assert any(hits) and remembered["offenders"]
    monkeypatch.setattr(fake_mode, "_MEMO", False)
    hits.clear()
    alone = encode(train(model(), **settings))
    assert not hits
    assert remembered == alone
