"""Lanes of a proof run side by side on a small machine, each timing on a quiet one.

Two lanes (one per core) halve a proof's wall time, but one lane's compiles (g++, Inductor's
lowering) load the memory and caches that the other's timed rounds run on, in bursts that
paired rounds do not cancel. Here a lane's timed part runs alone: it takes an exclusive lock,
stops every other lane's processes (SIGSTOP to each process under the lane's root, g++
included), times, and lets them go on (SIGCONT); the compiles overlap, the timing does not.
A stopped lane's wall clocks (its compile seconds, its timeout) include the pauses: each
quiet part is logged (``quiet.log``: lane, start, seconds) so that their sum can be told.

The lanes share a folder, ``CL_AUDIT_QUIET_LANES``; each writes its root process's id to
``lane-N.pid`` (``CL_AUDIT_LANE`` = N). Without the variable nothing is stopped.

    python scripts/quiet_lanes.py cl-audit ARGS...  # the CLI, its timed rounds and profiled
                                                    # steps quiet (cl-audit's code unchanged)
    python scripts/quiet_lanes.py resume            # let every other lane go on (a safety
                                                    # net after each command of a lane)

``scripts/speed_truth.py`` imports ``quiet`` (this module imports nothing of cl-audit unless
run as ``cl-audit``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from process_tree import tree  # a sibling script

FOLDER = "CL_AUDIT_QUIET_LANES"
LANE = "CL_AUDIT_LANE"


def _other_roots(folder: Path) -> list[int]:
    own = os.environ.get(LANE)
    roots = []
    for path in folder.glob("lane-*.pid"):
        if path.stem != f"lane-{own}":
            with contextlib.suppress(ValueError, OSError):
                roots.append(int(path.read_text()))
    return roots


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    with open(folder / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def quiet(what: str = "") -> Iterator[None]:
    """The block with every other lane stopped (nothing stopped outside a lane)."""
    name = os.environ.get(FOLDER)
    if not name:
        yield
        return
    folder = Path(name)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout: go on
    try:
        with _locked(folder):
            roots = _other_roots(folder)
            start = time.time()
            try:  # stopping inside: a SIGTERM while stopping still lets them go on
                stopped = tree(roots)
                _signal(stopped, signal.SIGSTOP)
                late = [pid for pid in tree(roots) if pid not in stopped]  # forked meanwhile
                _signal(late, signal.SIGSTOP)
                yield
            finally:
                _signal(tree(roots), signal.SIGCONT)
                took = time.time() - start
                with open(folder / "quiet.log", "a") as log:
                    log.write(f"{os.environ.get(LANE)} {start:.1f} {took:.2f} {what}\n")
    finally:
        signal.signal(signal.SIGTERM, previous)


def _quietly(function: Callable, what: str) -> Callable:
    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        with quiet(what):
            return function(*args, **kwargs)

    return wrapped


def _cl_audit(arguments: list[str]) -> None:
    """cl-audit's CLI with the functions that time (the alternating rounds) and profile (one
    step per layout) run quietly."""
    from cl_audit.cli import main
    from cl_audit.phases import timed

    for name in ("alternate", "_profiled", "_profiled_compiled"):
        setattr(timed, name, _quietly(getattr(timed, name), f"cl-audit {name}"))
    sys.argv = ["cl-audit", *arguments]
    main()


def _resume() -> None:
    name = os.environ.get(FOLDER)
    if name:
        with _locked(Path(name)):
            _signal(tree(_other_roots(Path(name))), signal.SIGCONT)


if __name__ == "__main__":
    if sys.argv[1:2] == ["cl-audit"]:
        _cl_audit(sys.argv[2:])
    elif sys.argv[1:] == ["resume"]:
        _resume()
    else:
        sys.exit(f"usage: {sys.argv[0]} cl-audit ARGS... | resume")
