"""``cl-audit table`` on the terminal: the measuring's progress (a bar with what is measured
and the budget's time left, or a line per part in a log), and the known tables (``--list``)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.text import Text

from cl_audit.predict.table_store import Store, choose, this_machine
from cl_audit.report.machine import TableUse

__all__ = ["TableProgress", "tables_text"]


class TableProgress:
    """The budget as a bar (seconds spent of it), what is measured now and the time left; in
    a log, a line each time the part measured changes."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._part = ""
        self._bar: Progress | None = None
        if console.is_terminal:
            self._bar = Progress(
                TextColumn("{task.description}", table_column=None),
                BarColumn(),
                TextColumn("{task.fields[left]}"),
                console=console,
                transient=True,
            )
            self._task = self._bar.add_task("starting", total=1.0, left="")

    def __enter__(self) -> TableProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.stop()

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


def tables_text(known: Store) -> Text:
    """Every table known here, a few lines each: ``*`` marks the one an audit here picks for
    its device type, with how it matches this machine."""
    picked: dict[tuple[str, str], tuple[TableUse, list[str]]] = {}  # (name, source) ->
    for device in sorted({t.device for t in known.tables}):
        for dtype in ("float32", "float16", "bfloat16"):
            choice = choose(device, dtype, here=this_machine(device))
            if choice is not None and dtype in choice.table.dtypes():
                key = (choice.table.name, choice.table.source)
                picked.setdefault(key, (choice.use, []))[1].append(dtype)
    out = Text()
    for t in known.tables:
        found = picked.get((t.name, t.source))
        out.append(f"{'*' if found else ' '} {t.name}\n", style="bold" if found else "")
        if found is not None:
            use, dtypes = found
            out.append(f"    picked here for {', '.join(dtypes)}: {use.label}\n")
        out.append(f"    {t.identity.described()}\n")
        held = "; ".join(f"{d}: {c} convolutions, {o} samples" for d, (c, o) in t.counts().items())
        out.append(f"    {held}\n")
        made = f"measured {t.measured[:10]}" if t.measured else "measured ?"
        models = f"; for {', '.join(t.models)}" if t.models else ""
        out.append(f"    {made}{models}; {t.source}\n", style="dim")
    for path, why in known.unreadable:
        out.append(f"! {path}: unreadable ({why})\n", style="red")
    return out
