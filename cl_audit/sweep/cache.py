"""A directory of sweep rows reused across runs while nothing that could change them changed.

An entry is one small JSON file named by the SHA-256 of its key: the model, every setting that
can change a row (all of ``SweepSettings`` but ``jobs`` and ``timeline``), and the versions of
cl-audit (with a digest of its own source, so an edited checkout never reads old rows), torch,
torchvision, timm, Python and the CPU capability torch dispatches for, and the speed tables
known here (``predict.table_store.fingerprint``: a table made since changes the rows). The
entry repeats its key and holds the SHA-256 of every source file the model's audit ran through
(``cl_audit.sweep.footprint``); a row is reused only when the key matches and every file hashes
the same. Entries are written to a temporary file and renamed into place, so concurrent shards
sharing the directory never see half an entry; one that cannot be read is a miss, never
misread. Reuse refreshes an entry's modification time, and ``prune`` removes the least recently
used entries past the size cap.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import time
from collections.abc import Iterable
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from cl_audit.errors import UsageError
from cl_audit.predict.table_store import fingerprint
from cl_audit.report import ModelRow, ReportFormatError
from cl_audit.report.envelope import SWEEP_VERSION
from cl_audit.report.environment import distribution_version
from cl_audit.report.files import write_text
from cl_audit.sources import ModelRef
from cl_audit.sweep.footprint import FileDigests, portable
from cl_audit.sweep.worker import SweepSettings

__all__ = ["CACHE_FORMAT", "CACHE_VERSION", "DEFAULT_CACHE_MB", "SweepCache", "versions"]

CACHE_FORMAT = "cl-audit-cache"
CACHE_VERSION = 1
DEFAULT_CACHE_MB = 256.0
_STALE_TEMPORARY_SECONDS = 3600.0  # a writer killed mid-write leaves its temporary file


@functools.cache
def _own_source_digest() -> str:
    """SHA-256 over cl-audit's own files: a development checkout changes it with every edit."""
    digest = hashlib.sha256()
    package = resources.files("cl_audit")
    for path in sorted(Path(str(package)).rglob("*")):
        if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
            digest.update(path.relative_to(str(package)).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def versions() -> dict[str, str | None]:
    """Everything installed that a row depends on beyond its model's own files."""
    return {
        "cl_audit": distribution_version("cl-audit"),
        "cl_audit_source": _own_source_digest(),
        "sweep_row": str(SWEEP_VERSION),
        "torch": torch.__version__,
        "torchvision": distribution_version("torchvision"),
        "timm": distribution_version("timm"),
        "python": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "speed_tables": fingerprint(),  # a predicted speed reads the tables known here
    }


_NOT_IN_ROWS = ("jobs", "timeline")  # how many run at once; a single model's HTML timeline


def _key(ref: ModelRef, settings: SweepSettings) -> dict[str, Any]:
    """The key as JSON reads it back (lists, strings), so it compares with a stored one."""
    verdict_settings = {k: v for k, v in settings.to_dict().items() if k not in _NOT_IN_ROWS}
    key = {"model": ref.key, "settings": verdict_settings, "versions": versions()}
    return json.loads(json.dumps(key, default=str))


class SweepCache:
    """Rows of earlier sweeps under ``root``; failed rows are kept only with ``failures``."""

    def __init__(
        self,
        root: Path,
        settings: SweepSettings,
        *,
        failures: bool = False,
        max_mb: float = DEFAULT_CACHE_MB,
    ) -> None:
        self.root = root
        self.settings = settings
        self.failures = failures
        self.max_bytes = int(max_mb * 2**20)
        self._digests = FileDigests()

    def _entry(self, key: dict[str, Any]) -> Path:
        text = json.dumps(key, sort_keys=True, default=str)
        name = hashlib.sha256(text.encode()).hexdigest()
        return self.root / f"v{CACHE_VERSION}" / name[:2] / f"{name[2:32]}.json"

    def lookup(self, ref: ModelRef) -> ModelRow | None:
        """The row an earlier sweep stored for ``ref`` under the same key, if every file it ran
        through is unchanged (marked ``cached``); else None."""
        key = _key(ref, self.settings)
        path = self._entry(key)
        try:
            entry = json.loads(path.read_text())
            if (entry["format"], entry["version"], entry["key"]) != (
                CACHE_FORMAT,
                CACHE_VERSION,
                key,
            ):
                return None
            files: dict[str, str] = entry["files"]
            if not files or any(self._digests(name) != digest for name, digest in files.items()):
                return None
            row = ModelRow.from_dict(entry["row"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ReportFormatError):
            return None  # absent, half-written by a killed process, or not an entry
        if row.key != ref.key or (row.status.failed and not self.failures):
            return None
        with contextlib.suppress(FileNotFoundError):  # a concurrent shard pruned it just now
            os.utime(path)  # recently used: pruned last
        return replace(row, cached=True)

    def store(self, row: ModelRow, files: Iterable[str]) -> bool:
        """Keep ``row`` with the digests of ``files``; not a failure (unless ``failures``), nor a
        row whose files are unknown (its worker died before naming them)."""
        names = sorted({portable(f) for f in files})
        digests = {name: self._digests(name) for name in names}
        if not digests or None in digests.values() or row.cached:
            return False
        if row.status.failed and not self.failures:
            return False
        ref = ModelRef(row.source, row.name)
        key = _key(ref, self.settings)
        entry = {
            "format": CACHE_FORMAT,
            "version": CACHE_VERSION,
            "key": key,
            "files": digests,
            "row": row.to_dict(),
        }
        path = self._entry(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--cache {self.root}: {e.strerror}") from None
        text = json.dumps(entry, allow_nan=False, sort_keys=True)
        write_text(path, text, "--cache")  # whole or not at all, as every file
        return True

    def prune(self) -> int:
        """Remove the least recently used entries until the cache is within its cap (and
        temporary files of killed writers); the number of entries removed."""
        entries: list[tuple[float, int, Path]] = []
        now = time.time()
        for path in self.root.glob("v*/*/*"):
            try:
                stat = path.stat()
            except FileNotFoundError:  # another shard pruned it
                continue
            if path.name.endswith(".tmp"):
                if now - stat.st_mtime > _STALE_TEMPORARY_SECONDS:
                    path.unlink(missing_ok=True)
                continue
            entries.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            removed += 1
        return removed
