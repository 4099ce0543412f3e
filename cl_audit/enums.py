"""Every choice and category cl-audit names, as enums: user strings become these at the
boundary, reports write their values."""

from __future__ import annotations

from enum import Enum, unique

import torch

__all__ = [
    "Amp",
    "BenchVerdict",
    "BucketMatch",
    "CallLabels",
    "CompiledClass",
    "ConvClass",
    "Conversion",
    "CostKind",
    "DType",
    "Differential",
    "DifferentialStatus",
    "Engine",
    "Evidence",
    "LayoutBranch",
    "Mode",
    "ModelSource",
    "Optimizer",
    "Outcome",
    "Phase",
    "Provenance",
    "RegainSource",
    "RemedyStatus",
    "Stage",
    "Status",
    "Strategy",
    "TableMatch",
    "TensorMode",
    "Verdict",
    "Workload",
    "WrapOrder",
]


@unique
class Engine(str, Enum):
    DISPATCH = "dispatch"  # aten-level TorchDispatchMode, named by a TorchFunctionMode
    PATCH = "patch"  # wraps the public callables of torch, torch.Tensor and F


@unique
class CallLabels(str, Enum):
    """Which calls of an audited run run inside a profiler range named by their number."""

    EVERY = "every"  # each call (``--time`` gives each finding its calls' time)
    FIRST = "first"  # the first call of each signature (``intercept.signature``): copies measured
    NONE = "none"

    @classmethod
    def of(cls, value: bool | CallLabels) -> CallLabels:
        """``True`` as ``EVERY``, ``False`` as ``NONE``, a member as itself."""
        if isinstance(value, CallLabels):
            return value
        return cls.EVERY if value else cls.NONE


@unique
class Strategy(str, Enum):
    """How model and input are converted before the audited forward."""

    CHANNELS_LAST = "channels-last"  # as Module.to(memory_format=torch.channels_last) does
    CONV_WEIGHTS = "conv-weights"  # as nn.utils.convert_conv2d_weight_memory_format does
    NCHW = "nchw"  # everything NCHW (NCDHW): the baseline a bench compares with
    AS_GIVEN = "as-given"  # nothing converted: the caller chose the format

    @property
    def compared(self) -> bool:
        """Whether the audit sets an NCHW run beside this one (the model made channels_last)."""
        return self in (Strategy.CHANNELS_LAST, Strategy.CONV_WEIGHTS)


@unique
class DType(str, Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.value)


@unique
class Amp(str, Enum):
    BF16 = "bf16"
    FP16 = "fp16"

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self is Amp.BF16 else torch.float16


@unique
class Optimizer(str, Enum):
    SGD = "sgd"
    ADAMW = "adamw"


@unique
class TensorMode(str, Enum):
    """How an audit ran its tensors."""

    EAGER = "eager"  # kernels ran on real data
    FAKE = "fake"  # FakeTensors: layouts from the operators' meta functions, a prediction
    # a training step on fake tensors, its backward run node by node (cl_audit.fake.backward)
    FAKE_STEP = "fake-step"
    REPLAYED = "replayed"  # read from report envelopes 6-11: a step traced, then replayed


@unique
class BenchVerdict(str, Enum):
    """How channels-last compares with nchw in a bench, when the rounds can tell."""

    FASTER = "faster"
    SLOWER = "slower"
    INCONCLUSIVE = "inconclusive"  # the rounds spread more than the strategies differ
    NOT_COMPARED = "not-compared"


@unique
class Workload(str, Enum):
    """What an audit runs: one forward, or one training step, each after an unaudited one."""

    INFERENCE = "inference"  # eval mode, no_grad
    TRAINING_STEP = "training-step"  # train mode: forward and loss, backward, optimizer step

    @property
    def train(self) -> bool:
        return self is Workload.TRAINING_STEP

    @property
    def warmup_steps(self) -> int:
        """Untimed, unaudited steps first, in each layout: work a model does once (a lazy
        import or initialisation, a cache filled on the first call) is done before the
        audited run, not charged to the layout that runs first; a training step is audited in
        the steady state (the optimizer's state exists)."""
        return 1


@unique
class ModelSource(str, Enum):
    """Where a model of a sweep or a CLI run comes from."""

    TORCHVISION = "torchvision"
    TIMM = "timm"
    USER = "user"  # module:factory or file.py:factory


