"""Rendering of reports: terminal (rich), HTML, JUnit, sweep progress."""

from __future__ import annotations

from html import escape

__all__ = ["format_bytes", "html_text"]


def format_bytes(n: int) -> str:
    if n < 0:
        return "-" + format_bytes(-n)
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def html_text(value: object) -> str:
    """A value as escaped HTML text (None: empty), quotes too: safe in attributes."""
    return escape("" if value is None else str(value), quote=True)
