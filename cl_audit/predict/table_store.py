"""Where operation time tables live, this machine's identity, and which table an audit uses.

Tables ship with cl-audit (``cl_audit/predict/tables``) and are made by ``cl-audit table`` in the
user's cache folder (``platformdirs.user_cache_dir("cl-audit")/tables``; the environment
variable ``CL_AUDIT_TABLES`` names another folder). An audit that predicts picks, of the tables
of its device type that hold its dtype: this machine's own (the same device model, CPU
configuration, torch release and backend library: ``TableMatch.THIS_MACHINE``), else one of
the same device model (another release, library, host or thread count), else one of another
device of the type; within each, the user's tables before the shipped ones, then the newest
torch release. ``--table NAME|FILE`` chooses instead. Every prediction says which it used and
how it matched (``TableUse``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import platformdirs
import torch

from cl_audit.compat.cuda import cuda_present
from cl_audit.enums import TableMatch
from cl_audit.errors import UsageError
from cl_audit.predict.speed_table import SpeedTable
from cl_audit.report.envelope import (
    TABLE_FORMAT,
    TABLE_VERSION,
    ReportFormatError,
    check_envelope,
    decode_document,
    load_schema,
)
from cl_audit.report.machine import MachineIdentity, TableUse, release

__all__ = [
    "TABLES_ENV",
    "Choice",
    "Store",
    "backend_version",
    "choose",
    "cpu_model",
    "fingerprint",
    "keep_threads",
    "store",
    "this_machine",
    "user_folder",
]

TABLES_ENV = "CL_AUDIT_TABLES"
# The threads the user's runs compute with, where this process computes with others: a sweep's
# forked worker runs one thread so that workers share the cores, and predicts for the machine
# the sweep was started on (``keep_threads``).
_kept_threads: list[int] = []
_RANK = {TableMatch.THIS_MACHINE: 0, TableMatch.SAME_DEVICE: 1, TableMatch.OTHER_DEVICE: 2}


def user_folder() -> Path:
    """Where ``cl-audit table`` keeps this user's tables."""
    given = os.environ.get(TABLES_ENV)
    if given:
        return Path(given)
    return Path(platformdirs.user_cache_dir("cl-audit")) / "tables"


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what Python's platform says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@functools.cache
def backend_version(device_type: str) -> str:
    """The library that runs this torch's convolutions on ``device_type``: cuDNN's version on
    CUDA, oneDNN's on the CPU (from torch's build configuration)."""
    if device_type == "cuda":
        v = torch.backends.cudnn.version() or 0
        return f"cudnn-{v // 10000}.{v // 100 % 100}" if v else "cudnn-none"
    found = re.search(r"MKL-DNN v([\d.]+)", torch.__config__.show())
    return f"onednn-{found.group(1)}" if found else "onednn-none"


def keep_threads() -> None:
    """Remember the threads torch computes with now, as this machine's, before a worker
    changes them for itself."""
    _kept_threads[:] = [torch.get_num_threads()]


def this_machine(device_type: str, index: int = 0) -> MachineIdentity | None:
    """This machine as a table of ``device_type`` would describe it; None where it has no
    such device (a fake CUDA audit on a machine without a GPU). Asks CUDA for the device's
    properties: call it where CUDA may be initialised (not before forking workers)."""
    torch_release = torch.__version__.split("+")[0]
    cores = os.cpu_count()
    if device_type == "cpu":
        threads = _kept_threads[0] if _kept_threads else torch.get_num_threads()
        return MachineIdentity(
            "cpu", cpu_model(), cores, threads, torch=torch_release, backend=backend_version("cpu")
        )
    if device_type == "cuda" and cuda_present():
        props = torch.cuda.get_device_properties(index)
        return MachineIdentity(
            "cuda",
            props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            host=f"{cpu_model()} ({cores} cores)",
            torch=torch_release,
            backend=backend_version("cuda"),
        )
    return None


def match(table: MachineIdentity, here: MachineIdentity | None) -> TableMatch:
    """How the machine a table describes matches ``here`` (see the module docstring)."""
    if here is None or table.device_model != here.device_model:
        return TableMatch.OTHER_DEVICE
    same_software = (table.torch, table.backend) == (here.torch, here.backend)
    if table.hardware == here.hardware and same_software:
        return TableMatch.THIS_MACHINE
    return TableMatch.SAME_DEVICE


@dataclass(frozen=True)
class Store:
    """The tables known here: the user's (newest file first) and the shipped ones, and the
    user's files that could not be read, with why."""

    tables: tuple[SpeedTable, ...]
    unreadable: tuple[tuple[Path, str], ...]

    def of(self, device_type: str) -> tuple[SpeedTable, ...]:
        return tuple(t for t in self.tables if t.device == device_type)

    def named(self, name: str) -> SpeedTable | None:
        wanted = name.removesuffix(".json")
        return next((t for t in self.tables if t.name == wanted), None)


