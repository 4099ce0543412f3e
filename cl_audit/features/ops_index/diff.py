"""Two indexes compared, operator by operator (``cl-audit ops diff``)."""

from __future__ import annotations

from dataclasses import dataclass

from cl_audit.enums import OpBehaviour
from cl_audit.report.ops_report import WORST, OpsIndex

__all__ = ["OpChange", "diff"]


@dataclass(frozen=True)
class OpChange:
    """An operator whose behaviour (or, with ``gradient``, its input gradient's; with
    ``case``, that case's: ``dim=C``, ``channels_last + NCHW``) differs between two indexes
    (None: absent from that index, its samples could not be made there, or for a gradient,
    none judged)."""

    op: str
    old: OpBehaviour | None
    new: OpBehaviour | None
    gradient: bool = False
    case: str | None = None

    @property
    def better(self) -> bool | None:
        """True when the new behaviour is less bad (``OpBehaviour``'s order), False when worse,
        None when one side has none."""
        if self.old is None or self.new is None:
            return None
        return WORST.index(self.new) > WORST.index(self.old)


def diff(old: OpsIndex, new: OpsIndex) -> tuple[OpChange, ...]:
    """The operators whose behaviour differs from ``old`` to ``new`` (what a torch release
    fixed or broke), by name; then, for operators in both, the cases judged in both whose
    behaviour differs, and the gradients that differ, unless one index judged none
    (``gradients_not_judged``)."""
    before = {row.op: row for row in old.rows}
    after = {row.op: row for row in new.rows}
    was = {op: row.behaviour for op, row in before.items()}
    now = {op: row.behaviour for op, row in after.items()}
    behaviour = tuple(
        OpChange(op, was.get(op), now.get(op))
        for op in sorted(was.keys() | now.keys())
        if was.get(op) != now.get(op)
    )
    both = sorted(before.keys() & after.keys())
    cases = tuple(
        OpChange(op, was_case.behaviour, now_case.behaviour, case=was_case.case)
        for op in both
        for was_case in before[op].cases
        if (now_case := after[op].case(was_case.case)) is not None
        and now_case.behaviour is not was_case.behaviour
    )
    behaviour += cases
    if old.gradients_not_judged or new.gradients_not_judged:
        return behaviour
    gradients = tuple(
        OpChange(op, before[op].gradient, after[op].gradient, gradient=True)
        for op in both
        if before[op].gradient != after[op].gradient
    )
    return behaviour + gradients