@unique
class Phase(str, Enum):
    """When an operation ran in an audited training step."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


@unique
class Conversion(str, Enum):
    """Direction of a memory-format conversion."""

    LOSS = "loss"  # channels_last in, newly materialised contiguous out
    REGAIN = "regain"  # contiguous in, newly materialised channels_last out


@unique
class Provenance(str, Enum):
    """Where the data an operation converted comes from, traced by storage identity."""

    BATCH = "batch"  # the input batch and whatever it flows into: activations
    PARAMETER = "parameter"  # only parameters, buffers and constants made during the forward


@unique
class RegainSource(str, Enum):
    """What made the contiguous input of a regain."""

    LOSS = "loss"  # a recorded loss: the regain closes a round trip
    PRODUCER = "producer"  # an operation that is not a loss; ``root_cause`` names it
    OUTSIDE = "outside"  # data from outside the audit: the input, a parameter or buffer


@unique
class Differential(str, Enum):
    """A terminal loss compared with its counterpart in the same forward run in NCHW."""

    CAUSED = "caused"  # the counterpart ran on other strides: channels_last added this copy
    NEUTRAL = "neutral"  # same input and output strides in NCHW: channels_last changed nothing
    UNALIGNED = "unaligned"  # no counterpart found: counted as caused, and listed


@unique
class DifferentialStatus(str, Enum):
    """Whether terminal losses were compared with a forward run in NCHW."""

    RAN = "ran"
    NOT_NEEDED = "not-needed"  # no terminal activation loss to classify
    SKIPPED = "skipped"  # not asked for (--no-differential, or the audit() context manager)
    FAILED = "failed"  # the NCHW run failed: every terminal loss counts as caused


@unique
class Status(str, Enum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    OUT_OF_MEMORY = "out-of-memory"
    SKIPPED = "skipped"

    @property
    def failed(self) -> bool:
        return self in (Status.ERROR, Status.TIMEOUT, Status.OUT_OF_MEMORY)


@unique
class Mode(str, Enum):
    """How a sweep's row was obtained."""

    EAGER = "eager"  # a real forward pass on the device
    FAKE = "fake"  # fake tensors: layouts from the ops' meta functions, no data
    CONFIRMED = "fake+eager"  # fake mode flagged or failed it, and this is the eager re-run


@unique
class Stage(str, Enum):
    """Where a model failed: importing the user's file, building, preparing the input and
    converting, the forward pass, and in a training step the backward and the optimizer step."""

    IMPORT = "import"
    BUILD = "build"
    SETUP = "setup"
    FORWARD = "forward"
    LOSS = "loss"  # the training step's loss of the forward's output (reports from 13)
    BACKWARD = "backward"
    STEP = "step"
    COMPILE = "compile"  # --compile: Dynamo's and AOTAutograd's capture of the graphs


@unique
class Outcome(str, Enum):
    """What a command came to; the CLI maps each to its exit code."""

    CLEAN = "clean"
    OFFENDING = "offending"  # an offending verdict; with a baseline new offences, costs, failures
    FAILED = "failed"  # a sweep in which some model failed and none offended
    INTERRUPTED = "interrupted"
    TERMINATED = "terminated"  # SIGTERM: as interrupted, with its own exit code


@unique
class Verdict(str, Enum):
    """What channels_last costs a model against NCHW, weighed by the gate."""

    OFFENDING = "offending"  # channels_last-only bytes reach the gate
    MINOR = "minor"  # a channels_last-only cost under the gate
    CLEAN = "clean"  # no channels_last-only cost


@unique
class RemedyStatus(str, Enum):
    """Whether a remedy was proven on the model by a what-if run (``phases.verify``)."""

    VERIFIED = "verified"  # a change made at the site ran, kept the output and cut the cost
    REFUTED = "refuted"  # every change tried failed: not offered as a fix
    LEAD = "lead"  # not tried: the catalogue's advice for the pattern


@unique
class CostKind(str, Enum):
    """What a cost site's bytes are."""

    COPY = "copy"  # an explicit copy operation (contiguous, clone, flatten's copy, ``.to``)
    KERNEL = "kernel"  # a conversion inside a kernel (a convolution converting its input)
    PARAMETER = "parameter"  # either, of parameter-derived data (a standardised weight)


@unique
class Evidence(str, Enum):
    """How the conversions inside kernels were counted."""

    MEASURED = "measured"  # the profiler's copies inside each operation (eager runs)
    PREDICTED = "predicted"  # from the operations' strides (fake runs; no data ran)


@unique
class ConvClass(str, Enum):
    """How Inductor's layout heuristic classes a convolution (the first that holds)."""

    GROUPED = "grouped"  # groups > 1 and more than one input channel per group
    SMALL = "small"  # at most 64 input (per group) and output channels
    IN_OUT = "in_out"  # input channels >= 2x output channels, kernel > 1
    DEFAULT = "default"


