"""Timing for ``cl-audit table``: calls timed on the machine's own clock, layouts alternated.

CUDA: events around ``reps`` calls after the calls were warmed (``cudnn.benchmark`` on, as
users set it: the first call of a shape autotunes), the host's own time per call beside; the
CPU: the wall clock. Each figure is the median of alternated measurements (the order reversed
every other repeat), so that a machine's drift falls on both layouts alike."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Clock", "Timed", "alternated"]


class Clock:
    """Times calls on ``device`` (``cpu`` or ``cuda``): (device ms per call, host us per
    call); on the CPU both the wall clock."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, call: Callable[[], object], reps: int) -> tuple[float, float]:
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            for _ in range(reps):
                call()
            end.record()
            t1 = time.perf_counter()
            end.synchronize()
            return start.elapsed_time(end) / reps, (t1 - t0) / reps * 1e6
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        t1 = time.perf_counter()
        return (t1 - t0) / reps * 1e3, (t1 - t0) / reps * 1e6

    def host_us(self, call: Callable[[], object], reps: int) -> float:
        """The host's microseconds per call, not waiting for the device (on CUDA the queue
        runs behind: the host's own rate, where the kernels are shorter than its work)."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        t1 = time.perf_counter()
        self.sync()
        return (t1 - t0) / reps * 1e6

    def reps_for(self, call: Callable[[], object], target_ms: float, most: int) -> int:
        """Calls per measurement so that one lasts about ``target_ms`` (the call warmed)."""
        once, _ = self.time(call, 1)
        return max(1, min(most, math.ceil(target_ms / max(once, 1e-3))))


@dataclass(frozen=True)
class Timed:
    """One call's alternated measurements: the median, fastest and slowest milliseconds per
    call, and the host's median microseconds per call."""

    ms: float
    min_ms: float
    max_ms: float
    host_us: float


def alternated(
    clock: Clock, calls: dict[str, Callable[[], object]], repeats: int, target_ms: float
) -> dict[str, Timed]:
    """Each named call timed ``repeats`` times, the names alternating (see the module
    docstring)."""
    reps = {name: clock.reps_for(call, target_ms, 200) for name, call in calls.items()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(clock.time(calls[name], reps[name]))
    return {
        name: Timed(
            statistics.median(t for t, _ in ts),
            min(t for t, _ in ts),
            max(t for t, _ in ts),
            statistics.median(h for _, h in ts),
        )
        for name, ts in times.items()
    }
