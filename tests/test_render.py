"""Terminal rendering of literal reports against golden text at a fixed width.

After a deliberate change of the output: ``python -m pytest tests/test_render.py --update-golden``
and review the diff of tests/golden/.
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest
from literal_reports import (
    empty_sweep,
    finding,
    minor_sweep,
    model_report,
    row,
    sweep,
    training_sweep,
)
from rich.console import Console

from cl_audit.render.terminal import render_report
from cl_audit.render.terminal_sweep import render_comparison, render_sweep
from cl_audit.report import Status, compare

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


def test_one_row_per_op_and_call_site_with_modules_folded_at_80_columns(request):
    from dataclasses import replace

    report = model_report()
    repeated = tuple(
        finding("Tensor.contiguous", "aten.clone", f"stages.{i}.blocks.0.attn", "maxxvit.py:233")
        for i in range(22)
    )
    report = replace(report, offenders=repeated + report.offenders)
    buffer = io.StringIO()
    render_report(report, Console(file=buffer, width=80, color_system=None))
    text = buffer.getvalue()
    assert text.count("maxxvit.py:233") == 1
    assert "21 more modules" in text
    for word in ("Tensor.contiguous", "torch.flatten", "aten.clone", "maxxvit.py:233"):
        assert word in text  # never broken mid-word at 80 columns
    assert max(len(line) for line in text.splitlines()) <= 80
    check("single-80.txt", text, request)


@pytest.mark.parametrize("width", [60, 80, 100])
def test_a_long_call_site_never_breaks_inside_its_file_and_line(width):
    site = "ultralytics/nn/modules/a/rather/deeply/nested/package/path/block.py:1331"
    report = model_report()
    report = replace(report, offenders=(replace(report.offenders[0], call_site=site),))
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False)
    render_report(report, console)
    lines = buffer.getvalue().splitlines()
    shown = [line for line in lines if "block.py:1331" in line]
    assert shown, "the file and line number are on one line"
    if len(site) + 30 > width:  # the cell is narrower than the path: shortened from the left
        assert any("…" in line for line in shown)
    assert not any(line.rstrip(" │").endswith("block.py:13") for line in lines)


@pytest.mark.parametrize("width", [60, 80, 100])
def test_a_deep_module_path_breaks_after_a_dot_never_inside_a_name(width):
    """Each of a deep path's names on one line; the control: a name longer than the cell,
    which has no dot to break at, is still folded (nothing is cut off)."""
    names = ["stages", "blocks", "encoder_layer_eleven", "self_attention_block", "out_projection"]
    path = ".".join(names * 2)
    report = model_report()
    report = replace(report, offenders=(replace(report.offenders[0], module_path=path),))
    buffer = io.StringIO()
    render_report(report, Console(file=buffer, width=width, color_system=None))
    cells = [line.split("│")[2].strip() for line in buffer.getvalue().splitlines()
             if line.count("│") == 4]  # fmt: skip
    whole = "".join(cells)
    assert path in whole
    for name in names:
        assert sum(name in cell for cell in cells) == 2, name
    long_name = "x" * (width + 5)
    report = replace(report, offenders=(replace(report.offenders[0], module_path=long_name),))
    buffer = io.StringIO()
    render_report(report, Console(file=buffer, width=width, color_system=None))
    assert long_name in "".join(line.split("│")[2].strip() for line in
                                buffer.getvalue().splitlines() if line.count("│") == 4)  # fmt: skip


def test_a_training_sweep_whose_offenders_have_only_cost_sites_names_them():
    """Offending through copies inside kernels and of parameters, with no offender finding:
    the table gives each operation's cost and the models it was found in."""
    text = rendered(lambda c: render_sweep(training_sweep(), c))
    assert "3 models: 2 offending, 1 minor, 0 clean" in text
    line = next(line for line in text.splitlines() if "aten.convolution_backward" in line)
    assert "3.0 MiB" in line and "resnet_kernel" in line and "2 / 0" in line
    assert "nf_parameter" in text  # the parameter copy's model, as its example


@pytest.mark.parametrize("shape", [minor_sweep, empty_sweep])
def test_sweeps_of_only_minor_rows_or_none_render(shape):
    report = shape()
    text = rendered(lambda c: render_sweep(report, c))
    assert f"{report.summary.models} models: 0 offending, {report.summary.minor} minor" in text


def test_one_change_tried_is_singular():
    """Issue #67: "1 changes tried". A real audit's verified remedy, its evidence cut to the
    one change that failed; the control: all its failed changes, plural."""
    import torch
    import toy_models

    from cl_audit import audit_model
    from cl_audit.enums import RemedyStatus

    model, size = toy_models.channel_shuffle()
    report = audit_model(model, torch.randn(2, *size), fail_share=0, fail_bytes=0)
    site = report.cost.sites[0]
    failed = tuple(t for t in site.remedy.evidence if not t.holds)
    assert len(failed) >= 2

    def shown(evidence) -> str:
        remedy = replace(site.remedy, status=RemedyStatus.REFUTED, evidence=evidence)
        cost = replace(report.cost, sites=(replace(site, remedy=remedy),))
        return rendered(lambda c: render_report(replace(report, cost=cost), c))

    assert "1 change tried, none held" in shown(failed[:1])
    assert f"{len(failed)} changes tried, none held" in shown(failed)
