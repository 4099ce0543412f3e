"""Fix sites before and after a rule change: the cost sites of two sweep reports of the same
models (matched by kind, phase, operation, module and call site), and how many name another
fix site (added where there was none, dropped, or moved to another operation or line).

    python scripts/compare_fix_sites.py reports/timm_torch-2.14.1_cpu_fake+eager.json.gz \\
        /work/fixsites/timm_offenders_fix-sites.json.gz --out reports/fix-sites_timm.json

Reads the sweep JSON as written (any envelope version that has ``cost.sites``); rows without a
cost in either report are counted apart.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

Key = tuple[str | None, ...]


def _load(path: Path) -> dict[str, dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return {row["name"]: row for row in json.load(f)["models"]}


def _fix(site: dict[str, Any]) -> Key | None:
    fix = site.get("fix_site")
    return None if fix is None else (fix["python_op"] or fix["aten_op"], fix["module_path"],
                                     fix["call_site"])  # fmt: skip


def _sites(row: dict[str, Any]) -> dict[Key, Key | None] | None:
    cost = row.get("cost")
    if not cost:
        return None
    return {
        (s["kind"], s["phase"], s["op"], s["module_path"], s["call_site"]): _fix(s)
        for s in cost["sites"]
        if s["channels_last_bytes"] > s["nchw_bytes"]
    }


def compare(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    models: dict[str, Counter[tuple[Any, ...]]] = {}
    for name in sorted(before.keys() & after.keys()):
        old, new = _sites(before[name]), _sites(after[name])
        if old is None or new is None:
            counts["models without a cost in one report"] += 1
            continue
        counts["models compared"] += 1
        for key in old.keys() & new.keys():
            counts["costing sites in both"] += 1
            was, now = old[key], new[key]
            if was == now:
                counts["same fix site"] += 1
                continue
            change = "added" if was is None else "dropped" if now is None else "moved"
            counts[f"fix site {change}"] += 1
            # by line, not module: a change repeated in every block is one entry
            line = (key[2], key[4], was and (was[0], was[2]), now and (now[0], now[2]))
            models.setdefault(name, Counter())[line] += 1
        counts["costing sites in one report only"] += len(old.keys() ^ new.keys())
    counts["models with a fix site changed"] = len(models)
    changed = {
        name: [
            {"op": op, "call_site": site, "before": was, "after": now, "sites": n}
            for (op, site, was, now), n in lines.items()
        ]
        for name, lines in models.items()
    }
    return {"counts": dict(counts), "changed": changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = {"before": str(args.before), "after": str(args.after),
              **compare(_load(args.before), _load(args.after))}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["counts"], indent=1))


if __name__ == "__main__":
    main()
