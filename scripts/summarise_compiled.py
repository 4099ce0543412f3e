"""Compare cl-audit's compiled verdicts with the independent measurement (issue #69's proof).

    python scripts/summarise_compiled.py reports/compiled/check-cpu_torch-2.14.1 \
        > reports/compiled/check-cpu_torch-2.14.1/summary.md

Reads the folder that scripts/compiled_check_cpu.sh writes: ``truth-*.jsonl``
(scripts/speed_truth.py --compile, which does not import cl-audit) and ``audits/*.json``, gzipped
or not (``cl-audit MODEL --compile --time --json``). For each model in both: the independent
compiled speedup (NCHW over channels_last, the median round's ratio: the JSON's ``speedup`` is
the ratio of the median rounds; the rounds' ratios' median is used here, as cl-audit's) and
cl-audit's,
with both of cl-audit's verdicts (eager and compiled). Direction right: where the independent
speedup lies outside 0.95-1.05, cl-audit's compiled speedup lies on the same side of 1 (its
verdict is counted apart: faster or slower on the independent's side, the other side, or
where the independent lies within the band). Models
whose eager and compiled verdicts disagree (one faster, the other not; or one slower, the other
not) are listed with the class whose time differs most between the layouts in each step. Writes
``summary.json`` beside (whole, through a temporary file) and prints the Markdown.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

BAND = 0.05


def main() -> None:
    folder = Path(sys.argv[1])
    truth: dict[str, dict] = {}
    for path in sorted(folder.glob("truth-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            truth[row["name"].removeprefix("tv:")] = row
    rows, failed = [], []
    for name, t in truth.items():
        if t["status"] != "ok":
            failed.append({"model": name, "where": "independent", "message": t["message"]})
    for path in sorted((folder / "audits").glob("*.json*")):
        name = path.name.split(".json")[0]
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            report = json.load(f)
        t = truth.get(name)
        if report.get("status") == "error":
            failed.append({"model": name, "where": "cl-audit", "message": report["message"]})
            continue
        if t is None or t["status"] != "ok":
            continue
        speed = report.get("speed") or {}
        compiled = speed.get("compiled") or {}
        if compiled.get("speedup") is None:
            continue
        rounds = t["rounds_ms"]
        ratios = [n / c for n, c in zip(rounds["nchw"], rounds["channels_last"], strict=True)]
        independent = statistics.median(ratios)
        rows.append(
            {
                "model": name,
                "independent": round(independent, 4),
                "independent_quartiles": [round(q, 4) for q in t["ratio_quartiles"]],
                "compiled": round(compiled["speedup"], 4),
                "compiled_verdict": compiled["verdict"],
                "eager": speed.get("speedup") and round(speed["speedup"], 4),
                "eager_verdict": speed.get("verdict"),
                "compile_s": [compiled[k]["compile_seconds"] for k in ("channels_last", "nchw")],
                "graphs": compiled["channels_last"]["graphs"],
                "graph_breaks": compiled["channels_last"]["graph_breaks"],
                "compiled_class": _widest(compiled["classes"]),
                "eager_class": _widest(speed.get("classes") or []),
            }
        )
    outside = [r for r in rows if abs(r["independent"] - 1) > BAND]
    right = [r for r in outside if (r["independent"] > 1) == (r["compiled"] > 1)]
    disagree = [r for r in rows if _disagree(r["eager_verdict"], r["compiled_verdict"])]
    sides = {"faster": True, "slower": False}
    decided = [r for r in rows if r["compiled_verdict"] in sides]
    summary = {
        "models": len(rows),
        "outside_band": len(outside),
        "direction_right": len(right),
        "wrong": [r["model"] for r in outside if r not in right],
        "eager_compiled_disagree": [r["model"] for r in disagree],
        # cl-audit's verdict (not its speedup) against the independent side: faster or slower
        # where the independent lies beyond the band that way, the other way, or within it
        "verdict_same_side": [
            r["model"]
            for r in decided
            if r in outside and (r["independent"] > 1) == sides[r["compiled_verdict"]]
        ],
        "verdict_other_side": [
            r["model"]
            for r in decided
            if r in outside and (r["independent"] > 1) != sides[r["compiled_verdict"]]
        ],
        "verdict_decided_within_band": [r["model"] for r in decided if r not in outside],
        "median_abs_error": _median_error(rows),
        "failed": failed,
        "rows": rows,
    }
    _write(folder / "summary.json", json.dumps(summary, indent=1) + "\n")
    print(_markdown(summary))


def _median_error(rows: list[dict]) -> float | None:
    """The median of |cl-audit's compiled speedup / the independent one - 1|."""
    errors = [abs(r["compiled"] / r["independent"] - 1) for r in rows]
    return statistics.median(errors) if errors else None


def _widest(classes: list[dict]) -> str | None:
    """The class whose time differs most between the layouts: ``fused kernels +1.20 ms``
    (channels_last's time minus NCHW's)."""
    if not classes:
        return None
    c = max(classes, key=lambda c: abs(c["channels_last_ms"] - c["nchw_ms"]))
    return f"{c['class']} {c['channels_last_ms'] - c['nchw_ms']:+.2f} ms"


def _disagree(eager: str | None, compiled: str | None) -> bool:
    sides = ("faster", "slower")
    return eager != compiled and (eager in sides or compiled in sides)


def _markdown(s: dict) -> str:
    lines = [
        f"{s['models']} models; outside {1 - BAND:.2f}-{1 + BAND:.2f} (independent): "
        f"{s['outside_band']}, direction right for {s['direction_right']}"
        + (f" (wrong: {', '.join(s['wrong'])})" if s["wrong"] else "")
        + f"; median |cl-audit / independent - 1|: {s['median_abs_error']:.1%}",
        f"cl-audit's compiled verdict faster or slower: {len(s['verdict_same_side'])} on the "
        f"independent's side beyond the band, {len(s['verdict_other_side'])} on the other side"
        + "".join(f" ({m})" for m in s["verdict_other_side"])
        + f", {len(s['verdict_decided_within_band'])} where the independent lies within it"
        + (
            f" ({', '.join(s['verdict_decided_within_band'])})"
            if s["verdict_decided_within_band"]
            else ""
        ),
        "",
        "| model | independent | cl-audit compiled | eager (cl-audit) | compile s (cl, nchw) "
        "| graphs, breaks | class differing most, compiled | eager |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in s["rows"]:
        q = r["independent_quartiles"]
        lines.append(
            f"| {r['model']} | {r['independent']:.2f}x ({q[0]:.2f}-{q[2]:.2f}) "
            f"| {r['compiled']:.2f}x {r['compiled_verdict']} "
            f"| {r['eager'] or 0:.2f}x {r['eager_verdict']} "
            f"| {r['compile_s'][0]:.0f}, {r['compile_s'][1]:.0f} "
            f"| {r['graphs']}, {r['graph_breaks']} | {r['compiled_class']} | {r['eager_class']} |"
        )
    lines += ["", f"Failed ({len(s['failed'])}):"] + [
        f"- {f['model']} ({f['where']}): {f['message']}" for f in s["failed"]
    ]
    return "\n".join(lines)


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
