"""The models of a ``speed_truth.py`` file whose rounds were too noisy to decide, measured again
with more rounds, and the file both passes make (the second pass in place of the first, the
first kept beside it as ``first_pass``).

    python scripts/remeasure_noisy.py TRUTH.jsonl --out FINAL.jsonl -- --device cpu --batch 4 \
        --size 192 --rounds 9 --steps 2

Noisy: the round-by-round ratios' quartiles straddle 1, or a layout's rounds spread by more
than 25% of their median ((slowest - fastest) / median), the rule the CPU check of issue #58
used. Every model's second pass is measured alone, in the order of the file, by speed_truth.py
(nothing here imports cl-audit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SPREAD = 0.25


def noisy(row: dict) -> bool:
    low, _, high = row["ratio_quartiles"]
    spread = max((max(r) - min(r)) / statistics.median(r) for r in row["rounds_ms"].values())
    return low < 1 < high or spread > SPREAD


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("truth", type=Path)
    p.add_argument("--out", type=Path, required=True)
    ours, _, theirs = " ".join(sys.argv[1:]).partition(" -- ")
    a = p.parse_args(ours.split())
    a.rest = theirs.split()
    rows = [json.loads(line) for line in a.truth.read_text().splitlines() if line.strip()]
    again = [r["name"] for r in rows if r.get("status") == "ok" and noisy(r)]
    second = a.out.with_name(a.out.stem + "_second-pass.jsonl")
    if again:
        subprocess.run(
            [sys.executable, str(Path(__file__).with_name("speed_truth.py")), *a.rest,
             "--models", ",".join(again), "--out", str(second)],
            check=True,
        )  # fmt: skip
    redone = {}
    if second.exists():
        redone = {r["name"]: r for r in map(json.loads, second.read_text().splitlines()) if r}
    merged = []
    for r in rows:
        fresh = redone.get(r["name"])
        merged.append(dict(fresh, first_pass=r) if fresh and fresh["status"] == "ok" else r)
    tmp = a.out.with_name(a.out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in merged))
    tmp.replace(a.out)
    print(f"{len(again)} measured again: {', '.join(again)}")


if __name__ == "__main__":
    main()
