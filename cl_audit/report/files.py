"""Reading and writing reports: '-' is stdout, a name ending in .gz is gzip-compressed.

Every file is written whole or not at all: to a temporary file in the target's folder, flushed
to the disk, then renamed over the target, so a failure (a full disk, a signal) leaves the
previous file as it was. A target that is not a regular file (a device, a pipe) is written in
place: nothing can be renamed over it."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from cl_audit.errors import UsageError
from cl_audit.report import (
    REPORT_FORMAT,
    SWEEP_FORMAT,
    ModelReport,
    ReportFormatError,
    SweepReport,
    decode_document,
    encode_document,
    load_schema,
)
from cl_audit.report.envelope import (
    OPS_FORMAT,
    OPS_READABLE,
    REPORT_READABLE,
    SWEEP_READABLE,
    check_envelope,
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
    """Write ``text`` to ``path`` whole or not at all (gzip for .gz, stdout for '-');
    ``option`` names the flag in the error (``UsageError``, one line) of a path or a stream
    that cannot take it."""
    if str(path) == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except (OSError, ValueError) as e:  # a full or closed stdout
            _silence_stdout()
            reason = e.strerror if isinstance(e, OSError) else "closed"
            raise UsageError(f"{option} -: standard output refused it ({reason})") from None
        return
    data = encode_document(text, compress=path.suffix == ".gz")
    if path.exists() and not path.is_file():  # a device or a pipe: nothing to rename over it
        try:
            with open(path, "wb") as stream:
                stream.write(data)
        except OSError as e:
            raise UsageError(f"{option} {path}: {e.strerror}") from None
        return
    _replace(path, data, option)


def _silence_stdout() -> None:
    """Standard output pointed at the null device: what is still buffered for it (and the
    interpreter's flush at exit) goes nowhere, instead of failing again."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def _replace(path: Path, data: bytes, option: str) -> None:
    """``data`` in a temporary file beside ``path``, synced, then renamed over it, with the
    mode a new file gets (or the old file's); the temporary file removed on any failure."""
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise UsageError(
            f"{option} {path}: cannot create a file in {str(path.parent)!r} ({e.strerror})"
        ) from None
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(name, _mode(path))
        os.replace(name, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(name)
        if isinstance(e, OSError):
            raise UsageError(f"{option} {path}: {e.strerror}") from None
        raise


def _mode(path: Path) -> int:
    """The old file's permissions, or a new file's under the process's umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _valid(data: Any, kind: str) -> Any:
    """``data`` if the shipped JSON Schema of its format's version (``kind``: report, sweep,
    ops) takes it; ``ReportFormatError`` naming the first thing it refuses otherwise (a
    document the reader could read but which no cl-audit wrote: negative counts, unknown
    verdicts). Envelope checks (format, version) come first, from the reader's own words."""
    import jsonschema

    formats = {"report": (REPORT_FORMAT, REPORT_READABLE), "sweep": (SWEEP_FORMAT, SWEEP_READABLE),
               "ops": (OPS_FORMAT, OPS_READABLE)}  # fmt: skip
    version = check_envelope(data, *formats[kind])  # the reader's own words first
    if kind == "report" and data.get("status") == "error":
        return data  # a failed run's report: the reader says what it is
    schema = load_schema(kind, version)
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema).iter_errors(data)
    )
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "the document"
        raise ReportFormatError(
            f"not a valid {kind} of version {version}: {where}: {error.message}"
        )
    return data


def read_sweep(path: Path) -> SweepReport:
    """A sweep report written by ``--json`` (any readable version, gzip or not, valid under
    its version's schema)."""
    try:
        return SweepReport.from_dict(_valid(decode_document(path.read_bytes()), "sweep"))
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except ReportFormatError as e:
        raise UsageError(f"{path}: {e}") from None


def read_ops(path: Path) -> OpsIndex:
    """An operator coverage index written by ``cl-audit ops --json`` (gzip or not, valid under
    its version's schema)."""
    try:
        return OpsIndex.from_dict(_valid(decode_document(path.read_bytes()), "ops"))
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except ReportFormatError as e:
        raise UsageError(f"{path}: {e}") from None


def read_report(path: Path) -> ModelReport | SweepReport:
    """A model or sweep report written by ``--json`` (any readable version, gzip or not, valid
    under its version's schema)."""
    try:
        data = decode_document(path.read_bytes())
        kind = data.get("format") if isinstance(data, dict) else None
        if kind == SWEEP_FORMAT:
            return SweepReport.from_dict(_valid(data, "sweep"))
        if kind == REPORT_FORMAT:
            return ModelReport.from_dict(_valid(data, "report"))
        raise ReportFormatError(f"format {kind!r} is not a cl-audit model or sweep report")
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except ReportFormatError as e:
        raise UsageError(f"{path}: {e}") from None
