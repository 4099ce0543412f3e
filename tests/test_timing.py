"""The copies inside kernels, read from the profiler's raw events: the same calls, operations,
elements and element sizes as torch's own parsed event tree gives."""

from __future__ import annotations

import math

import torch
from torch.autograd.profiler import record_function

import cl_audit.execution.timing as timing
from cl_audit.compat.profiler_events import _parsed_ops
from cl_audit.execution.timing import Profiler, copies_by_call
from cl_audit.intercept.dispatch import CALL_LABEL


def _profiled_step() -> Profiler:
    """Labelled calls as the dispatch engine opens them: a convolution of an NCHW input with a
    channels_last weight copies inside the kernel; so do a contiguous() and a half to float."""
    torch.manual_seed(0)
    weight = torch.randn(8, 3, 3, 3).to(memory_format=torch.channels_last).requires_grad_()
    x = torch.randn(2, 3, 16, 16)
    with Profiler(torch.device("cpu"), shapes=True) as profiler:
        with record_function(f"{CALL_LABEL}1"):
            y = torch.nn.functional.conv2d(x, weight)
        with record_function(f"{CALL_LABEL}2"):
            z = y.contiguous(memory_format=torch.contiguous_format)
        with record_function(f"{CALL_LABEL}3"):
            h = z.half().float()
        with record_function(f"{CALL_LABEL}4"):
            h.sum().backward()
        torch.randn(4).clone().copy_(torch.randn(4))  # outside any labelled call: not counted
    return profiler


def _from_parsed_tree(profiler: Profiler) -> tuple[dict, dict]:
    """What the parsed events' own tree (``cpu_parent``) says."""
    copied: dict[int, list[tuple[int, int | None]]] = {}
    names: dict[int, str] = {}
    for event in profiler.events():
        if event.name != "aten::copy_" or not event.input_shapes:
            continue
        node, child = event.cpu_parent, event
        while node is not None and not node.name.startswith(CALL_LABEL):
            node, child = node.cpu_parent, node
        if node is None:
            continue
        call = int(node.name[len(CALL_LABEL) :])
        dtypes = getattr(event, "input_dtypes", None)
        size = timing._ELEMENT_SIZES.get(dtypes[0], 4) if dtypes else None
        copied.setdefault(call, []).append((math.prod(event.input_shapes[0]), size))
        names[call] = child.name.replace("::", ".")
    return copied, names


def test_raw_events_give_the_copies_the_parsed_event_tree_gives():
    profiler = _profiled_step()
    copied, names = copies_by_call(profiler)
    assert {2, 3} <= set(copied)  # the contiguous() and the dtype round trip copy
    assert names[2] == "aten.contiguous" and (2 * 8 * 14 * 14, 4) in copied[2]
    expected_copied, expected_names = _from_parsed_tree(profiler)
    assert names == expected_names
    if all(size is not None for copies in expected_copied.values() for _, size in copies):
        assert copied == expected_copied
    else:  # torch 2.4's parsed events carry no dtype; the raw ones do
        assert {c: [n for n, _ in v] for c, v in copied.items()} == {
            c: [n for n, _ in v] for c, v in expected_copied.items()
        }


def test_the_parsed_events_fallback_gives_the_same_copies(monkeypatch):
    profiler = _profiled_step()
    raw = copies_by_call(profiler)
    profiler.ops = _parsed_ops(profiler._profile)
    fallback = copies_by_call(profiler)
    assert fallback[1] == raw[1]
    assert {c: [n for n, _ in v] for c, v in fallback[0].items()} == {
        c: [n for n, _ in v] for c, v in raw[0].items()
    }
