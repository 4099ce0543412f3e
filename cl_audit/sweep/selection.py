"""Which models a sweep runs: selection by names and globs, exclusion, and sharding by cost."""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from dataclasses import dataclass
from importlib import resources

from cl_audit.enums import ModelSource
from cl_audit.errors import UsageError
from cl_audit.sources import ModelRef, close_matches, positional_source

__all__ = ["Selection", "estimated_cost", "known_parameters", "parse_shard", "select", "shard"]

_GLOB_CHARS = re.compile(r"[*?\[]")


def _registry(source: ModelSource) -> list[str]:
    if source is ModelSource.TIMM:
        from cl_audit.sources import timm_models

        return timm_models.names()
    from cl_audit.sources import torchvision_models

    return torchvision_models.names()


def _split(patterns: list[str]) -> list[str]:
    return [p.strip() for text in patterns for p in text.split(",") if p.strip()]


def _expand(source: ModelSource, patterns: list[str]) -> list[str]:
    if not patterns:
        return []  # and do not import the registry: importing timm costs seconds
    available = _registry(source)
    chosen: list[str] = []
    for pattern in _split(patterns):
        if pattern == "all":
            matches = available
        elif _GLOB_CHARS.search(pattern):
            matches = fnmatch.filter(available, pattern)
            if not matches:
                raise UsageError(f"--{source.value} {pattern!r} matches no {source.value} model")
        elif pattern in available:
            matches = [pattern]
        else:
            hint = "; for a timm model use --timm" if source is ModelSource.TORCHVISION else ""
            matches_hint = close_matches(pattern, available)
            raise UsageError(f"unknown {source.value} model {pattern!r}{matches_hint}{hint}")
        chosen.extend(matches)
    return chosen


def select(
    models: list[str],
    timm: list[str],
    torchvision: list[str],
    exclude: list[str],
) -> list[ModelRef]:
    """Positional models (torchvision names or ``file.py:factory`` specs), then the
    ``--torchvision`` and ``--timm`` patterns; ``exclude`` globs drop names; no duplicates."""
    refs: list[ModelRef] = []
    tv, tm = ModelSource.TORCHVISION, ModelSource.TIMM
    for spec in models:
        source = positional_source(spec)
        if source is ModelSource.USER:
            refs.append(ModelRef(source, spec))
        else:
            refs.extend(ModelRef(tv, n) for n in _expand(tv, [spec]))
    refs.extend(ModelRef(tv, n) for n in _expand(tv, torchvision))
    refs.extend(ModelRef(tm, n) for n in _expand(tm, timm))
    excluded = _split(exclude)
    seen: set[ModelRef] = set()
    selected = []
    for ref in refs:
        if ref in seen or any(fnmatch.fnmatchcase(ref.name, g) for g in excluded):
            continue
        seen.add(ref)
        selected.append(ref)
    return selected


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` with 1 <= K <= N."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise UsageError(f"--shard {text!r}: expected K/N with 1 <= K <= N, e.g. 2/4")
    return int(match[1]), int(match[2])


_SIZE_WORDS = {
    "atto": 0.1, "femto": 0.15, "pico": 0.2, "nano": 0.3, "tiny": 0.5, "small": 1.0,
    "medium": 1.5, "base": 3.0, "large": 8.0, "xlarge": 12.0, "huge": 16.0, "giant": 30.0,
    "gigantic": 50.0, "enormous": 60.0,
}  # fmt: skip
_SIDE = re.compile(r"_(\d{3,4})(?:_|$)")


@functools.cache
def known_parameters() -> dict[str, int]:
    """Parameter counts measured by the project's own sweeps (shipped with the package)."""
    text = resources.files("cl_audit.sweep").joinpath("parameters.json").read_text()
    return json.loads(text)


def estimated_cost(ref: ModelRef, parameters: dict[str, int] | None = None) -> float:
    """Relative cost of auditing ``ref``: millions of parameters times input area, plus a
    constant for the build. Parameter counts come from the shipped table where known, else
    from size words in the name (tiny, base, large, ...)."""
    parameters = known_parameters() if parameters is None else parameters
    count = parameters.get(ref.key)
    if count is not None:
        millions = count / 1e6
    else:
        words = re.split(r"[_.\-]", ref.name)
        millions = 25.0 * max((_SIZE_WORDS.get(w, 0.0) for w in words), default=0.0) or 25.0
    side = _SIDE.search(ref.name)
    area = (int(side[1]) / 224) ** 2 if side else 1.0
    return 1.0 + millions / 25.0 * (1.0 + area)


def shard(refs: list[ModelRef], index: int, count: int) -> list[ModelRef]:
    """Shard ``index`` (1-based) of ``count``: longest-cost-first into the lightest shard, a
    deterministic split in which every model lands in exactly one shard."""
    parameters = known_parameters()
    by_cost = sorted(refs, key=lambda r: (-estimated_cost(r, parameters), r))
    loads = [0.0] * count
    assigned: list[list[ModelRef]] = [[] for _ in range(count)]
    for ref in by_cost:
        lightest = min(range(count), key=lambda i: (loads[i], i))
        loads[lightest] += estimated_cost(ref, parameters)
        assigned[lightest].append(ref)
    mine = set(assigned[index - 1])
    return [r for r in refs if r in mine]


@dataclass(frozen=True)
class Selection:
    """The models asked for, as given (a sweep records it)."""

    models: tuple[str, ...] = ()
    timm: tuple[str, ...] = ()
    torchvision: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    shard: str | None = None

    def refs(self) -> list[ModelRef]:
        """The models selected, in order; with ``shard`` ("K/N"), this shard's."""
        refs = select(
            list(self.models), list(self.timm), list(self.torchvision), list(self.exclude)
        )
        return refs if self.shard is None else shard(refs, *parse_shard(self.shard))

    def to_dict(self) -> dict[str, object]:
        return {
            "models": list(self.models),
            "timm": list(self.timm),
            "torchvision": list(self.torchvision),
            "exclude": list(self.exclude),
            "shard": self.shard,
        }