@unique
class LayoutBranch(str, Enum):
    """The branch of Inductor's layout heuristic that decided a compiled graph."""

    CONFIG_OFF = "config_off"  # config.layout_optimization is off
    FORCED = "forced"  # config.force_layout_optimization
    NO_CONVOLUTION = "no_convolution"
    MKLDNN_CPU = "mkldnn_cpu"  # every convolution on a CPU with mkldnn: always on
    FEW_CONVOLUTIONS = "few_convolutions"  # >= 300 graph nodes per convolution
    VOTE = "vote"  # inference: the flop-weighted vote over the convolution classes
    GROUPED = "grouped"  # training: a grouped convolution vetoes
    IN_OUT = "in_out"  # training: a narrowing convolution with a kernel > 1 vetoes
    ALL_SMALL = "all_small"  # training: every convolution is small
    NO_VETO = "no_veto"  # training: nothing vetoed
    UNEXPLAINED = "unexplained"  # torch decided otherwise than cl-audit's reading predicts


@unique
class CopyKind(str, Enum):
    """What layout a copy inserted by Inductor's lowering writes."""

    TO_CHANNELS_LAST = "to_channels_last"
    TO_CONTIGUOUS = "to_contiguous"
    OTHER = "other"  # strides of neither (or a tensor whose rank has no channels_last)


@unique
class Fate(str, Enum):
    """What the compiled graphs do with a layout loss, against the eager audit."""

    REMOVED = "removed"  # an eager loss with no copy at its site in the compiled graphs
    KEPT = "kept"  # an eager loss whose site the compiled graphs still copy at
    ADDED = "added"  # a compiled copy at a site where the eager audit found no loss


@unique
class OpBehaviour(str, Enum):
    """What an operator returns for channels_last input (``cl-audit ops``), worst first."""

    REFUSES = "refuses"  # raises where the same call in NCHW runs
    LOSES = "loses"  # returns NCHW (contiguous) strides
    OTHER = "other"  # returns strides of neither order where NCHW input gives NCHW
    COPIES = "copies"  # keeps or follows the order, but its kernel copies a map inside
    FOLLOWS = "follows"  # a view or reordering: NCHW input gives other strides too
    KEEPS = "keeps"  # returns channels_last
    AMBIGUOUS = "ambiguous"  # size-1 dimensions: both orders at once, neither lost nor kept
    NO_MAP = "no-map"  # returns no 4-D or 5-D tensor


class WrapOrder(str, Enum):
    """When a model was made channels_last, against when DDP wrapped it (``--ddp``)."""

    BEFORE = "before"  # converted, then wrapped: DDP's buckets are laid out for channels_last
    AFTER = "after"  # wrapped, then converted: the buckets keep the NCHW strides


class BucketMatch(str, Enum):
    """A parameter's strides against DDP's bucket view of its gradient (``--ddp``)."""

    MATCHES = "matches"
    MISMATCHED = "mismatched"  # differ in a dimension of size over 1: DDP copies across orders
    AMBIGUOUS = "ambiguous"  # differ only in size-1 dimensions (a 1x1 kernel, N1HW, NC11)


@unique
class SpeedClass(str, Enum):
    """What a step's time is spent on, by operation (``predict.speed_model``)."""

    CONV_FORWARD = "convolution forward"
    CONV_INPUT_GRAD = "convolution input gradient"
    CONV_WEIGHT_GRAD = "convolution weight gradient"
    CONV_GRADIENTS = "convolution gradients"  # measured: the profiler holds both in one operation
    NORMALISATION = "normalisation"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise and pooling"
    CONVERSION = "conversions"
    OTHER = "the rest"


@unique
class CompiledClass(str, Enum):
    """What a compiled step's time is spent on (``phases.timed``: one profiled step)."""

    EXTERN = "extern kernels"  # what Inductor calls out to: convolutions, matrix products
    FUSED = "fused kernels"  # Inductor's generated kernels that copy nothing
    COPIES = (
        "copies"  # copies and layout conversions: generated kernels holding a copy, aten copies
    )
    REST = "the rest"  # outside the compiled graphs, and their wrappers


@unique
class SpeedVerdict(str, Enum):
    """Whether channels_last pays, within the gate's band (``Gate.slowdown``)."""

    FASTER = "faster"
    SLOWER = "slower"
    NO_DIFFERENCE = "no difference"
    INCONCLUSIVE = "inconclusive"  # measured rounds spread across the band
    UNKNOWN = "unknown"  # neither measured nor predictable: no table, or no NCHW run


@unique
class TableMatch(str, Enum):
    """How a speed table's machine matched the one an audit ran on (``predict.table_store``)."""

    THIS_MACHINE = "this-machine"  # the same device, CPU configuration, torch and library
    SAME_DEVICE = "same-device"  # the same device model; another release, library or host
    OTHER_DEVICE = "other-device"  # another device of the type


@unique
class SpeedBasis(str, Enum):
    """Where a speed verdict comes from."""

    MEASURED = "measured"  # both layouts timed here, in alternating rounds
    PREDICTED = "predicted"  # an operation time table applied to the runs' operations


@unique
class GateOn(str, Enum):
    """What exit 1 means: channels_last copies too much (the default), or runs slower."""

    BYTES = "bytes"
    SPEED = "speed"
