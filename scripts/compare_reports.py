"""Two sweep reports of one registry, row by row: statuses and verdicts, and how many moved.

    python scripts/compare_reports.py OLD.json.gz NEW.json.gz [--list] [--sites]

Reads any sweep envelope version (``cl_audit.report.SweepReport``). Prints the counts of each
(status, verdict) in both, the transitions between them, and with ``--list`` the models whose
verdict or status moved; with ``--sites``, of the models with a cost in both, how many have the
same cost sites (kind, phase, operation, module, call site, channels_last-only bytes) and how
many a different total of bytes written, listing those whose sites differ.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from fake_step_selfcheck import sites

from cl_audit.report import SweepReport


def _outcome(row: object) -> str:
    cost = row.cost
    return row.status.value if cost is None else cost.verdict.value


def _compare_sites(old: dict, new: dict) -> None:
    both = [k for k in sorted(old.keys() & new.keys()) if old[k].cost and new[k].cost]
    differ = [k for k in both if sites(old[k]) != sites(new[k])]
    written = [k for k in both if old[k].cost.bytes_written != new[k].cost.bytes_written]
    ratios = sorted(new[k].cost.bytes_written / old[k].cost.bytes_written for k in written)
    print(f"cost sites: {len(both) - len(differ)} of {len(both)} models the same")
    if ratios:
        print(
            f"bytes written: {len(written)} models differ, new/old median "
            f"{ratios[len(ratios) // 2]:.3f}, range {ratios[0]:.3f} to {ratios[-1]:.3f}"
        )
    for key in differ:
        print(f"  sites differ: {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--sites", action="store_true")
    args = parser.parse_args()
    old = {row.key: row for row in SweepReport.from_bytes(args.old.read_bytes()).models}
    new = {row.key: row for row in SweepReport.from_bytes(args.new.read_bytes()).models}
    for label, rows in (("old", old), ("new", new)):
        print(label, dict(Counter(_outcome(r) for r in rows.values()).most_common()))
    moves = Counter()
    moved = []
    for key in sorted(old.keys() & new.keys()):
        before, after = _outcome(old[key]), _outcome(new[key])
        moves[(before, after)] += 1
        if before != after:
            moved.append(f"{key}: {before} -> {after}")
    for (before, after), count in sorted(moves.items(), key=lambda item: -item[1]):
        print(f"{before} -> {after}: {count}")
    print(f"only old: {len(old.keys() - new.keys())}, only new: {len(new.keys() - old.keys())}")
    if args.list:
        print("\n".join(moved))
    if args.sites:
        _compare_sites(old, new)


if __name__ == "__main__":
    main()
