"""How long a step takes when a host issues operations to a device: the queue model.

The host spends its own time on each operation (Python, dispatch, autograd, the launch), then
enqueues its kernel; the device runs each kernel once it is enqueued and the kernel before it
is done; a synchronising operation (``.item()``, a copy to the host, a data-dependent output
size) makes the host wait until the device is idle; the step ends when both are done. On a
synchronous device (the CPU, where the host runs the kernels itself) every operation waits
for its kernel. This is how Daydream (USENIX ATC 2020) replays a step from a trace; nothing in
it is fitted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Issued", "Timeline", "replay"]


@dataclass(frozen=True)
class Issued:
    """One operation as the queue sees it: the host's microseconds before it is enqueued, its
    kernels' microseconds on the device, and whether the host waits for the device after it."""

    host_us: float
    device_us: float
    sync: bool = False


@dataclass(frozen=True)
class Timeline:
    """A replayed step: when it ended, and the host's and the device's busy time (each in
    microseconds); ``host_waits_us`` is the time the host stood waiting at synchronisations."""

    end_us: float
    host_us: float
    device_us: float
    host_waits_us: float


def replay(
    operations: Iterable[Issued], asynchronous: bool, ends: list[float] | None = None
) -> Timeline:
    """The step the ``operations`` make, in order (see the module docstring); with
    ``asynchronous`` False every operation synchronises. ``ends`` gets the step's end so far
    after each operation: the differences of its neighbours are what each operation adds to
    the step, and add up to it."""
    host = device = busy_host = busy_device = waited = 0.0
    for op in operations:
        host += op.host_us
        busy_host += op.host_us
        if op.device_us > 0:
            device = max(host, device) + op.device_us
            busy_device += op.device_us
        if (op.sync or not asynchronous) and device > host:
            waited += device - host
            host = device
        if ends is not None:
            ends.append(max(host, device))
    return Timeline(max(host, device), busy_host, busy_device, waited)
