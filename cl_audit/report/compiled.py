"""What ``torch.compile`` would do with a model's layouts: Inductor's layout decision for each
graph it would compile, the branch of its heuristic that decided it, and the convolutions that
decided it (``cl-audit MODEL --compile``; ``ModelReport.compiled``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cl_audit.enums import ConvClass, LayoutBranch, Phase

__all__ = ["Compiled", "CompiledConv", "CompiledGraph", "compiled_from_dict"]


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
class CompiledGraph:
    """One graph Inductor would compile: the inference graph, or a training step's forward or
    backward graph; ``forced`` is the decision with ``--force-layout-opt`` (None: not asked)."""

    index: int
    phase: Phase
    inference: bool
    layout_optimization: bool
    branch: LayoutBranch
    reason: str
    nodes: int
    convolutions: tuple[CompiledConv, ...]
    forced: bool | None = None

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
        )


@dataclass(frozen=True)
class Compiled:
    """Inductor's layout decisions for a model. ``predicted`` when made for a device this
    machine does not have (fake CUDA), from graphs traced on ``traced_on``; ``seconds`` is the
    capture's wall time (Dynamo and AOTAutograd tracing; nothing is lowered)."""

    device: str
    traced_on: str
    predicted: bool
    torch: str
    backward_convolutions_counted: bool
    force_layout_opt: bool
    seconds: float
    graphs: tuple[CompiledGraph, ...]

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
    )
