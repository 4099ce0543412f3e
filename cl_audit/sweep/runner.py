"""Runs many models, each in its own forked worker, so none can take the sweep down.

The parent imports torch (and timm) once; each model then runs in a child forked from it
(measured: ~0.1 s per fork against ~7 s and 860 MB for a fresh ``import torch, timm``), with one
OpenMP thread, at most ``jobs`` at a time. The parent watches every child: a crash, a timeout
or memory past the cap kills that child only and becomes a row. Memory is the child's private
resident memory (``/proc/PID/smaps_rollup``: pages shared with the parent do not count), sampled
every 0.2 s, because RLIMIT_AS is unreliable with CUDA builds of torch. The parent's objects
are frozen before each fork (``gc.freeze``), so a child's garbage collections leave them alone.
Each finished row is appended to a JSON Lines checkpoint at once, so an interrupted sweep can
``--resume``.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import math
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from cl_audit.enums import Mode, Stage, Status
from cl_audit.errors import UsageError
from cl_audit.report import ModelRow, ReportFormatError
from cl_audit.sweep.selection import estimated_cost
from cl_audit.sweep.worker import Job, audit_job, failed_row

__all__ = ["Checkpoint", "run_jobs", "set_up_worker"]

_POLL_SECONDS = 0.2


class Checkpoint:
    """A JSON Lines file of finished rows; each row is one ``write`` to an O_APPEND file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, ModelRow]:
        """Rows by key; a torn last line (the writer was killed mid-line) is ignored."""
        rows: dict[str, ModelRow] = {}
        if not self.path.exists():
            return rows
        for line in self.path.read_text().splitlines():
            try:
                row = ModelRow.from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, ReportFormatError):
                continue
            rows[row.key] = row
        return rows

    def start(self, keep: bool) -> None:
        """Begin (``keep``: go on with) the file; only the default folder is made here, the
        folder of a path the user gave was checked to exist."""
        try:
            self.path.parent.mkdir(exist_ok=True)
            if not keep:
                self.path.write_text("")
        except OSError as e:
            raise UsageError(f"checkpoint {self.path}: {e.strerror}") from None

    def append(self, row: ModelRow) -> None:
        """One finished row; a failed write (a full disk) ends the sweep (``UsageError``)."""
        line = (json.dumps(row.to_dict(), allow_nan=False) + "\n").encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise UsageError(f"checkpoint {self.path}: {e.strerror}") from None


def _peak(mb: float) -> float | None:
    """A peak for a row, to 0.1 MB rounded up: a worker stopped just over the cap never reads
    as at it (600.04 MB is 600.1, not 600.0); None where nothing was sampled."""
    return math.ceil(round(mb * 10, 6)) / 10 or None


def private_memory_mb(pid: int) -> float | None:
    """Resident memory the process does not share with others, or None if unreadable."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kib = sum(
        int(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("Private_Clean:", "Private_Dirty:"))
    )
    return kib / 1024


def set_up_worker(job: Job) -> None:
    """A forked worker's process, before its audit: one OpenMP thread; for fake tensors, no
    automatic garbage collection. A fake audit's garbage is Python objects and metadata
    (kilobytes), freed when the worker exits, and the collector's passes over the objects a
    step makes cost 2% of a fake training audit (0.36 of 20.5 s over 40 timm models); an
    eager audit keeps it, as its cycles can hold tensors' data. SIGTERM ends it, as it would
    any process (the parent turns its own into an interrupt)."""
    import torch

    from cl_audit.predict.table_store import keep_threads

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler is the parent's
    keep_threads()  # a prediction is for the machine the sweep runs on, not this worker's
    torch.set_num_threads(1)
    if job.mode is Mode.FAKE:
        gc.disable()


def _child(job: Job, conn: Connection, footprint: bool) -> None:
    """Runs in the forked worker. Its output goes to /dev/null: models print warnings, and
    anything that matters reaches the parent as the row."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    faulthandler.disable()  # a crash becomes a row; a parent's fault handler would print here
    set_up_worker(job)
    stage: list[Stage | None] = [None]

    def on_stage(name: Stage) -> None:
        stage[0] = name
        conn.send(("stage", name.value))

    try:
        on_files = (lambda files: conn.send(("files", sorted(files)))) if footprint else None
        row = audit_job(job, on_stage, on_files)
    except Exception as e:  # a failure outside the model's own build and forward
        row = failed_row(job, Status.ERROR, f"{type(e).__name__}: {e}", stage[0])
    conn.send(("row", row.to_dict()))
    conn.close()


