"""The profiler's CPU events, read from libkineto's raw events where this torch has them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ProfiledOp", "enclosing", "profiled_ops", "recording"]


@contextlib.contextmanager
def recording(enabled: bool, after: bool = True) -> Iterator[None]:
    """The profiler's recording of operations on this thread (torch's RecordFunction)
    ``enabled`` inside, ``after`` after: what runs while it is off makes no event, costs no
    time to record nor to read back. Torch has no reader of the setting; on is its default."""
    torch.autograd._enable_record_function(enabled)
    try:
        yield
    finally:
        torch.autograd._enable_record_function(after)


@dataclass(frozen=True)
class ProfiledOp:
    """One CPU-side profiler event: an operation or a ``record_function`` range, with its
    interval (ns) on its thread, its inputs' shapes and dtype names (empty where unrecorded)."""

    name: str
    start: int
    end: int
    thread: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]


def profiled_ops(profile: torch.profiler.profile) -> tuple[ProfiledOp, ...]:
    """The CPU events of a finished profile. Read from libkineto's raw events, which cost ~2% of
    ``profile.events()``: that builds a Python object per event and their tree, seconds per
    audited training step (measured: scripts/profile_training_confirm.py). A torch whose raw
    events lack what is read gets the parsed events instead, without dtypes where they lack
    them (torch 2.4's parsed events: its raw ones have them)."""
    results = getattr(getattr(profile, "profiler", None), "kineto_results", None)
    try:
        raw = results.events()  # type: ignore[union-attr]
        return tuple(
            ProfiledOp(
                e.name(),
                e.start_ns(),
                e.start_ns() + e.duration_ns(),
                e.start_thread_id(),
                tuple(tuple(s) for s in e.shapes()),
                tuple(e.dtypes()),
            )
            for e in raw
            if e.device_type() == torch.autograd.DeviceType.CPU
        )
    except AttributeError:
        return _parsed_ops(profile)


def _parsed_ops(profile: torch.profiler.profile) -> tuple[ProfiledOp, ...]:
    return tuple(
        ProfiledOp(
            e.name,
            round(e.time_range.start * 1e3),
            round(e.time_range.end * 1e3),
            e.thread,
            tuple(tuple(s) for s in e.input_shapes or ()),
            tuple(getattr(e, "input_dtypes", None) or ()),
        )
        for e in profile.events()
        if e.device_type == torch.autograd.DeviceType.CPU
    )


def enclosing(event: Any) -> Iterator[str]:
    """The names of the ranges and operations around a parsed profiler event (``events()``),
    innermost first: torch links each to its CPU parent."""
    parent = event.cpu_parent
    while parent is not None:
        yield parent.name
        parent = parent.cpu_parent
