"""The terminal report of a sweep, and of a comparison with a baseline."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cl_audit.enums import SpeedVerdict
from cl_audit.render.wording import (
    format_bytes,
    operator_examples,
)
from cl_audit.report import (
    Comparison,
    ModelRow,
    SweepReport,
)

__all__ = ["render_comparison", "render_sweep"]


def render_sweep(report: SweepReport, console: Console, top: int = 10) -> None:
    """The sweep summary, the worst operators, and the models that failed."""
    s = report.summary
    env = report.environment
    text = Text(
        f"{s.models} models: {s.offending} offending, {s.minor} minor, {s.clean} clean, "
        f"{s.failed} failed, "
        f"{s.skipped} skipped  ({env.device} {env.dtype}, {env.mode.value} mode, "
        f"engine {env.engine.value})"
    )
    if s.cached:
        text.append(f"\n{s.cached} of them reused from the cache, {s.models - s.cached} audited")
    speeds = Counter(r.speed.verdict.value for r in report.models if r.speed is not None)
    if speeds:
        text.append(
            "\nchannels_last speed: "
            + ", ".join(f"{n} {verdict}" for verdict, n in speeds.most_common())
        )
        slowest = sorted(
            (r for r in report.models if r.speed is not None and r.speed.speedup),
            key=lambda r: r.speed.speedup,  # type: ignore[union-attr]
        )[:3]
        if slowest:
            text.append(
                "; slowest: " + ", ".join(f"{r.name} {r.speed.speedup:.2f}x" for r in slowest)  # type: ignore[union-attr]
            )
    compiled = [r for r in report.models if r.speed is not None and r.speed.compiled is not None]
    if compiled:
        counts = Counter(r.speed.compiled.verdict.value for r in compiled)  # type: ignore[union-attr]
        text.append("\ncompiled speed: " + ", ".join(f"{n} {v}" for v, n in counts.most_common()))
        differ = [side for side in map(_sides, compiled) if side is not None]
        if differ:
            text.append("; eager and compiled disagree: " + ", ".join(differ))
    console.print(Panel(text, title="cl-audit sweep", expand=False))
    costly = [cov for cov in report.operators if cov.extra_bytes or cov.models]
    if costly:
        table = Table(
            title=f"Operations by channels_last-only cost (of {len(costly)})", expand=True
        )
        table.add_column("op", style="bold", no_wrap=True)
        table.add_column("extra", justify="right", no_wrap=True)
        table.add_column("models\ncost/offender", justify="right", no_wrap=True)
        table.add_column("offender\nevents", justify="right", no_wrap=True)
        table.add_column("for example", overflow="fold")
        examples = operator_examples(report)
        for cov in costly[:top]:
            more = len(cov.python_ops) - 2
            name = "\n".join((cov.op, *cov.python_ops[:2], *[f"+{more} more"] * (more > 0)))
            models = list(dict.fromkeys(e.split(":", 1)[0] for e in examples.get(cov.op, ())))
            table.add_row(
                name,
                format_bytes(cov.extra_bytes),
                f"{cov.cost_models} / {cov.models}",
                str(cov.events),
                "\n".join(models[:3]),
            )
        console.print(table)
    parameter = sum(1 for r in report.models if r.parameter_conversions)
    neutral = sum(1 for r in report.models if r.format_neutral)
    console.print(
        f"{parameter} models convert parameter-derived data, {neutral} have format-neutral "
        "losses (not offenders; see the JSON report)"
    )
    failed = [r for r in report.models if r.status.failed]
    for row in failed[:top]:
        console.print(
            f"[red]{row.status.value}[/red] {row.key} "
            f"({row.stage.value if row.stage else '?'}): {row.message}",
            highlight=False,
        )
    if len(failed) > top:
        console.print(f"... and {len(failed) - top} more failed models (see the JSON report)")


def render_comparison(comparison: Comparison, console: Console) -> None:
    for label, items, style in (
        ("new offence", [f"{k} {op}" for k, op in comparison.new_offences], "red"),
        ("new failure", list(comparison.new_failures), "red"),
        ("cost grew past the gate", list(comparison.grown_costs), "red"),
        ("fixed", [f"{k} {op}" for k, op in comparison.fixed_offences], "green"),
        ("no longer failing", list(comparison.fixed_failures), "green"),
    ):
        for item in items:
            console.print(f"[{style}]{label}:[/{style}] {item}", highlight=False)
    if not comparison.regressed:
        console.print("[green]no new offences or failures against the baseline[/green]")


def _sides(row: ModelRow) -> str | None:
    """``convnext_tiny 0.97x/1.05x`` where the eager and the compiled verdicts are faster and
    slower, one each; else None."""
    speed = row.speed
    compiled = None if speed is None else speed.compiled
    sides = {SpeedVerdict.FASTER, SpeedVerdict.SLOWER}
    if speed is None or compiled is None or {speed.verdict, compiled.verdict} != sides:
        return None
    return f"{row.name} {speed.speedup:.2f}x/{compiled.speedup:.2f}x"
