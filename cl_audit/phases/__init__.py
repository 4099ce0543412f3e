"""The one path that audits one model (``audit_module``) and the phases it walks, in order
(``PHASES``): the audited run in channels_last (``audited``), the same forward or step in NCHW
with the cost and the verdict (``compare``), the cost sites' remedies tried in what-if runs
(``verify``), with ``compile`` Inductor's layout decisions (``compile``), and whether
channels_last pays: the step's time in both layouts, measured or predicted (``speed``). Each
takes the ``Subject`` and the ``Sections`` the phases before it returned, and returns the
section it is listed with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cl_audit.phases import audited, compare, compile, speed, verify
from cl_audit.phases.subject import Sections, Subject

__all__ = ["PHASES", "Sections", "Subject"]

# (the section it returns, the phase), in order
PHASES: tuple[tuple[str, Callable[[Subject, Sections], Any]], ...] = (
    ("audited", audited.run_audited),
    ("comparison", compare.compare),
    ("comparison", verify.verify),
    ("compiled", compile.compile_phase),
    ("speed", speed.speed_phase),
)
