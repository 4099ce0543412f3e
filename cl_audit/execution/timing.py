"""Time in an audit: uninstrumented steps timed (synchronised on CUDA), the audited step under
``torch.profiler`` with libkineto's own log lines kept off the terminal, and each finding given
the time of its own calls (the dispatch engine runs each call in a profiler range named by its
number, ``CALL_LABEL``)."""

from __future__ import annotations

import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cl_audit.compat.profiler_events import ProfiledOp, profiled_ops
from cl_audit.intercept.dispatch import CALL_LABEL
from cl_audit.report import Timing
from cl_audit.report.sections import Observed

__all__ = [
    "Profiler",
    "call_times",
    "copied_bytes",
    "copies_by_call",
    "repeated",
    "step_timing",
    "timed_ms",
]


# Lines that libkineto writes to the process's stderr on its own (profiler start and stop, "no
# GPU" on a CPU machine): dropped; anything else written to stderr meanwhile is passed on.
_KINETO_LINE = re.compile(r"^(USDT|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d [^\]]*\.cpp:\d+\]")


class Profiler:
    """``torch.profiler.profile`` (CPU, and CUDA kernels on CUDA), with libkineto's own log
    lines kept off the terminal. On exit it reads what was asked for: the CPU events with their
    input shapes (``ops``, for the copies inside kernels) and the parsed events with their
    times (``events()``, for ``call_times``; parsing costs seconds per training step)."""

    def __init__(self, device: torch.device, shapes: bool = False, times: bool = False) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(activities=activities, record_shapes=shapes)
        self._times = times
        self.ops: tuple[ProfiledOp, ...] = ()
        self._saved = -1
        self._capture: Any = None

    def __enter__(self) -> Profiler:
        sys.stderr.flush()
        self._capture = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._capture.fileno(), 2)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._profile.__exit__(*exc_info)
            self.ops = profiled_ops(self._profile)
            if self._times:
                self._profile.events()  # the events are parsed (and logged about) here
        finally:
            sys.stderr.flush()
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._capture.seek(0)
            text = self._capture.read().decode(errors="replace")
            self._capture.close()
            kept = [line for line in text.splitlines(keepends=True) if not _KINETO_LINE.match(line)]
            sys.stderr.write("".join(kept))

    def events(self) -> Any:
        return self._profile.events()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(call: Callable[[], object], device: torch.device) -> float:
    """Milliseconds that ``call`` takes, synchronised on CUDA."""
    synchronize(device)
    start = time.perf_counter()
    call()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


def call_times(profiler: Any, device: torch.device) -> dict[int, float]:
    """Milliseconds by call number, from the profiler ranges the dispatch engine opened:
    CPU time on CPU, the kernels' time on CUDA."""
    times: dict[int, float] = {}
    for event in profiler.events():
        if event.name.startswith(CALL_LABEL):
            micros = event.device_time_total if device.type == "cuda" else event.cpu_time_total
            number = int(event.name[len(CALL_LABEL) :])
            times[number] = times.get(number, 0.0) + micros / 1e3
    return times


# Element sizes of the dtype names the profiler records.
_ELEMENT_SIZES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
}  # fmt: skip


def _nested(ops: tuple[ProfiledOp, ...]) -> Iterator[tuple[ProfiledOp, list[ProfiledOp]]]:
    """Each event with the events enclosing it on its thread, outermost first: torch's own
    rule for the CPU event tree (sorted by start, longest first; a parent encloses its child)."""
    threads: dict[int, list[ProfiledOp]] = {}
    for op in ops:
        threads.setdefault(op.thread, []).append(op)
    for events in threads.values():
        stack: list[ProfiledOp] = []
        for op in sorted(events, key=lambda e: (e.start, -e.end)):
            while stack and (op.start >= stack[-1].end or op.end > stack[-1].end):
                stack.pop()
            yield op, stack
            stack.append(op)


def copied_bytes(profiler: Profiler) -> int:
    """The bytes every ``aten::copy_`` event of a profiler run with shapes wrote, on every
    thread (a broadcast fill after an ``aten::expand`` left out, as ``copies_by_call``
    leaves it)."""
    total = 0
    previous: dict[int, str] = {}
    for op, enclosing in _nested(profiler.ops):
        parent = id(enclosing[-1]) if enclosing else 0
        before, previous[parent] = previous.get(parent), op.name
        if op.name == "aten::copy_" and op.shapes and before != "aten::expand":
            size = _ELEMENT_SIZES.get(op.dtypes[0], 4) if op.dtypes else 4
            total += math.prod(op.shapes[0]) * size
    return total


def copies_by_call(
    profiler: Profiler,
) -> tuple[dict[int, list[tuple[int, int | None]]], dict[int, str]]:
    """The ``aten::copy_`` events inside each labelled call (a profiler run with shapes), as
    (elements, element size) pairs, the size None where the profiler recorded no dtype; and
    each call's operation as the profiler names it (``aten.convolution``). A copy right after
    an ``aten::expand`` in the same call is a broadcast fill, not a conversion (``addmm``
    writes its bias into the output before it accumulates the product, where ``bmm`` and
    ``add`` write as many bytes without a copy), and is left out."""
    copied: dict[int, list[tuple[int, int | None]]] = {}
    names: dict[int, str] = {}
    previous: dict[int, str] = {}  # the enclosing event -> the name of its latest child
    for op, enclosing in _nested(profiler.ops):
        parent = id(enclosing[-1]) if enclosing else 0
        before, previous[parent] = previous.get(parent), op.name
        if op.name != "aten::copy_" or not op.shapes or before == "aten::expand":
            continue
        labels = [d for d, e in enumerate(enclosing) if e.name.startswith(CALL_LABEL)]
        if not labels:
            continue
        depth = labels[-1]  # the innermost labelled call
        call = int(enclosing[depth].name[len(CALL_LABEL) :])
        child = enclosing[depth + 1] if depth + 1 < len(enclosing) else op
        size = _ELEMENT_SIZES.get(op.dtypes[0], 4) if op.dtypes else None
        copied.setdefault(call, []).append((math.prod(op.shapes[0]), size))
        names[call] = child.name.replace("::", ".")
    return copied, names


def repeated(
    measured: tuple[dict[int, list[tuple[int, int | None]]], dict[int, str]],
    repeats: dict[int, int],
) -> tuple[dict[int, list[tuple[int, int | None]]], dict[int, str]]:
    """``copies_by_call``'s copies and names with each unlabelled call given those of the
    first call of its signature (``repeats``: ``CallLabels.FIRST``)."""
    copied, names = measured
    for call, first in repeats.items():
        if first in copied:
            copied[call] = copied[first]
            names[call] = names[first]
    return copied, names


def step_timing(
    observed: Observed, rounds: tuple[float, ...], profiled: float, device: torch.device
) -> Timing:
    def total(findings: tuple[Any, ...]) -> float:
        return sum(f.time_ms or 0.0 for f in findings)

    return Timing(
        clock="cuda" if device.type == "cuda" else "cpu",
        threads=torch.get_num_threads(),
        step_ms=statistics.median(rounds),
        rounds_ms=rounds,
        profiled_step_ms=profiled,
        offenders_ms=total(observed.offenders),
        regains_ms=total(observed.regains),
        parameter_ms=total(observed.parameter_conversions),
    )
