"""What ``torch.compile`` would do with a model's layouts: Inductor's layout decision for each
graph it would compile, the branch of its heuristic that decided it, the convolutions that
decided it, the layout copies its lowering inserts, and which eager losses the compiled graphs
remove, keep or add (``cl-audit MODEL --compile``; ``ModelReport.compiled``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cl_audit.enums import ConvClass, CopyKind, Fate, LayoutBranch, Phase

__all__ = [
    "Compiled",
    "CompiledConv",
    "CompiledCopy",
    "CompiledGraph",
    "CompiledSite",
    "compiled_from_dict",
]


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_site": self.call_site,
            "module_path": self.module_path,
            "module_class": self.module_class,
            "class": self.kind.value,
            "groups": self.groups,
            "in_per_group": self.in_per_group,
            "out_channels": self.out_channels,
            "kernel": list(self.kernel),
            "flop_share": round(self.flop_share, 6),
            "deciding": self.deciding,
            "backward": self.backward,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompiledConv:
        return cls(
            call_site=data["call_site"],
            module_path=data["module_path"],
            module_class=data["module_class"],
            kind=ConvClass(data["class"]),
            groups=data["groups"],
            in_per_group=data["in_per_group"],
            out_channels=data["out_channels"],
            kernel=tuple(data["kernel"]),
            flop_share=data["flop_share"],
            deciding=data["deciding"],
            backward=data["backward"],
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_site": self.call_site,
            "module_path": self.module_path,
            "producer": self.producer,
            "consumer": self.consumer,
            "consumer_site": self.consumer_site,
            "kind": self.kind.value,
            "shape": list(self.shape),
            "source_strides": list(self.source_strides),
            "strides": list(self.strides),
            "bytes": self.bytes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompiledCopy:
        return cls(
            call_site=data["call_site"],
            module_path=data["module_path"],
            producer=data["producer"],
            consumer=data["consumer"],
            consumer_site=data["consumer_site"],
            kind=CopyKind(data["kind"]),
            shape=tuple(data["shape"]),
            source_strides=tuple(data["source_strides"]),
            strides=tuple(data["strides"]),
            bytes=data["bytes"],
        )


def _copies(data: list[dict[str, Any]] | None) -> tuple[CompiledCopy, ...] | None:
    return None if data is None else tuple(CompiledCopy.from_dict(c) for c in data)


def _copies_dict(copies: tuple[CompiledCopy, ...] | None) -> list[dict[str, Any]] | None:
    return None if copies is None else [c.to_dict() for c in copies]


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_site": self.call_site,
            "module_path": self.module_path,
            "fate": self.fate.value,
            "eager_losses": self.eager_losses,
            "eager_bytes": self.eager_bytes,
            "compiled_copies": self.compiled_copies,
            "compiled_bytes": self.compiled_bytes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompiledSite:
        return cls(
            call_site=data["call_site"],
            module_path=data["module_path"],
            fate=Fate(data["fate"]),
            eager_losses=data["eager_losses"],
            eager_bytes=data["eager_bytes"],
            compiled_copies=data["compiled_copies"],
            compiled_bytes=data["compiled_bytes"],
        )


@dataclass(frozen=True)
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
    convolutions: tuple[CompiledConv, ...]
    forced: bool | None = None
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "phase": self.phase.value,
            "inference": self.inference,
            "layout_optimization": self.layout_optimization,
            "branch": self.branch.value,
            "reason": self.reason,
            "nodes": self.nodes,
            "forced": self.forced,
            "convolutions": [c.to_dict() for c in self.convolutions],
            "conversions": _copies_dict(self.conversions),
            "forced_conversions": _copies_dict(self.forced_conversions),
            "lowering_error": self.lowering_error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompiledGraph:
        return cls(
            index=data["index"],
            phase=Phase(data["phase"]),
            inference=data["inference"],
            layout_optimization=data["layout_optimization"],
            branch=LayoutBranch(data["branch"]),
            reason=data["reason"],
            nodes=data["nodes"],
            convolutions=tuple(CompiledConv.from_dict(c) for c in data["convolutions"]),
            forced=data["forced"],
            conversions=_copies(data.get("conversions")),
            forced_conversions=_copies(data.get("forced_conversions")),
            lowering_error=data.get("lowering_error"),
        )


@dataclass(frozen=True)
class Compiled:
    """Inductor's layout decisions for a model. ``predicted`` when made for a device this
    machine does not have (fake CUDA), from graphs traced on ``traced_on``; ``seconds`` is the
    capture's and the lowering's wall time (no code is generated). ``sites`` sets the eager
    audit's losses beside the compiled graphs' copies (None: no eager audit to compare)."""

    device: str
    traced_on: str
    predicted: bool
    torch: str
    backward_convolutions_counted: bool
    force_layout_opt: bool
    seconds: float
    graphs: tuple[CompiledGraph, ...]
    sites: tuple[CompiledSite, ...] | None = None

    @property
    def basis(self) -> str:
        """How the decisions were made, in words."""
        if self.predicted:
            return (
                f"a prediction for {self.device} made without one, from graphs traced on "
                f"{self.traced_on}"
            )
        return f"Inductor's decision on {self.device}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "traced_on": self.traced_on,
            "predicted": self.predicted,
            "torch": self.torch,
            "backward_convolutions_counted": self.backward_convolutions_counted,
            "force_layout_opt": self.force_layout_opt,
            "seconds": round(self.seconds, 3),
            "graphs": [g.to_dict() for g in self.graphs],
            "sites": None if self.sites is None else [s.to_dict() for s in self.sites],
        }


def compiled_from_dict(data: dict[str, Any] | None) -> Compiled | None:
    if data is None:
        return None
    return Compiled(
        device=data["device"],
        traced_on=data["traced_on"],
        predicted=data["predicted"],
        torch=data["torch"],
        backward_convolutions_counted=data["backward_convolutions_counted"],
        force_layout_opt=data["force_layout_opt"],
        seconds=data["seconds"],
        graphs=tuple(CompiledGraph.from_dict(g) for g in data["graphs"]),
        sites=None
        if data.get("sites") is None
        else tuple(CompiledSite.from_dict(s) for s in data["sites"]),
    )
