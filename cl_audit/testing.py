"""Assertions for test suites: pin "this model keeps channels_last" and fail on anything new.

    from cl_audit.testing import assert_keeps_channels_last

    def test_unet_keeps_channels_last():
        assert_keeps_channels_last(build_unet(), torch.randn(2, 3, 64, 64))

``allow`` takes known offences, so a suite can pin today's state: an op pattern
(``"aten.clone"``, ``"torch.flatten"``, a glob such as ``"aten.upsample_*"``) or an
``(op pattern, call-site pattern)`` pair (``("aten.clone", "*/decoder.py:*")``). An op pattern
matches the aten name or the Python-level name of an offender.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

import torch
from rich.console import Console
from torch import nn

from cl_audit.report import Finding, ModelReport
from cl_audit.run import audit_model
from cl_audit.settings import Amp, Engine

__all__ = ["Allowed", "allowed", "assert_keeps_channels_last", "offender_table", "unexpected"]

Allowed = str | tuple[str, str]


def allowed(finding: Finding, allow: Iterable[Allowed]) -> bool:
    """Whether ``finding`` matches one of the ``allow`` patterns."""
    names = [n for n in (finding.aten_op, finding.python_op) if n]
    for entry in allow:
        op, site = (entry, "*") if isinstance(entry, str) else entry
        if any(fnmatch.fnmatchcase(n, op) for n in names) and fnmatch.fnmatchcase(
            finding.call_site or "", site
        ):
            return True
    return False


def unexpected(report: ModelReport, allow: Iterable[Allowed] = ()) -> tuple[Finding, ...]:
    """The report's offenders that no ``allow`` pattern matches."""
    patterns = list(allow)
    return tuple(f for f in report.offenders if not allowed(f, patterns))


def offender_table(findings: tuple[Finding, ...], width: int = 100) -> str:
    """The terminal's offender table (op, call site, module, strides) as plain text."""
    from cl_audit.render.terminal import offenders_table

    console = Console(width=width, no_color=True, color_system=None, record=True)
    with console.capture() as capture:
        console.print(offenders_table(findings))
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
) -> ModelReport:
    """Audit ``model`` (converted to channels_last in place unless ``convert`` says otherwise;
    one inference forward, or with ``train`` one training step) and raise ``AssertionError``
    listing every offender that ``allow`` does not match. Returns the report."""
    report = audit_model(
        model, example_input, engine=engine, name=name, convert=convert, train=train, amp=amp
    )
    found = unexpected(report, allow)
    if found:
        label = name or type(model).__name__
        phase = "a training step" if train else "the forward"
        raise AssertionError(
            f"{label} loses channels_last in {phase}: {len(found)} offending operation"
            f"{'s' * (len(found) > 1)} not allowed\n{offender_table(found)}"
        )
    return report
