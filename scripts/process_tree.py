"""A process and everything under it, from /proc (the scripts that measure or pause a process
tree: measure_sweep.py, quiet_lanes.py)."""

from __future__ import annotations

import os
from pathlib import Path


def children() -> dict[int, list[int]]:
    """Each running process's children."""
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found.setdefault(int(fields[1]), []).append(int(entry))
    return found


def tree(roots: list[int]) -> list[int]:
    """The roots and every process under them, each once."""
    below, seen, todo = children(), [], list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.append(pid)
            todo += below.get(pid, [])
    return seen
