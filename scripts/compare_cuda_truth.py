"""Predicted against measured CUDA: a fake sweep report (made without a GPU) against eager rows
of the same models audited on a GPU (sweeps' checkpoints, JSON Lines, gzipped or not; a model
in two of them counts once, the later file's row).

    python scripts/compare_cuda_truth.py reports/timm_torch-2.14.1_cuda_train_predicted.json.gz \\
        reports/timm_torch-2.11.0_cuda_train_eager_h200_shards-1-2-of-6.jsonl.gz

Prints, as Markdown: the verdict matrix (predicted by measured, outcomes as
``compare_reports.py`` reads them), how many rows agree on the verdict and on the offending
sites ((aten op, phase, call site) of each finding), and each disagreement with the sites only
one side has and both shares of the step's bytes. Rows that failed on the GPU for want of
memory (many workers on one GPU, or over a sweep's memory cap) are counted apart, not as
disagreements. For two whole sweep
reports, ``compare_reports.py``.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path

from compare_reports import _outcome

from cl_audit.report import ModelRow, Status, SweepReport

KINDS = ("offending", "minor", "clean", "error")


def _measured(path: Path) -> list[ModelRow]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as lines:
        return [ModelRow.from_dict(json.loads(line)) for line in lines if line.strip()]


def _sites(row: ModelRow) -> set[tuple[str, str, str]]:
    return {(f.aten_op, f.phase.value, f.call_site or "?") for f in row.offenders}


def _share(row: ModelRow) -> str:
    return "-" if row.cost is None else f"{row.cost.share:.2%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("predicted", type=Path)
    parser.add_argument("measured", type=Path, nargs="+", help="one or more checkpoints")
    args = parser.parse_args()
    predicted = {r.name: r for r in SweepReport.from_bytes(args.predicted.read_bytes()).models}
    matrix: Counter[tuple[str, str]] = Counter()
    memory, same_sites, both_ok, disagreements = 0, 0, 0, []
    measured = {row.name: row for path in args.measured for row in _measured(path)}
    for row in measured.values():
        guess = predicted.get(row.name)
        if guess is None:
            continue
        if row.status is Status.OUT_OF_MEMORY or "OutOfMemoryError" in (row.message or ""):
            memory += 1
            continue
        pair = (_outcome(guess), _outcome(row))
        matrix[pair] += 1
        if guess.status is row.status is Status.OK:
            both_ok += 1
            same_sites += _sites(guess) == _sites(row)
        if pair[0] != pair[1]:
            disagreements.append((guess, row))
    print(f"{sum(matrix.values())} models compared ({memory} more ran out of GPU memory)\n")
    print("| predicted \\ measured | " + " | ".join(KINDS) + " |")
    print("|---|" + "---|" * len(KINDS))
    for p in KINDS:
        print(f"| {p} | " + " | ".join(str(matrix[(p, m)]) for m in KINDS) + " |")
    agree = sum(n for (p, m), n in matrix.items() if p == m)
    print(f"\nverdicts agree: {agree} of {sum(matrix.values())}; both ran: {both_ok}, with the")
    print(f"same offending sites (aten op, phase, call site): {same_sites}\n")
    for guess, row in disagreements:
        only_p = sorted(_sites(guess) - _sites(row))
        only_m = sorted(_sites(row) - _sites(guess))
        print(f"- {row.name}: predicted {_outcome(guess)} ({_share(guess)} of the bytes), measured")
        print(f"  {_outcome(row)} ({_share(row)}); sites only predicted {only_p or 'none'},")
        print(f"  only measured {only_m or 'none'}")
        failed = next((r for r in (row, guess) if r.status is not Status.OK), None)
        if failed is not None:
            print(f"  message: {(failed.message or '')[:160]}")


if __name__ == "__main__":
    main()
