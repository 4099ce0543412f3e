"""Reading and writing reports: '-' is stdout, a name ending in .gz is gzip-compressed."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from cl_audit.errors import UsageError
from cl_audit.report import (
    REPORT_FORMAT,
    SWEEP_FORMAT,
    ModelReport,
    ReportFormatError,
    SweepReport,
    decode_document,
    encode_document,
)
from cl_audit.report.ops_report import OpsIndex

__all__ = [
    "check_folder",
    "check_writable",
    "read_ops",
    "read_report",
    "read_sweep",
    "write_json",
    "write_text",
]


def check_writable(path: Path | None, option: str) -> None:
    """Refuse, before any model runs, an output file that cannot be written: its folder must
    exist (nothing is created for it), the path must not be a folder, and a probe write must
    succeed (a read-only place such as /sys, a full disk, /dev/full)."""
    if path is None or str(path) == "-":
        return
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    folder = path.parent
    if not folder.exists():
        raise UsageError(f"{option} {path}: no such directory {str(folder)!r}")
    if not folder.is_dir():
        raise UsageError(f"{option} {path}: {str(folder)!r} is not a directory")
    if path.exists() and not path.is_file():  # a device: written as it is
        _probe(option, path, lambda: _append_newline(path))
        return
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {path}: not writable")
    _probe(option, path, lambda: _temporary_file(folder))


def check_folder(path: Path, option: str) -> None:
    """Refuse, before any model runs, a folder the run cannot create (with its parents) or
    write in."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {str(existing)!r} is not a directory")
    _probe(option, path, lambda: _temporary_file(existing))


def _probe(option: str, path: Path, write: Callable[[], None]) -> None:
    try:
        write()
    except OSError as e:
        raise UsageError(f"{option} {path}: not writable ({e.strerror})") from None


def _temporary_file(folder: Path) -> None:
    """One byte written to a new file in ``folder``, which is then removed."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".cl-audit-probe-") as probe:
        probe.write(b"\n")
        probe.flush()
        os.fsync(probe.fileno())


def _append_newline(path: Path) -> None:
    """A newline appended to a device that exists (a full one refuses it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    try:
        os.write(fd, b"\n")
    finally:
        os.close(fd)


class _Document(Protocol):
    def to_json(self, indent: int | None = ...) -> str: ...


def write_json(path: Path, document: _Document, option: str) -> None:
    """``document``'s JSON written as ``write_text`` writes: indented, but for a .gz name
    (compressed for size, where indenting a whole registry's report takes seconds)."""
    text = document.to_json(indent=None) if path.suffix == ".gz" else document.to_json()
    write_text(path, text + "\n", option)


def write_text(path: Path, text: str, option: str) -> None:
    """Write ``text`` to ``path`` (gzip for .gz, stdout for '-'); ``option`` names the flag in
    the error of an unwritable path."""
    if str(path) == "-":
        sys.stdout.write(text)
        return
    try:
        if path.suffix == ".gz":
            path.write_bytes(encode_document(text, compress=True))
        else:
            path.write_text(text)
    except OSError as e:
        raise UsageError(f"{option} {path}: {e.strerror}") from None


def read_sweep(path: Path) -> SweepReport:
    """A sweep report written by ``--json`` (any readable version, gzip or not)."""
    try:
        return SweepReport.from_bytes(path.read_bytes())
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except ReportFormatError as e:
        raise UsageError(f"{path}: {e}") from None


def read_ops(path: Path) -> OpsIndex:
    """An operator coverage index written by ``cl-audit ops --json`` (gzip or not)."""
    try:
        return OpsIndex.from_dict(decode_document(path.read_bytes()))
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except ReportFormatError as e:
        raise UsageError(f"{path}: {e}") from None


def read_report(path: Path) -> ModelReport | SweepReport:
    """A model or sweep report written by ``--json`` (any readable version, gzip or not)."""
    try:
        data = decode_document(path.read_bytes())
        kind = data.get("format") if isinstance(data, dict) else None
        if kind == SWEEP_FORMAT:
            return SweepReport.from_dict(data)
        if kind == REPORT_FORMAT:
            return ModelReport.from_dict(data)
        raise ReportFormatError(f"format {kind!r} is not a cl-audit model or sweep report")
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except ReportFormatError as e:
        raise UsageError(f"{path}: {e}") from None
