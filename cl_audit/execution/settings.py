"""What one audit runs with: enums for every choice a user makes, and one frozen settings object.

The CLI parses strings into these at its boundary; ``execution.plan.plan_run`` resolves them
once into the run plan that every audit (the Python API, the CLI, the sweep worker) runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cl_audit.enums import Amp, DType, Engine, Optimizer, Strategy, TensorMode
from cl_audit.errors import UsageError
from cl_audit.report.compiled_speed import CompileOptions
from cl_audit.report.environment import dtype_name
from cl_audit.report.verdict import GATE_BATCH, Gate

__all__ = [
    "Amp",
    "AuditSettings",
    "CompileOptions",
    "DType",
    "Engine",
    "Optimizer",
    "Strategy",
    "TensorMode",
    "check_engine",
    "parse_engine",
    "parse_input_size",
    "parse_size",
]


DEFAULT_BATCH = 2


DEFAULT_GATE = Gate(batch=GATE_BATCH)  # 1% of the bytes written and 1 MiB, at batch 32


@dataclass(frozen=True)
class AuditSettings:
    """Everything that decides what one audit runs. ``input_size`` is per sample (None: the
    model's own); ``differential`` re-runs the forward in NCHW to classify terminal losses;
    ``time`` times uninstrumented steps and profiles the audited one (``Timing``)."""

    batch_size: int | None = None  # None: DEFAULT_BATCH, or an example input's own
    input_size: tuple[int, ...] | None = None
    device: str = "cpu"
    dtype: DType = DType.FLOAT32
    amp: Amp | None = None
    engine: Engine = Engine.DISPATCH
    tensor_mode: TensorMode = TensorMode.EAGER
    strategy: Strategy = Strategy.CHANNELS_LAST
    differential: bool = True
    timeline: bool = False  # record the format timeline for the HTML report
    train: bool = False  # a training step: forward with gradients, backward, optimizer step
    optimizer: Optimizer = Optimizer.SGD
    seed: int = 0
    time: bool = False  # time the step and the flagged operations (eager only)
    gate: Gate = DEFAULT_GATE  # when a channels_last-only cost offends
    compile: bool = (
        False  # also Inductor's layout decision per compiled graph (cl_audit.compiled.graphs)
    )
    force_layout_opt: bool = False  # with compile: also the decision under Inductor's force switch
    compile_options: CompileOptions = field(default_factory=lambda: CompileOptions())
    verify: bool = False  # try the cost sites' remedies in what-if runs (phases.verify)
    table: str | None = None  # the speed table to predict with: a name or a file (None: chosen)

    def __post_init__(self) -> None:
        """Combinations that cannot take effect are refused once, here, with the reason."""
        check_engine(self.engine, train=self.train, time=self.time)
        if self.gate.share < 0 or self.gate.bytes < 0:
            raise UsageError("`fail_share` and `fail_bytes` cannot be negative")
        if not 0 <= self.gate.slowdown < 1:
            raise UsageError(f"`fail_slowdown` {100 * self.gate.slowdown:g}: from 0 to under 100")
        if self.gate.batch is not None and self.gate.batch < 1:
            raise UsageError(f"`gate_batch` {self.gate.batch}: a batch is at least 1")
        if self.compile_options != CompileOptions() and not self.compile:
            raise UsageError("the compile options are torch.compile's: add `compile`")
        if self.force_layout_opt and not self.compile:
            raise UsageError("`force_layout_opt` decides `compile`'s graphs again: add `compile`")
        if self.time and self.predicted:
            raise UsageError("`time` measures kernels, and fake tensors run none: drop `fake`")

    @property
    def bfloat16(self) -> bool:
        """Whether convolutions compute in bfloat16 (the dtype, or autocast)."""
        return self.dtype is DType.BFLOAT16 or self.amp is Amp.BF16

    @property
    def compute_dtype(self) -> str:
        """The dtype the operations compute in: autocast's, else the model's (``float16``)."""
        return dtype_name(self.amp.torch_dtype if self.amp is not None else self.dtype.torch_dtype)

    @property
    def predicted(self) -> bool:
        """Fake tensors compute nothing: their verdicts are predictions."""
        return self.tensor_mode is TensorMode.FAKE

    def input_shape(self, model_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The batched input shape, from ``input_size`` or the model's per-sample shape."""
        return (self.batch_size or DEFAULT_BATCH, *(self.input_size or model_shape))


_SIZE_UNITS = {"B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 1000, "MB": 10**6,
               "GB": 10**9, "": 1}  # fmt: skip


def parse_size(text: str, option: str = "--fail-bytes") -> int:
    """A byte count such as ``1MiB``, ``512KiB``, ``2MB`` or ``0``."""
    cleaned = text.strip().upper().replace(" ", "")
    digits = cleaned.rstrip("BKMGI")
    unit = cleaned[len(digits) :]
    try:
        value = float(digits)
    except ValueError:
        value = -1.0
    if value < 0 or unit not in _SIZE_UNITS:
        raise UsageError(f"{option} {text!r}: expected a size such as 1MiB, 512KiB or 0")
    return int(value * _SIZE_UNITS[unit])


def check_engine(engine: Engine, *, train: bool = False, time: bool = False) -> None:
    """Training and timing audits need the dispatch engine."""
    if train and engine is not Engine.DISPATCH:
        raise UsageError("`train` needs `engine` dispatch: the patch engine sees no backward")
    if time and engine is not Engine.DISPATCH:
        raise UsageError("`time` needs `engine` dispatch (it labels each aten call)")


def parse_engine(engine: Engine | str) -> Engine:
    """An engine by name, refusing unknown ones with the choices."""
    try:
        return Engine(engine)
    except ValueError:
        choices = ", ".join(e.value for e in Engine)
        raise ValueError(f"unknown engine {engine!r}; choose one of: {choices}") from None


def parse_input_size(text: str) -> tuple[int, ...]:
    """``3x224x224`` (images) or ``3x16x112x112`` (clips) to a tuple."""
    try:
        dims = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) not in (3, 4):
        raise UsageError(f"`input_size` {text!r}: expected CxHxW or CxTxHxW, e.g. 3x224x224")
    if min(dims) < 1:
        raise UsageError(f"`input_size` {text!r}: each size is at least 1, not {min(dims)}")
    return dims
