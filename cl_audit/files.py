"""Reading and writing reports: '-' is stdout, a name ending in .gz is gzip-compressed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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

__all__ = ["check_writable", "read_report", "read_sweep", "write_text"]


def check_writable(path: Path | None, option: str) -> None:
    """Refuse, before any model runs, an output path that cannot be written."""
    if path is None or str(path) == "-":
        return
    folder = path.parent
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    if not folder.is_dir():
        raise UsageError(f"{option} {path}: no such directory {str(folder)!r}")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{option} {path}: not writable")


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


def read_report(path: Path) -> ModelReport | SweepReport:
    """A model or sweep report written by ``--json`` (any readable version, gzip or not)."""
    try:
        data = decode_document(path.read_bytes())
        kind = data.get("format") if isinstance(data, dict) else None
        if kind == SWEEP_FORMAT:
            return SweepReport.from_dict(data)
        if kind == REPORT_FORMAT:
            return ModelReport.from_dict(data)
        raise ReportFormatError(f"not a cl-audit report (format {kind!r})")
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except ReportFormatError as e:
        raise UsageError(f"{path}: {e}") from None