@dataclass
class _Running:
    job: Job
    process: Any
    conn: Connection
    started: float
    stage: Stage | None = None
    files: set[str] = field(default_factory=set)  # the source files its audit ran through
    peak_mb: float = 0.0
    sampled: float = 0.0  # when memory was last read: at most every _POLL_SECONDS


def _signal_name(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode} before reporting"


def _failed_row(run: _Running, status: Status, message: str, elapsed: float) -> ModelRow:
    peak = _peak(run.peak_mb)
    return failed_row(run.job, status, message, run.stage, round(elapsed, 3), peak)


def _drain(job: _Running) -> ModelRow | None:
    """Read what the child sent; the row if it has arrived."""
    try:
        while job.conn.poll():
            kind, payload = job.conn.recv()
            if kind == "stage":
                job.stage = Stage(payload)
            elif kind == "files":
                job.files.update(payload)
            else:
                return ModelRow.from_dict(payload)
    except (EOFError, OSError):
        pass
    return None


def _stop(job: _Running) -> None:
    if job.process.is_alive():
        job.process.kill()
    job.process.join()
    job.conn.close()


def run_jobs(
    jobs: Iterable[Job],
    parallel: int,
    checkpoint: Checkpoint,
    on_start: Callable[[Job], None],
    on_finish: Callable[[ModelRow, frozenset[str]], None],
    footprint: bool = False,
) -> None:
    """Audit every job in a worker of its own, ``parallel`` at a time, costliest first so the
    tail is short; each row goes to the checkpoint, then to ``on_finish`` with the source files
    the worker said its audit ran through: read only with ``footprint`` (a sweep's cache needs
    them; reading costs a worker 0.4-0.7 s a model), and none if it died before saying. On
    Ctrl-C the workers are killed and the KeyboardInterrupt goes on: every finished row has
    been delivered by then."""
    context = multiprocessing.get_context("fork")
    pending = sorted(jobs, key=lambda j: (-estimated_cost(j.ref), j.ref))
    running: list[_Running] = []

    def finish(job: _Running, row: ModelRow) -> None:
        _stop(job)
        running.remove(job)
        # The peak is the one figure only the parent measures; the worker leaves it empty.
        row = replace(row, peak_memory_mb=_peak(job.peak_mb))
        checkpoint.append(row)
        on_finish(row, frozenset(job.files))

    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop(0)
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_child, args=(job, sender, footprint), daemon=True)
                # The parent's objects (torch's, timm's: ~400,000) out of the child's garbage
                # collections: a full one walked them all (0.5 s each; 7% of a training audit).
                gc.freeze()
                process.start()
                sender.close()
                running.append(_Running(job, process, receiver, time.monotonic()))
                on_start(job)
            wait([job.conn for job in running], timeout=_POLL_SECONDS)
            for job in list(running):
                elapsed = time.monotonic() - job.started
                row = _drain(job)
                if row is not None:
                    finish(job, row)
                elif not job.process.is_alive():
                    job.process.join()
                    row = _drain(job)  # it may have reported just before exiting
                    message = _signal_name(job.process.exitcode)
                    failed = _failed_row(job, Status.ERROR, message, elapsed)
                    finish(job, row or failed)
                elif elapsed > job.job.settings.timeout:
                    message = f"no result after {job.job.settings.timeout:g} s"
                    finish(job, _failed_row(job, Status.TIMEOUT, message, elapsed))
                elif time.monotonic() - job.sampled >= _POLL_SECONDS:
                    job.sampled = time.monotonic()
                    used = private_memory_mb(job.process.pid) or 0.0
                    job.peak_mb = max(job.peak_mb, used)
                    cap = job.job.settings.max_memory_mb
                    if cap is not None and used > cap:
                        message = f"used {used:.0f} MB, over the {cap:g} MB cap"
                        finish(job, _failed_row(job, Status.OUT_OF_MEMORY, message, elapsed))
    except KeyboardInterrupt:
        for job in running:
            _stop(job)
        raise
    finally:
        # Frozen objects escape the collections at exit too: nanobind (triton's bindings, which
        # torchvision's import of torch's compiler loads) then reports its objects as leaked.
        gc.unfreeze()
