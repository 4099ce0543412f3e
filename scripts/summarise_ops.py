"""Summarise committed operator indexes: the figures of reports/pages/ops-index.md and
docs/ops.md, from the indexes themselves.

    python scripts/summarise_ops.py reports/ops/cpu-float32_torch-*.json.gz

Per index: the rows judged by behaviour (a row with an error, whose samples could not be made,
is not judged), the share of ``op_db`` judged (``op_db``'s entries are its rows and its listed
operators; ``module_db``'s are named ``nn.`` and a capital, ``nn.Conv2d``),
the listed operators by reason, the mixed-layout cases, the gradients, and the seconds.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from cl_audit.report.files import read_ops
from cl_audit.report.ops_report import WORST

MODULE = re.compile(r"^nn\.[A-Z]")


def _kind(reason: str) -> str:
    if "a factory" in reason:
        return "factories"
    if reason.startswith("takes no"):
        return "no dtype on the device"
    if "Jiterator" in reason:
        return "CUDA-only (jiterator)"
    if "floating-point" in reason:
        return "no floating-point first input"
    if "is sparse" in reason:
        return "sparse first input"
    return "no 4-D input runs"


def summarise(path: Path) -> None:
    index = read_ops(path)
    rows, listed = index.rows, index.unjudged
    behaviours = Counter(r.behaviour for r in rows if r.behaviour is not None)
    errors = [r.op for r in rows if r.behaviour is None]
    op_rows = [r for r in rows if not MODULE.match(r.op)]
    op_judged = [r for r in op_rows if r.behaviour is not None]
    op_listed = [u for u in listed if not MODULE.match(u.op)]
    entries = len(op_rows) + len(op_listed)
    share = 100 * len(op_judged) / entries
    counts = " | ".join(str(behaviours[b]) for b in WORST)
    print(f"## {path.name} (torch {index.torch}, {index.device}, {index.dtype})")
    print(
        f"| {index.torch.split('+')[0]} | {len(rows) - len(errors)} | {counts} | {len(errors)} | "
        f"{len(op_judged)} of {entries} ({share:.1f}%) | {len(listed)} | {index.seconds:.1f} |"
    )
    print("rows with an error:", errors)
    print("listed:", dict(Counter(_kind(u.reason) for u in listed)))
    print("op_db listed:", dict(Counter(_kind(u.reason) for u in op_listed)))
    mixed: dict[str, Counter[str]] = {}
    for row in rows:
        for case in row.cases:
            if case.mixed:
                mixed.setdefault(case.case, Counter())[case.behaviour.value] += 1
    for label, seen in mixed.items():
        print(f"mixed {label}: {dict(seen)}")
    gradients = Counter(r.gradient.value if r.gradient else "none judged" for r in rows)
    print("gradients:", dict(gradients))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("indexes", nargs="+", type=Path)
    for path in parser.parse_args().indexes:
        summarise(path)


if __name__ == "__main__":
    main()
