"""Fake-mode verdicts against eager ones on the same models, before and after a rule change:
how many rows change (verdict, or channels_last-only bytes) when re-run eagerly.

    python scripts/compare_fake_eager.py --before BEFORE --after AFTER --eager EAGER \\
        --names NAMES.txt --out reports/x.json

BEFORE, AFTER and EAGER are sweep reports or checkpoints (JSON, ``.json.gz`` or JSON Lines;
a checkpoint's first fake row per model is taken, so a ``--confirm`` checkpoint gives its fake
pass); NAMES a comma-separated list of the models compared. Rows that did not run (any status
but ok) on either side are counted apart.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path


def _rows(path: Path, fake: bool) -> dict[str, dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        text = handle.read()
    if path.suffix == ".jsonl" or path.name.endswith(".jsonl"):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = json.loads(text)["models"]
    found: dict[str, dict] = {}
    for row in rows:
        if fake and row.get("mode") != "fake":
            continue
        found.setdefault(row["name"], row)
    return found


def _figures(row: dict) -> tuple[str, int, int] | None:
    cost = row.get("cost")
    if row.get("status") != "ok" or cost is None:
        return None
    return cost["verdict"], cost["extra_bytes"], cost["saved_bytes"]


def compare(fake: dict[str, dict], eager: dict[str, dict], names: list[str]) -> dict:
    counts: Counter[str] = Counter()
    moved = []
    for name in names:
        predicted = _figures(fake[name]) if name in fake else None
        measured = _figures(eager[name]) if name in eager else None
        if predicted is None or measured is None:
            counts["not run on both sides"] += 1
            continue
        counts["compared"] += 1
        if predicted[0] != measured[0]:
            counts["verdict differs"] += 1
        if predicted[1:] != measured[1:]:
            counts["bytes differ"] += 1
        if predicted == measured:
            counts["identical"] += 1
        else:
            moved.append({"name": name, "fake": list(predicted), "eager": list(measured)})
    transitions = Counter(f"{m['fake'][0]} -> {m['eager'][0]}" for m in moved)
    return {"counts": dict(counts), "verdict_transitions": dict(transitions), "rows": moved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for side in ("before", "after", "eager"):
        parser.add_argument(f"--{side}", type=Path, required=True)
    parser.add_argument("--names", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    names = sorted(n for n in args.names.read_text().strip().split(",") if n)
    eager = _rows(args.eager, fake=False)
    result = {
        "models": len(names),
        "before": compare(_rows(args.before, fake=True), eager, names),
        "after": compare(_rows(args.after, fake=True), eager, names),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for side in ("before", "after"):
        print(side, result[side]["counts"], result[side]["verdict_transitions"])


if __name__ == "__main__":
    main()
