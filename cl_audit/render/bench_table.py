"""Rich rendering of a bench report: one row per configuration, the verdict, and the time of
the flagged operations."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cl_audit.report.bench_report import BenchReport

__all__ = ["render_bench"]


def render_bench(report: BenchReport, console: Console, top: int = 10) -> None:
    env = report.environment
    amp = f", autocast {env.autocast}" if env.autocast else ""
    step = "training step" if env.train else "inference forward"
    rounds = len(report.timings[0].rounds_ms) if report.timings else 0
    head = (
        f"{report.model}  input {'x'.join(map(str, report.input_shape))}  {env.device} "
        f"{env.dtype}{amp}  {step}\n{report.threads} threads; {_warm_up(report)}, "
        f"then {rounds} alternating rounds of {report.steps_per_round} steps (median, spread)"
    )
    console.print(Panel(Text(head), title="cl-audit bench", expand=False))
    table = Table(expand=False)
    table.add_column("configuration", style="bold", no_wrap=True)
    table.add_column("ms/step", justify="right")
    table.add_column("spread", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("vs nchw", justify="right")
    compiled = any(t.compiled for t in report.timings)
    if compiled:
        table.add_column("compile (apart)", justify="right")
    for timing in report.timings:
        speedup = report.speedup(timing)
        cells = [
            timing.name,
            f"{timing.median_ms:.2f}",
            f"{timing.spread:.0%}",
            f"{report.throughput(timing):.1f}",
            "" if speedup is None else f"{speedup:.2f}x",
        ]
        if compiled:
            seconds = timing.compile_seconds
            cells.append("" if seconds is None else f"{seconds:.1f} s")
        table.add_row(*cells)
    console.print(table)
    console.print(Text(report.verdict_text, style="bold"))
    a = report.attribution
    if a is None:
        return
    console.print(
        f"{a.configuration}: losses {a.losses_ms:.2f} ms = {a.share:.1%} of a {a.step_ms:.2f} ms "
        f"step; the operations that convert back, whole, {a.regains_ms:.2f} ms "
        f"({a.clock} profiler; {a.offenders} offenders)",
        highlight=False,
    )
    if not a.findings:
        return
    table = Table(title="Time of the flagged operations (one profiled step)", expand=True)
    table.add_column("op", style="bold", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("call site", overflow="fold", ratio=1)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("of step", justify="right", no_wrap=True)
    for f in a.findings[:top]:
        kind = f.kind.value + (" (offender)" if f.offender else "")
        share = f.ms / a.step_ms if a.step_ms > 0 else 0.0
        table.add_row(f.op, kind, f.call_site or "?", str(f.count), f"{f.ms:.2f}", f"{share:.1%}")
    console.print(table)


def _warm_up(report: BenchReport) -> str:
    """The warm-up each configuration got: until its step times settled (version 2)."""
    steps = [t.warmup_steps for t in report.timings if t.warmup_steps is not None]
    if not steps:
        return f"{report.warmup} warm-up steps"
    ran = "/".join(map(str, steps))
    return f"warm-up until settled, at least {report.warmup} steps ({ran})"
