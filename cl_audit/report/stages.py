"""The model's stages: its module tree cut at one depth into a handful of parts (the page's
picture of where in the model the time and the copies go), and each stage's time in both
layouts and channels_last-only bytes.

The cut is the deepest depth of the tree that gives at most ``MOST`` parts (a part is a module
at that depth, or a childless module above it): a model's blocks where they fit, its stages
where they do not (timm's ``blocks.0`` ... ``blocks.6`` rather than ``blocks`` alone). Where
even the first depth gives more than ``MOST`` (a long ``Sequential``), its parts are merged in
runs of neighbours (``features.0-3``). A real model gets 5 to 30 parts this way; a tiny
one, its modules. Operations outside every part (the root module's own) belong to
``ROOT``, those of a module above the cut (a block's own addition, a norm whose activation is
its child) to a stage of that module's own, a training step's optimizer to ``OPTIMIZER``; a
measured training step's backward is ``BACKWARD`` (a predicted one's lies in the stages whose
forward made it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from cl_audit.enums import Phase

__all__ = ["BACKWARD", "MOST", "OPTIMIZER", "ROOT", "StageCut", "StageTime", "stage_cut"]

MOST = 30
ROOT = "(root)"
OPTIMIZER = "(optimizer)"
BACKWARD = "(backward)"  # a measured training step's backward (the profiler places it nowhere)


@dataclass(frozen=True)
class StageTime:
    """One stage's milliseconds per step in each layout and its cost sites' channels_last-only
    bytes."""

    name: str
    channels_last_ms: float
    nchw_ms: float
    extra_bytes: int = 0


@dataclass(frozen=True)
class StageCut:
    """The parts, in the model's order; which part each module path at the cut belongs to
    (``heads``: the path at the cut depth -> its part's name); and every module path in the
    model's order (``modules``): a module above the cut (a block whose children are parts)
    is a stage of its own operations."""

    parts: tuple[str, ...]
    heads: tuple[tuple[str, str], ...]
    modules: tuple[str, ...] = ()

    @cached_property
    def _heads(self) -> dict[str, str]:
        return dict(self.heads)

    @cached_property
    def _modules(self) -> frozenset[str]:
        return frozenset(self.modules)

    def of(self, path: str | None, phase: Phase = Phase.FORWARD) -> str:
        """The stage of an operation run in the module at ``path`` in ``phase``: the
        optimizer's; else its part, the module itself above the cut, ``ROOT`` for the root's
        own operations and unknown modules."""
        if phase is Phase.OPTIMIZER:
            return OPTIMIZER
        if not path:
            return ROOT
        names = path.split(".")
        for end in range(len(names), 0, -1):
            part = self._heads.get(".".join(names[:end]))
            if part is not None:
                return part
        return path if path in self._modules else ROOT

    def ordered(self, names: Iterable[str]) -> list[str]:
        """``names`` in the model's order (a stage where its first module is), the root's,
        the backward's and the optimizer's last."""
        rank: dict[str, int] = {}
        for index, path in enumerate(self.modules):
            rank.setdefault(self.of(path), index)
        last = {ROOT: 1, BACKWARD: 2, OPTIMIZER: 3}
        return sorted(names, key=lambda n: (last.get(n, 0), rank.get(n, len(rank))))


def _parts_at(paths: Sequence[str], depth: int) -> list[str]:
    """The modules at ``depth``, and the childless ones above it, in the tree's order."""
    parents = {p.rsplit(".", 1)[0] for p in paths if "." in p}
    return [
        p for p in paths
        if p.count(".") + 1 == depth or (p.count(".") + 1 < depth and p not in parents)
    ]  # fmt: skip


def _merged(parts: list[str], most: int) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """``parts`` in at most ``most`` runs of neighbours, each named by its first and last."""
    size = -(-len(parts) // most)
    names, heads = [], []
    for start in range(0, len(parts), size):
        run = parts[start : start + size]
        last = run[-1].rsplit(".", 1)[-1]
        name = run[0] if len(run) == 1 else f"{run[0]}-{last}"
        names.append(name)
        heads.extend((p, name) for p in run)
    return tuple(names), tuple(heads)


def stage_cut(paths: Iterable[str], most: int = MOST) -> StageCut:
    """The cut of a model whose modules are ``paths`` (``named_modules`` names, the root's
    empty name left out) (see the module docstring)."""
    paths = [p for p in paths if p]
    deepest = max((p.count(".") + 1 for p in paths), default=0)
    parts = _parts_at(paths, 1)
    if len(parts) > most:
        return StageCut(*_merged(parts, most), tuple(paths))
    for depth in range(2, deepest + 1):
        deeper = _parts_at(paths, depth)
        if len(deeper) > most:
            break
        parts = deeper
    return StageCut(tuple(parts), tuple((p, p) for p in parts), tuple(paths))
