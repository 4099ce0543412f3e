"""Whose speed table a prediction used: the machine a table describes (``MachineIdentity``),
and how it matched the machine the audit ran on (``TableUse``, the report's ``speed.table``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from cl_audit.enums import TableMatch
from cl_audit.report.codec import JsonForm

__all__ = ["MachineIdentity", "TableUse", "release"]


def release(version: str) -> tuple[int, ...]:
    """A torch release as numbers, for ordering (``2.9.1`` before ``2.14.1``; a local tag such
    as ``+cu130`` and a pre-release suffix such as ``a0`` end it)."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits[0]))
        if digits[0] != part:
            break
    return tuple(numbers)


@dataclass(frozen=True)
class MachineIdentity:
    """The machine a table was measured on: the device type and model (the CPU's name, or the
    GPU's), the CPU's logical cores and the threads torch computed with (a GPU's host: its CPU
    and cores), a GPU's memory and multiprocessors, the torch release and the library that ran
    the convolutions (oneDNN's, cuDNN's version)."""

    device: str
    model: str
    cores: int | None = None
    threads: int | None = None
    memory_gib: float | None = None
    multiprocessors: int | None = None
    host: str | None = None  # a GPU's host CPU, as ``model`` names a CPU
    torch: str = ""
    backend: str = ""

    @property
    def hardware(self) -> tuple[object, ...]:
        """What the machine is, whatever software it runs: this device model, and the CPU
        configuration that feeds it (cores, threads; a GPU's host)."""
        return (*self.device_model, self.threads, self.host)

    @property
    def device_model(self) -> tuple[object, ...]:
        """The device model alone: a CPU's name and cores; a GPU's name, memory and
        multiprocessors."""
        if self.device == "cpu":
            return (self.device, self.model, self.cores)
        return (self.device, self.model, self.memory_gib, self.multiprocessors)

    def described(self) -> str:
        """``AMD EPYC, 2 cores, 2 threads, torch 2.14.1, onednn-3.12.0``."""
        if self.device == "cpu":
            parts = [self.model, f"{self.cores} cores", f"{self.threads} threads"]
        else:
            parts = [self.model]
            if self.memory_gib is not None:
                parts.append(f"{self.memory_gib:g} GiB")
            if self.multiprocessors is not None:
                parts.append(f"{self.multiprocessors} multiprocessors")
            if self.host:
                parts.append(f"host {self.host}")
        return ", ".join([*parts, f"torch {self.torch}", self.backend])

    def short(self) -> str:
        """``AMD EPYC, 2 threads, torch 2.14.1`` or ``NVIDIA H200, torch 2.11.0``: the
        machine as a headline names it."""
        threads = f", {self.threads} threads" if self.device == "cpu" else ""
        return f"{self.model}{threads}, torch {self.torch}"

    def differences(self, other: MachineIdentity) -> tuple[str, ...]:
        """What ``other`` (this machine) has where this table's machine differs: ``threads 1
        here``, ``torch 2.15.0 here``."""
        found = []
        if other.device_model != self.device_model:
            found.append(f"{other.model} here")
        if other.threads != self.threads and self.device == "cpu":
            found.append(f"threads {other.threads} here")
        if other.host != self.host and self.device != "cpu":
            found.append(f"host {other.host} here")
        if other.torch != self.torch:
            found.append(f"torch {other.torch} here")
        if other.backend != self.backend:
            found.append(f"{other.backend} here")
        return tuple(found)


@dataclass(frozen=True)
class TableUse:
    """The operation time table a prediction used: its name, the machine it describes, how
    that machine matched this one (``match``; None in reports older than version 14, which
    named the table alone), whether the user chose it (``--table``), where it came from
    (``shipped`` with cl-audit, or the file's path), what differs here, and this machine as
    the table store saw it (None: no device of the type here)."""

    name: str
    identity: MachineIdentity | None = None
    match: TableMatch | None = None
    chosen: bool = False
    source: str | None = None
    differences: tuple[str, ...] = ()
    this_machine: MachineIdentity | None = None

    json_form: ClassVar[JsonForm] = JsonForm(derived=("label",))

    @property
    def label(self) -> str:
        """How a headline names it: ``this machine's table`` or ``another machine's table:
        NVIDIA H200, torch 2.11.0; this machine: no CUDA device``."""
        if self.identity is None or self.match is None:
            return f"table {self.name}"
        chosen = ", chosen" if self.chosen else ""
        if self.match is TableMatch.THIS_MACHINE:
            kind = ", shipped for a machine like it" if self.source == "shipped" else ""
            return f"this machine's table{kind}{chosen}"
        if self.this_machine is None:
            here = f"this machine: no {self.identity.device.upper()} device"
        else:
            here = "; ".join(self.differences) or "this machine differs"
        return f"another machine's table{chosen}: {self.identity.short()}; {here}"
