"""Progress: a sweep's (a rich bar with ETA on a terminal, one line per finished model in a
log) and ``cl-audit table``'s (the budget as a bar, what is measured and the time left; a line
per part in a log)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from cl_audit.enums import Status
from cl_audit.render.wording import format_bytes
from cl_audit.report import ModelRow
from cl_audit.sources import ModelRef

__all__ = ["SweepProgress", "TableProgress"]


class _Live:
    """A rich bar shown while inside (None off a terminal: the subclass prints lines)."""

    _bar: Progress | None = None

    def __enter__(self) -> _Live:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.stop()


class SweepProgress(_Live):
    """Counts clean, offending and failed models as rows arrive, and those reused from the
    cache (counted among those already done)."""

    def __init__(
        self, console: Console, total: int, already_done: int = 0, cached: int = 0
    ) -> None:
        self._console = console
        self._total = total
        self._done = already_done
        self._cached = cached
        self._running: list[str] = []
        self.counts = {"offending": 0, "minor": 0, "clean": 0, "failed": 0, "skipped": 0}
        self._bar: Progress | None = None
        if console.is_terminal:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
            self._task = self._bar.add_task(self._describe(), total=total, completed=already_done)

    def _describe(self) -> str:
        c = self.counts
        running = ", ".join(self._running[:3]) + (" ..." if len(self._running) > 3 else "")
        cached = f" {self._cached} cached" if self._cached else ""
        return (
            f"[red]{c['offending']} offending[/red] {c['minor']} minor "
            f"[green]{c['clean']} clean[/green] [yellow]{c['failed']} failed[/yellow]{cached} | "
            f"{running}"
        )

    def start(self, ref: ModelRef) -> None:
        self._running.append(ref.name)
        if self._bar is not None:
            self._bar.update(self._task, description=self._describe())

    def finish(self, row: ModelRow) -> None:
        if row.name in self._running:
            self._running.remove(row.name)
        self._done += 1
        if row.status is Status.SKIPPED:
            self.counts["skipped"] += 1
        elif row.status.failed:
            self.counts["failed"] += 1
        else:
            self.counts[row.summary.verdict.value if row.summary else "clean"] += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=self._describe())
            return
        verdict = row.status.value
        if row.status is Status.OK and row.summary is not None:
            verdict = row.summary.verdict.value
            if row.cost is not None and row.cost.extra_bytes:
                verdict += f" ({format_bytes(row.cost.extra_bytes)}, {row.cost.share:.2%})"
        stage = row.stage.value if row.stage else "?"
        detail = f" ({stage}: {row.message})" if row.status.failed else ""
        self._console.print(
            f"[{self._done}/{self._total}] {row.key} {row.mode.value}: {verdict}{detail} "
            f"{row.seconds:.1f}s",
            highlight=False,
            soft_wrap=True,
        )


class TableProgress(_Live):
    """The budget as a bar (seconds spent of it), what is measured now and the time left; in
    a log, a line each time the part measured changes."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._part = ""
        if console.is_terminal:
            self._bar = Progress(
                TextColumn("{task.description}", table_column=None),
                BarColumn(),
                TextColumn("{task.fields[left]}"),
                console=console,
                transient=True,
            )
            self._task = self._bar.add_task("starting", total=1.0, left="")

    def __call__(self, part: str, what: str, spent_s: float, budget_s: float) -> None:
        left = max(budget_s - spent_s, 0.0)
        if self._bar is not None:
            self._bar.update(
                self._task,
                description=f"{part}: {what}",
                completed=min(spent_s / budget_s, 1.0),
                left=f"{left / 60:.1f} min left",
            )
            return
        if part != self._part:
            self._part = part
            self._console.print(
                f"[{spent_s:4.0f} s, {left / 60:.1f} min left] {part}: {what}",
                highlight=False,
                soft_wrap=True,
            )
