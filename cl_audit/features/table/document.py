"""A table's measurements as they are logged (a JSON line each, written as they are made, so
that a run cut short keeps them and ``--resume`` goes on from them), and the table document
made of them (``predict.speed_table`` reads it; the schema ``speed-table.schema.json``)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cl_audit.errors import UsageError
from cl_audit.features.table.convs import conv_key
from cl_audit.features.table.probes import op_rows
from cl_audit.predict.speed_table import ConvCall
from cl_audit.report.codec import encode
from cl_audit.report.envelope import TABLE_FORMAT, TABLE_VERSION
from cl_audit.report.machine import MachineIdentity

__all__ = ["Log", "document", "table_name"]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def table_name(identity: MachineIdentity) -> str:
    """A table's file name: ``cpu-amd-epyc-2c2t_torch-2.14.1_onednn-3.12.0`` (model, cores,
    threads, release, library), ``cuda-nvidia-h200_torch-2.11.0_cudnn-9.19``."""
    device = f"{identity.device}-{_slug(identity.model)}"
    if identity.device == "cpu":
        device += f"-{identity.cores}c{identity.threads}t"
    return f"{device}_torch-{identity.torch}_{identity.backend}"


class Log:
    """The measurements of one table, one JSON object a line: ``header`` (the machine, once),
    ``host``, ``probe``, ``conv`` and ``model`` rows, and the ``done`` row of each part
    measured to its end. Appended and flushed one row at a time."""

    def __init__(self, path: Path, rows: list[dict[str, Any]]) -> None:
        self.path = path
        self.rows = rows
        self._stream = open(path, "a", buffering=1)

    @classmethod
    def open(cls, path: Path, identity: MachineIdentity, resume: bool) -> Log:
        """The log at ``path``: read on and appended to with ``resume`` (refused when another
        machine wrote it), else begun anew with its header."""
        rows: list[dict[str, Any]] = []
        if resume and path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            header = next((r for r in rows if r["part"] == "header"), None)
            if header is None or header["identity"] != encode(identity):
                theirs = "no header" if header is None else header["identity"]
                raise UsageError(
                    f"`resume`: {path} was measured on another machine or release ({theirs}); "
                    "this one is measured anew without `resume` (with `force`)"
                )
        elif path.exists():
            path.unlink()
        log = cls(path, rows)
        if not rows:
            now = datetime.now(timezone.utc).isoformat(timespec="seconds")
            log.add({"part": "header", "identity": encode(identity), "measured": now})
        return log

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._stream.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self._stream.close()

    def of(self, part: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["part"] == part]

    def probes_done(self) -> set[tuple[str, str, tuple[int, ...]]]:
        """The probes measured, and those that failed (not tried again)."""
        rows = self.of("probe") + [r for r in self.of("failed") if "probe" in r]
        return {(r["probe"], r["dtype"], tuple(r["shape"])) for r in rows}

    def convs_done(self) -> set[tuple[Any, ...]]:
        """The convolutions measured (as asked, and as made), and those that failed."""
        done = {tuple(r["asked"]) for r in self.of("conv") + self.of("failed") if "asked" in r}
        return done | {conv_key(r["dtype"], _call(r)) for r in self.of("conv")}

    def parts_done(self) -> set[str]:
        return {r["name"] for r in self.of("done")}


def _call(row: dict[str, Any]) -> ConvCall:
    return ConvCall(*(row[f] for f in ConvCall.__dataclass_fields__))


def document(log: Log, settings: dict[str, Any], made_by: str, complete: bool) -> dict[str, Any]:
    """The table the log's measurements make."""
    header = log.of("header")[0]
    identity = header["identity"]
    hosts = log.of("host")
    if not hosts:
        raise UsageError("no measurement yet: the host's cost is measured first")
    ops = [row for probe in log.of("probe") for row in op_rows(probe)]
    convs, seen = [], set()
    for r in log.of("conv"):
        key = conv_key(r["dtype"], _call(r))
        if key not in seen:
            seen.add(key)
            keep = ("dtype", *ConvCall.__dataclass_fields__, "source", "channels_last", "nchw")
            convs.append({k: r[k] for k in keep})
    models = sorted({r["name"] for r in log.of("model")})
    return {
        "format": TABLE_FORMAT,
        "version": TABLE_VERSION,
        "name": table_name(MachineIdentity(**identity)),
        "identity": identity,
        "measured": header.get("measured", ""),
        "made_by": made_by,
        "seconds": round(sum(r.get("seconds", 0.0) for r in log.rows), 1),
        "complete": complete,
        "models": models,
        "settings": settings,
        "host": hosts[-1]["costs"] | {"basis": hosts[-1]["basis"]},
        "calibration": None,
        "ops": ops,
        "convolutions": convs,
    }