def store() -> Store:
    """Every table known now (the user's folder read afresh: ``cl-audit table`` may have just
    written one; each file is read once while it is unchanged)."""
    found, unreadable = [], []
    folder = user_folder()
    paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in paths if folder.is_dir() else ():
        try:
            found.append(_user_table(path, path.stat().st_mtime_ns))
        except UsageError as e:
            unreadable.append((path, str(e)))
    return Store((*found, *_shipped()), tuple(unreadable))


@functools.cache
def _user_table(path: Path, mtime_ns: int) -> SpeedTable:
    return SpeedTable(_document(path), source=str(path))


def _document(path: Path) -> dict:
    """A table file's document (gzip or not), valid under its version's schema; a one-line
    ``UsageError`` naming the file and what is wrong otherwise."""
    import jsonschema

    try:
        data = decode_document(path.read_bytes())
        check_envelope(data, TABLE_FORMAT, (TABLE_VERSION,))
        schema = jsonschema.Draft202012Validator(load_schema("speed-table"))
        error = jsonschema.exceptions.best_match(schema.iter_errors(data))
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except ReportFormatError as e:
        raise UsageError(f"{path}: {e}") from None
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "the document"
        raise UsageError(f"{path}: not a valid speed table: {where}: {error.message}")
    return data


@functools.cache
def _shipped() -> tuple[SpeedTable, ...]:
    folder = resources.files("cl_audit.predict").joinpath("tables")
    entries = sorted((e for e in folder.iterdir() if e.name.endswith(".json")), key=str)
    return tuple(SpeedTable(json.loads(e.read_text())) for e in entries)


def fingerprint() -> str:
    """A digest of every table known here (name, source, when measured, its contents' size):
    what a cached row's predicted speed depends on beyond the settings."""
    known = store()
    parts = [
        (t.name, t.source, t.measured, t.seconds, sorted(t.counts().items())) for t in known.tables
    ]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def load_file(path: Path) -> SpeedTable:
    """A table from a file a user names (``--table FILE``)."""
    return _user_table(path.resolve(), path.stat().st_mtime_ns)


@dataclass(frozen=True)
class Choice:
    """The table a prediction uses, and how it was chosen (the report's ``speed.table``)."""

    table: SpeedTable
    use: TableUse


def choose(
    device_type: str,
    dtype: str | None,
    requested: str | None = None,
    here: MachineIdentity | None = None,
) -> Choice | None:
    """The table to predict ``device_type`` with (see the module docstring): ``requested``
    (a name or a file) if given, else the best of those holding ``dtype`` (of none holding
    it, the best of the type, whose lack the caller reports); None without any table of the
    type. ``here`` is this machine (``this_machine``), None where it has no such device."""
    known = store()
    if requested is not None:
        table = _requested(known, requested)
        if table.device != device_type:
            raise UsageError(
                f"`table` {requested}: describes {table.device}, and the audit runs on "
                f"{device_type}"
            )
        return _choice(table, here, chosen=True)
    tables = known.of(device_type)
    if not tables:
        return None
    holding = [t for t in tables if dtype is None or dtype in t.dtypes()] or list(tables)
    best = min(holding, key=lambda t: _order(t, here))
    return _choice(best, here, chosen=False)


def _requested(known: Store, requested: str) -> SpeedTable:
    path = Path(requested)
    if path.suffix in (".json", ".gz") or os.sep in requested:
        if not path.is_file():
            raise UsageError(f"`table` {requested}: no such file")
        return load_file(path)
    table = known.named(requested)
    if table is None:
        names = ", ".join(t.name for t in known.tables) or "none"
        raise UsageError(f"`table` {requested}: no table of that name (known: {names})")
    return table


def _order(table: SpeedTable, here: MachineIdentity | None) -> tuple[object, ...]:
    """Better first: by match, a CPU of the same name, the user's own, the newest release."""
    rank = _RANK[match(table.identity, here)]
    other_model = here is None or table.identity.model != here.model
    newest = tuple(-n for n in release(table.identity.torch))
    return (rank, other_model, table.source == "shipped", newest, table.name)


def _choice(table: SpeedTable, here: MachineIdentity | None, chosen: bool) -> Choice:
    found = match(table.identity, here)
    differences = () if here is None else table.identity.differences(here)
    use = TableUse(
        name=table.name,
        identity=table.identity,
        match=found,
        chosen=chosen,
        source=table.source,
        differences=differences,
        this_machine=here,
    )
    return Choice(table, use)
