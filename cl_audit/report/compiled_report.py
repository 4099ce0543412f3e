"""What ``torch.compile`` would do with a model's layouts: Inductor's layout decision for each
graph it would compile, the branch of its heuristic that decided it, the convolutions that
decided it, the layout copies its lowering inserts, and which eager losses the compiled graphs
remove, keep or add (``cl-audit MODEL --compile``; ``ModelReport.compiled``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cl_audit.enums import ConvClass, CopyKind, Fate, LayoutBranch, Phase
from cl_audit.report.codec import JsonForm

__all__ = ["Compiled", "CompiledConv", "CompiledCopy", "CompiledGraph", "CompiledSite"]


@dataclass(frozen=True)
class CompiledConv:
    """A convolution of a compiled graph: where the model calls it, its class in the
    heuristic, its share of the graph's convolution flops, and whether it decided the graph."""

    call_site: str | None
    module_path: str | None
    module_class: str | None
    kind: ConvClass
    groups: int
    in_per_group: int
    out_channels: int
    kernel: tuple[int, ...]
    flop_share: float
    deciding: bool
    backward: bool = False  # a convolution_backward node (the backward graph)

    json_form: ClassVar[JsonForm] = JsonForm(
        keys={"kind": "class"}, written={"flop_share": lambda share: round(share, 6)}
    )


@dataclass(frozen=True)
class CompiledCopy:
    """A copy Inductor's lowering inserts to change a buffer's layout: ``call_site`` and
    ``module_path`` are where the copied data was made (the graph input's consumer when it is
    an input), ``consumer`` the operation that required the other layout, at
    ``consumer_site``; ``bytes`` the tensor's size (each copy reads and writes it once)."""

    call_site: str | None
    module_path: str | None
    producer: str | None  # the aten operation that made the data; None: a graph input
    consumer: str
    consumer_site: str | None
    kind: CopyKind
    shape: tuple[int, ...]
    source_strides: tuple[int, ...]
    strides: tuple[int, ...]
    bytes: int


@dataclass(frozen=True)
class CompiledSite:
    """A call site side by side: its eager layout losses (``eager_bytes`` converted by them)
    and the copies the compiled graphs make there (``compiled_bytes``), and which ``fate``."""

    call_site: str | None
    module_path: str | None
    fate: Fate
    eager_losses: int
    eager_bytes: int
    compiled_copies: int
    compiled_bytes: int


@dataclass(frozen=True, kw_only=True)  # fields in the order the JSON writes them
class CompiledGraph:
    """One graph Inductor would compile: the inference graph, or a training step's forward or
    backward graph; ``forced`` is the decision with ``--force-layout-opt`` (None: not asked).
    ``conversions`` are the copies its lowering inserts under the decision (``forced_conversions``
    under the forced one); None with ``lowering_error`` when the graph could not be lowered."""

    index: int
    phase: Phase
    inference: bool
    layout_optimization: bool
    branch: LayoutBranch
    reason: str
    nodes: int
    forced: bool | None = None
    convolutions: tuple[CompiledConv, ...]
    conversions: tuple[CompiledCopy, ...] | None = None
    forced_conversions: tuple[CompiledCopy, ...] | None = None
    lowering_error: str | None = None

    @property
    def deciding(self) -> tuple[CompiledConv, ...]:
        return tuple(c for c in self.convolutions if c.deciding)

    @property
    def label(self) -> str:
        """``inference``, ``training forward`` or ``training backward``."""
        return "inference" if self.inference else f"training {self.phase.value}"


@dataclass(frozen=True)
class Compiled:
    """Inductor's layout decisions for a model. ``predicted`` when made for a device this
    machine does not have (fake CUDA), from graphs traced on ``traced_on``; ``seconds`` is the
    capture's and the lowering's wall time (no code is generated). ``sites`` sets the eager
    audit's losses beside the compiled graphs' copies (None: no eager audit to compare).
    ``data_dependent`` names the operation whose output depends on tensor values (a detection
    model's ``aten.nonzero``) that fake tensors could not run, so the graphs were traced on
    real tensors holding a copy of the model's values; None: traced on fake tensors."""

    device: str
    traced_on: str
    predicted: bool
    torch: str
    backward_convolutions_counted: bool
    force_layout_opt: bool
    seconds: float
    graphs: tuple[CompiledGraph, ...]
    sites: tuple[CompiledSite, ...] | None = None
    data_dependent: str | None = None

    json_form: ClassVar[JsonForm] = JsonForm(written={"seconds": lambda seconds: round(seconds, 3)})

    @property
    def basis(self) -> str:
        """How the decisions were made, in words."""
        values = (
            ""
            if self.data_dependent is None
            else f" with real values ({self.data_dependent} needs them)"
        )
        if self.predicted:
            return (
                f"a prediction for {self.device} made without one, from graphs traced on "
                f"{self.traced_on}{values}"
            )
        return f"Inductor's decision on {self.device}{values}"
