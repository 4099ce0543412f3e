"""What a sweep's speed verdicts say, registry-wide: how many models channels_last slows, the
operation classes responsible, and how the speed verdict sits beside the byte verdict.

    python scripts/summarise_speed.py reports/timm_torch-2.14.1_cuda_train_speed_predicted.json.gz

For each model with a speed verdict: the class that costs channels_last the most time against
NCHW (the largest channels_last-minus-NCHW milliseconds; for a faster model, the one that gains
the most). Prints Markdown tables: verdicts, verdicts against the byte verdict, the responsible
classes of the slower models, the families (the name up to its first digit or underscore) with
the most slower models, and the slowest and fastest models.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
from collections import Counter
from pathlib import Path


def read(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["models"]


def responsible(speed: dict, slower: bool) -> str:
    """The class whose time moves most in the verdict's direction."""
    delta = {c["class"]: c["channels_last_ms"] - c["nchw_ms"] for c in speed["classes"]}
    pick = max if slower else min
    return pick(delta, key=delta.get) if delta else "?"


def family(name: str) -> str:
    return re.split(r"[\d_]", name, maxsplit=1)[0] or name


def table(head: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path)
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    models = read(a.sweep)
    judged = [m for m in models if m["status"] == "ok" and (m.get("speed") or {}).get("speedup")]
    print(f"{len(models)} models; {len(judged)} with a speed verdict; "
          f"{len(models) - len(judged)} without (failed, or no verdict)\n")  # fmt: skip
    verdicts = Counter(m["speed"]["verdict"] for m in judged)
    print(table(("speed verdict", "models"), sorted(verdicts.items(), key=lambda kv: -kv[1])))
    speedups = [m["speed"]["speedup"] for m in judged]
    q = statistics.quantiles(speedups, n=4)
    middle = statistics.median(speedups)
    print(f"\nmedian speedup {middle:.3f}x (quartiles {q[0]:.3f}-{q[2]:.3f})\n")
    cross = Counter((m["summary"]["verdict"], m["speed"]["verdict"]) for m in judged)
    byte_verdicts = sorted({b for b, _ in cross})
    speed_verdicts = sorted(verdicts)
    rows = [(b, *(cross[(b, s)] for s in speed_verdicts)) for b in byte_verdicts]
    print(table(("byte verdict", *speed_verdicts), rows) + "\n")
    slower = [m for m in judged if m["speed"]["verdict"] == "slower"]
    causes = Counter(responsible(m["speed"], True) for m in slower)
    print(table(("class costing the slower models most", "models"), causes.most_common()) + "\n")
    families = Counter(family(m["name"]) for m in slower)
    totals = Counter(family(m["name"]) for m in judged)
    rows = [(f, n, totals[f]) for f, n in families.most_common(a.top)]
    print(table(("family", "slower", "of"), rows) + "\n")
    ranked = sorted(judged, key=lambda m: m["speed"]["speedup"])

    def line(m: dict, slow: bool) -> tuple:
        s = m["speed"]
        share = (m.get("cost") or {}).get("share")
        return (m["name"], f"{s['speedup']:.2f}", responsible(s, slow), m["summary"]["verdict"],
                f"{share:.2%}" if share is not None else "-")  # fmt: skip

    head = ("model", "speedup", "class", "byte verdict", "byte share")
    print(table(head, [line(m, True) for m in ranked[: a.top]]) + "\n")
    print(table(head, [line(m, False) for m in ranked[-a.top :][::-1]]))


if __name__ == "__main__":
    main()
