"""Assertions for test suites: pin "this model keeps channels_last" and fail on anything new.

    from cl_audit.testing import assert_keeps_channels_last

    def test_unet_keeps_channels_last():
        assert_keeps_channels_last(build_unet(), torch.randn(2, 3, 64, 64))

The assertion uses the audit's gate: it fails when the channels_last-only cost reaches 1% of
the bytes written and 1 MiB (``fail_share``, ``fail_bytes``) at batch 32 (``gate_batch``),
projected from the example's batch: bytes paid once per forward (parameter copies) as they
are, the rest scaled. So a test-sized input is judged as training batches are:

    # channels_last adds 312 KiB at batch 2 (3.24% of the bytes written), 4.9 MiB at batch 32
    assert_keeps_channels_last(torchvision.models.shufflenet_v2_x0_5(),
                               torch.randn(2, 3, 128, 128))  # AssertionError: 5 sites

``strict=True`` fails on any such cost and on any offender. ``allow`` takes known offences,
so a suite can pin today's state: an op pattern (``"aten.clone"``, ``"torch.flatten"``, a
glob such as ``"aten.upsample_*"``) or an ``(op pattern, call-site pattern)`` pair
(``("aten.clone", "*/decoder.py:*")``). An op pattern matches the aten name or the
Python-level name of an offender or a cost site, or of the operation that made a cost site's
NCHW data (its fix site or root cause): ``allow=["torch.cat"]`` allows the convolution that
converts the cat's NCHW output back.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

import torch
from rich.console import Console
from torch import nn

from cl_audit.enums import Amp, Engine, Verdict
from cl_audit.phases.audit_module import audit_model
from cl_audit.render.wording import plural
from cl_audit.report import CostSite, Finding, ModelReport
from cl_audit.report.verdict import GATE_BATCH

__all__ = ["Allowed", "allowed", "assert_keeps_channels_last", "offender_table", "unexpected"]

Allowed = str | tuple[str, str]


def allowed(finding: Finding | CostSite, allow: Iterable[Allowed]) -> bool:
    """Whether ``finding`` (an offender or a cost site) matches one of the ``allow`` patterns;
    a cost site also by the operation that made the NCHW data it converts (its fix site or
    root cause): allowing the operation that loses the format allows the costs it causes."""
    python = finding.python_op if isinstance(finding, Finding) else finding.op
    places = [((finding.aten_op, python), finding.call_site)]
    if isinstance(finding, CostSite):
        places += [((p.aten_op, p.python_op), p.call_site) for p in finding.upstream]
    entries = [(e, "*") if isinstance(e, str) else e for e in allow]
    return any(
        any(n and fnmatch.fnmatchcase(n, op) for n in names)
        and fnmatch.fnmatchcase(call_site or "", site)
        for names, call_site in places
        for op, site in entries
    )


def unexpected(
    report: ModelReport, allow: Iterable[Allowed] = (), strict: bool = False
) -> tuple[Finding | CostSite, ...]:
    """What fails an assertion. A report weighed by a cost: its sites with channels_last-only
    bytes that no ``allow`` pattern matches, when together they reach the report's gate (with
    ``strict``, whatever their bytes, and the offenders not allowed too). A report with no cost
    (the patch engine): its offenders that no pattern matches."""
    patterns = list(allow)
    offenders = tuple(f for f in report.offenders if not allowed(f, patterns))
    cost = report.cost
    if cost is None:
        return offenders
    sites = tuple(s for s in cost.sites if s.extra and not allowed(s, patterns))
    if strict:
        return (*sites, *offenders)
    return sites if cost.judged(sites) is Verdict.OFFENDING else ()


def offender_table(
    findings: tuple[Finding | CostSite, ...], width: int = 100, train: bool = False
) -> str:
    """The terminal's tables of these cost sites (of a training step's audit with ``train``)
    and offenders (op, call site, module, strides or bytes) as plain text."""
    from cl_audit.render.terminal import cost_table, offenders_table

    sites = tuple(f for f in findings if isinstance(f, CostSite))
    offenders = tuple(f for f in findings if isinstance(f, Finding))
    console = Console(width=width, no_color=True, color_system=None, record=True)
    with console.capture() as capture:
        if sites:
            console.print(cost_table(sites, train=train))
        if offenders:
            console.print(offenders_table(offenders))
    return capture.get()


def assert_keeps_channels_last(
    model: nn.Module,
    example_input: torch.Tensor | tuple[Any, ...],
    *,
    train: bool = False,
    amp: Amp | str | None = None,
    allow: Iterable[Allowed] = (),
    convert: bool | str = True,
    engine: Engine | str = Engine.DISPATCH,
    name: str | None = None,
    strict: bool = False,
    fail_share: float = 1.0,
    fail_bytes: int = 1 << 20,
    gate_batch: int | None = GATE_BATCH,
) -> ModelReport:
    """Audit ``model`` (converted to channels_last in place unless ``convert`` says otherwise;
    one inference forward, or with ``train`` one training step, each compared with NCHW) and
    raise ``AssertionError`` when the channels_last-only cost that ``allow`` does not match
    reaches the gate (``fail_share`` percent of the bytes written and ``fail_bytes``, projected
    to batch ``gate_batch``: see ``audit_model``), listing those sites; ``strict`` fails on any
    such cost and on any offender. Returns the report."""
    report = audit_model(
        model,
        example_input,
        engine=engine,
        name=name,
        convert=convert,
        train=train,
        amp=amp,
        fail_share=fail_share,
        fail_bytes=fail_bytes,
        gate_batch=gate_batch,
        verify=False,  # a gate: remedies stay leads (cl-audit MODEL proves them)
    )
    found = unexpected(report, allow, strict)
    if found:
        label = name or type(model).__name__
        phase = "a training step" if train else "the forward"
        raise AssertionError(
            f"{label} loses channels_last in {phase}: {plural(len(found), 'site')} "
            f"not allowed\n{offender_table(found, train=train)}"
        )
    return report
