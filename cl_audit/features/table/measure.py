"""``cl-audit table``: this machine's operation time table, measured within a budget.

The parts, in order, each within its share of the budget and each written as it goes (a line
per measurement in the table's log, the table file rewritten whole every few seconds and at the
end, so that a budget cut short or Ctrl-C keeps what was measured, and ``resume`` goes on from
it): the host's cost per kind of operation (``host``); then per dtype the probes at their
general sizes (``probes``, at most a quarter of the dtype's share), the exact convolutions and
maps of the models the table is made for (``targets``, at most half of what is left), and the
convolution grid at each of the device's grid batches (the rest). A part that ends early
leaves its time to the next.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cl_audit.compat.cuda import cuda_present
from cl_audit.errors import UsageError
from cl_audit.features.table.clock import Clock
from cl_audit.features.table.convs import conv_grid, conv_key, measure_conv
from cl_audit.features.table.document import Log, document, table_name
from cl_audit.features.table.host import HOST_BASIS, measure_host
from cl_audit.features.table.probes import DTYPES, PROBE_SHAPES, measure_probe, probe_names
from cl_audit.features.table.targets import Target, target
from cl_audit.predict.speed_table import ConvCall, kernel_name
from cl_audit.predict.table_store import this_machine, user_folder
from cl_audit.sources import ModelRef

__all__ = ["GRID_BATCHES", "TableRequest", "TableResult", "make_table"]

GRID_BATCHES = {"cpu": (2, 8), "cuda": (64, 128)}
DEFAULT_DTYPES = {"cpu": ("float32",), "cuda": ("float16", "float32")}
DEFAULT_BUDGET_MINUTES = 8.0
_SAVE_EVERY_S = 10.0


@dataclass(frozen=True)
class TableRequest:
    """What to measure: the device, the dtypes (None: the device's defaults), the budget in
    seconds, the models whose configurations go first (at their batch and input size, their
    training step with ``train``), where the table goes (None: the user's table folder, named
    by the machine), whether to go on from an earlier run (``resume``) or replace it
    (``force``), the repeats of each measurement and the grid's batches (None: the device's)."""

    device: str = "cpu"
    dtypes: tuple[str, ...] | None = None
    budget_s: float = DEFAULT_BUDGET_MINUTES * 60
    targets: tuple[ModelRef, ...] = ()
    batch_size: int | None = None
    input_size: tuple[int, ...] | None = None
    train: bool = False
    out: Path | None = None
    resume: bool = False
    force: bool = False
    repeats: int = 3
    grid_batches: tuple[int, ...] | None = None
    command: str = ""

    def chosen_dtypes(self) -> tuple[str, ...]:
        return self.dtypes or DEFAULT_DTYPES[self.device]


@dataclass
class TableResult:
    """Where the table went, whether every part was measured to its end, whether Ctrl-C cut
    it short, and what it holds (per dtype: convolutions, operation samples)."""

    path: Path
    name: str
    complete: bool = False
    interrupted: bool = False
    seconds: float = 0.0
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)


# the part, what in it is being measured, the seconds spent and the budget
Progress = Callable[[str, str, float, float], None]


def check_request(request: TableRequest) -> None:
    """Refuse, before anything is measured, what cannot take effect here."""
    if request.device not in ("cpu", "cuda"):
        raise UsageError(
            f"`device` {request.device}: cl-audit table measures cpu and cuda (the profiler's "
            "per-operation clock on other devices is not read yet)"
        )
    if request.device == "cuda" and not cuda_present():
        raise UsageError("`device` cuda: CUDA is not available on this machine")
    unknown = [d for d in request.chosen_dtypes() if d not in DTYPES]
    if unknown:
        raise UsageError(f"`dtype` {unknown[0]}: choose from {', '.join(DTYPES)}")
    if request.budget_s <= 0:
        raise UsageError("`budget` must be more than 0 minutes")
    if request.resume and request.force:
        raise UsageError("`resume` goes on from the table, `force` replaces it: give one")


# writes a file whole or not at all (the edge's ``files.write_text``): path, text
Write = Callable[[Path, str], None]


def make_table(request: TableRequest, progress: Progress, write: Write) -> TableResult:
    """Measure this machine's table as ``request`` says (see the module docstring), the table
    written whole by ``write`` every few seconds and at the end."""
    check_request(request)
    identity = this_machine(request.device)
    assert identity is not None  # check_request made sure the device is here
    name = table_name(identity)
    out = request.out or user_folder() / f"{name}.json"
    log_path = out.with_name(out.name.removesuffix(".json") + ".jsonl")
    if not request.resume and not request.force and (out.exists() or log_path.exists()):
        raise UsageError(
            f"{out} exists: `resume` adds to it within the budget, `force` measures it anew"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # as users set it: each shape's kernel autotuned
    log = Log.open(log_path, identity, request.resume)
    log.add({"part": "run", "command": request.command or "cl-audit table"})
    session = _Session(request, log, out, progress, write)
    result = TableResult(out, name)
    try:
        result.complete = session.run()
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        torch.backends.cudnn.benchmark = benchmark
        log.close()
    if log.of("host"):
        session.save(result.complete)
        result.counts = session.counts()
    result.seconds = round(sum(r.get("seconds", 0.0) for r in log.rows), 1)
    return result


class _Session:
    """One run of ``make_table``: the parts in order against the clock."""

    def __init__(
        self, request: TableRequest, log: Log, out: Path, progress: Progress, write: Write
    ) -> None:
        self.request, self.log, self.out, self.progress = request, log, out, progress
        self.write = write
        self.device = request.device
        self.clock = Clock(self.device)
        self.start = time.monotonic()
        self.deadline = self.start + request.budget_s
        self.saved = self.start
        self.batches = request.grid_batches or GRID_BATCHES[self.device]
        self.part = "host"

    def settings(self) -> dict[str, Any]:
        return {
            "repeats": self.request.repeats,
            "grid_batches": list(self.batches),
            "dtypes": sorted({r["dtype"] for r in self.log.of("probe") + self.log.of("conv")}),
            "cudnn_benchmark": True,
            "tf32_convolutions": torch.backends.cudnn.allow_tf32,
            "autocast_probes": self.device == "cuda",
        }

    def save(self, complete: bool) -> None:
        made = "; ".join(r["command"] for r in self.log.of("run"))
        doc = document(self.log, self.settings(), made, complete)
        self.write(self.out, json.dumps(doc, separators=(",", ":")) + "\n")
        self.saved = time.monotonic()

    def counts(self) -> dict[str, tuple[int, int]]:
        by: dict[str, list[int]] = {}
        for r in self.log.of("conv"):
            by.setdefault(r["dtype"], [0, 0])[0] += 1
        for r in self.log.of("probe"):
            by.setdefault(r["dtype"], [0, 0])[1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(by.items())}

    def _tell(self, what: str) -> None:
        self.progress(self.part, what, time.monotonic() - self.start, self.request.budget_s)

    def _record(self, row: dict[str, Any], began: float) -> None:
        row["seconds"] = round(time.monotonic() - began, 3)
        self.log.add(row)
        if time.monotonic() - self.saved > _SAVE_EVERY_S and self.log.of("host"):
            self.save(False)

    def run(self) -> bool:
        """Every part; whether each was measured to its end."""
        if not self.log.of("host"):
            self._tell("the host's cost per operation")
            began = time.monotonic()
            costs = measure_host(self.clock, self.device)
            self._record({"part": "host", "costs": costs, "basis": HOST_BASIS}, began)
            self.save(False)
        targets = [self._target(ref) for ref in self.request.targets]
        dtypes = self.request.chosen_dtypes()
        complete = True
        for i, dtype in enumerate(dtypes):
            slice_end = self.start + self.request.budget_s * (i + 1) / len(dtypes)
            length = slice_end - time.monotonic()
            complete &= self._part(f"probes {dtype}", self._probes(dtype), min(
                slice_end, time.monotonic() + 0.25 * length))  # fmt: skip
            if targets:
                left = slice_end - time.monotonic()
                complete &= self._part(f"models {dtype}", self._targeted(dtype, targets), min(
                    slice_end, time.monotonic() + 0.5 * left))  # fmt: skip
            for batch in self.batches:
                grid = ((c, "grid") for c in conv_grid(batch))
                complete &= self._part(f"grid {dtype} batch {batch}", self._convs(dtype, grid),
                                       slice_end)  # fmt: skip
        return complete

    def _part(self, name: str, steps: Iterator[Callable[[], None]], deadline: float) -> bool:
        """Run ``steps`` until ``deadline``; whether all ran (then the part is marked done)."""
        if name in self.log.parts_done():
            return True
        self.part = name
        for step in steps:
            if time.monotonic() >= deadline:
                return False
            step()
        self.log.add({"part": "done", "name": name})
        return True

    def _target(self, ref: ModelRef) -> Target:
        self.part = "models"
        self._tell(f"listing {ref.name}'s operations (a fake run)")
        r = self.request
        began = time.monotonic()
        found = target(ref, self.device, r.batch_size, r.input_size, r.train)
        if found.name not in {row["name"] for row in self.log.of("model")}:
            self._record({"part": "model", "name": found.name}, began)
        return found

    def _probes(self, dtype: str) -> Iterator[Callable[[], None]]:
        done = self.log.probes_done()
        for shape in PROBE_SHAPES[self.device]:
            for name in probe_names():
                if (name, dtype, shape) not in done:
                    yield self._probe_step(name, dtype, shape)

    def _probe_step(self, name: str, dtype: str, shape: tuple[int, ...]) -> Callable[[], None]:
        def step() -> None:
            self._tell(f"{dtype} {name} at {'x'.join(map(str, shape))}")
            began = time.monotonic()
            try:
                row = measure_probe(self.clock, self.device, dtype, name, shape,
                                    self.request.repeats)  # fmt: skip
            except (RuntimeError, ValueError, NotImplementedError) as e:
                row = {"probe": name, "dtype": dtype, "shape": list(shape), "error": _why(e)}
                self._record({"part": "failed", **row}, began)
                return
            self._record({"part": "probe", **row}, began)

        return step

    def _targeted(self, dtype: str, targets: list[Target]) -> Iterator[Callable[[], None]]:
        """The models' convolutions, then their maps' probes (each probe whose operations the
        model runs, at the model's map shapes)."""
        calls = ((c, "model") for t in targets for c in t.convolutions)
        yield from self._convs(dtype, calls)
        runs_ops = self._probe_ops()
        done = self.log.probes_done()
        for t in targets:
            for op, shape in t.maps:
                names = {n.removesuffix(":eval") for n in (op, kernel_name(op))}
                for name, ops in runs_ops.items():
                    if names & ops and (name, dtype, shape) not in done:
                        done.add((name, dtype, shape))
                        yield self._probe_step(name, dtype, shape)

    def _probe_ops(self) -> dict[str, set[str]]:
        """Each probe's aten operations, as its measured rows name them."""
        found: dict[str, set[str]] = {}
        for r in self.log.of("probe"):
            names = {p["op"] for layout in ("channels_last", "nchw") for p in r[layout]["profile"]}
            found.setdefault(r["probe"], set()).update(names)
        return found

    def _convs(
        self, dtype: str, calls: Iterator[tuple[ConvCall, str]]
    ) -> Iterator[Callable[[], None]]:
        done = self.log.convs_done()
        for call, source in calls:
            key = conv_key(dtype, call)
            if key in done:
                continue
            done.add(key)
            yield self._conv_step(dtype, call, source)

    def _conv_step(self, dtype: str, call: ConvCall, source: str) -> Callable[[], None]:
        def step() -> None:
            self._tell(
                f"{dtype} {call.kind} {call.kernel}x{call.kernel}/{call.stride} "
                f"{call.cin}->{call.cout} at {call.batch}x{call.height}x{call.width} ({source})"
            )
            began = time.monotonic()
            asked = list(conv_key(dtype, call))
            try:
                row = measure_conv(self.clock, self.device, DTYPES[dtype], dtype, call,
                                   self.request.repeats)  # fmt: skip
            except (RuntimeError, ValueError) as e:  # too large for the device, say: said so
                if self.device == "cuda":
                    torch.cuda.empty_cache()
                self._record({"part": "failed", "asked": asked, "error": _why(e)}, began)
                return
            self._record({"part": "conv", "source": source, "asked": asked, **row}, began)

        return step


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
