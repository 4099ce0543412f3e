"""``cl-audit table --list`` on the terminal: the tables known here (the measuring's progress is
``render.progress.TableProgress``)."""

from __future__ import annotations

from rich.text import Text

from cl_audit.predict.table_store import Store, choose, this_machine
from cl_audit.report.machine import TableUse

__all__ = ["tables_text"]


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
