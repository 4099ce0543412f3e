"""Predicted against measured CUDA: a fake sweep report (made without a GPU) against eager rows
of the same models audited on a GPU (a sweep's checkpoint, JSON Lines, gzipped or not).

    python scripts/compare_cuda_truth.py reports/timm_torch-2.14.1_cuda_train_predicted.json.gz \\
        reports/timm_torch-2.11.0_cuda_train_eager_h200_shards-1-2-of-6.jsonl.gz

Prints, as Markdown: the verdict matrix (predicted by measured), how many rows agree on the
verdict and on the offending sites ((aten op, phase, call site) of each finding), and each
disagreement with the sites only one side has and both shares at the gate. Rows that failed on
the GPU for want of memory (many workers on one GPU) are counted apart, not as disagreements.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path


def _open(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else path.open()


def _verdict(row: dict) -> str:
    return row["summary"]["verdict"] if row["status"] == "ok" else row["status"]


def _sites(row: dict) -> set[tuple[str, str, str]]:
    return {(f["aten_op"], f["phase"], f["call_site"] or "?") for f in row.get("offenders") or ()}


def _share(row: dict) -> str:
    cost = row.get("cost") or {}
    return f"{cost['share']:.2%}" if cost.get("share") is not None else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("predicted", type=Path)
    parser.add_argument("measured", type=Path)
    args = parser.parse_args()
    with _open(args.predicted) as f:
        predicted = {row["name"]: row for row in json.load(f)["models"]}
    with _open(args.measured) as f:
        measured = [json.loads(line) for line in f if line.strip()]
    matrix: Counter[tuple[str, str]] = Counter()
    memory, same_sites, both_ok, disagreements = 0, 0, 0, []
    for row in measured:
        guess = predicted.get(row["name"])
        if guess is None:
            continue
        if row["status"] != "ok" and "OutOfMemoryError" in (row.get("message") or ""):
            memory += 1
            continue
        pair = (_verdict(guess), _verdict(row))
        matrix[pair] += 1
        if guess["status"] == row["status"] == "ok":
            both_ok += 1
            same_sites += _sites(guess) == _sites(row)
        if pair[0] != pair[1]:
            disagreements.append((row["name"], guess, row))
    kinds = ["offending", "minor", "clean", "error"]
    print(f"{sum(matrix.values())} models compared ({memory} more ran out of GPU memory)\n")
    print("| predicted \\ measured | " + " | ".join(kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for p in kinds:
        cells = [str(matrix[(p, m)]) for m in kinds]
        print(f"| {p} | " + " | ".join(cells) + " |")
    agree = sum(n for (p, m), n in matrix.items() if p == m)
    print(f"\nverdicts agree: {agree} of {sum(matrix.values())}; both ran: {both_ok}, with the")
    print(f"same offending sites (aten op, phase, call site): {same_sites}\n")
    for name, guess, row in disagreements:
        only_p = sorted(_sites(guess) - _sites(row))
        only_m = sorted(_sites(row) - _sites(guess))
        print(f"- {name}: predicted {_verdict(guess)} ({_share(guess)} at the gate), measured")
        print(f"  {_verdict(row)} ({_share(row)}); sites only predicted {only_p or 'none'},")
        print(f"  only measured {only_m or 'none'}")
        if row["status"] != "ok" or guess["status"] != "ok":
            message = (row.get("message") or guess.get("message") or "")[:160]
            print(f"  message: {message}")


if __name__ == "__main__":
    main()
