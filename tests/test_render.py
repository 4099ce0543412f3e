"""Terminal rendering of literal reports against golden text at a fixed width.

After a deliberate change of the output: ``python -m pytest tests/test_render.py --update-golden``
and review the diff of tests/golden/.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from literal_reports import finding, model_report, row, sweep
from rich.console import Console

from cl_audit.render.terminal import render_comparison, render_report, render_sweep
from cl_audit.report import Status
from cl_audit.sweep.compare import compare

GOLDEN = Path(__file__).with_name("golden")


def rendered(draw) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=100, color_system=None, force_terminal=False)
    draw(console)
    return buffer.getvalue()


def check(name: str, text: str, request: pytest.FixtureRequest) -> None:
    path = GOLDEN / name
    if request.config.getoption("--update-golden"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; --update-golden if that is intended"


def test_single_report(request):
    check("single.txt", rendered(lambda c: render_report(model_report(), c)), request)


def test_single_report_listing_parameter_and_neutral_conversions(request):
    text = rendered(lambda c: render_report(model_report(), c, show_all=True))
    assert "Format-neutral losses" in text and "parameter-derived" in text
    check("single-all.txt", text, request)


def test_sweep_and_comparison(request):
    old = sweep(row("a", (finding(),)), row("b"))
    new = sweep(
        row("a", (finding(),)),
        row("b", (finding("torch.flatten", "aten.clone", round_trips=0),)),
        row("c", status=Status.ERROR, message="RuntimeError: boom"),
    )

    def draw(console: Console) -> None:
        render_sweep(new, console)
        render_comparison(compare(old, new), console)

    check("sweep.txt", rendered(draw), request)
