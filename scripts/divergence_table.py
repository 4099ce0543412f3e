"""Make ``cl_audit/predict/divergences.json``: what fake tensors get wrong, per torch version and
device, from the measurements of ``scripts/gpu_truth.py`` (eager against fake on one device).

    python scripts/divergence_table.py reports/gpu-truth/*.json

The rule: an operation enters the table of a (torch major.minor, device) when, for some model
and configuration of the measurement, one run (eager or fake) lost channels_last at it and the
other did not. Regains are left out: a regain that only one run has follows a loss upstream
(the loss is the divergence; the regain is where the model converts the data back). Entries are
keyed by operation and phase, so a divergence of a backward kernel does not touch inference.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "cl_audit" / "predict" / "divergences.json"


def table(measurement: dict) -> dict:
    summary = measurement["summary"]
    ops: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for row in measurement["rows"]:
        where = f"{row['model']} {row['configuration']}"
        for side in ("eager_only", "fake_only"):
            for kind, op, phase in row.get(side, ()):
                if kind == "loss":
                    ops[(op, phase)][side.removesuffix("_only")].add(where)
    version = re.match(r"\d+\.\d+", summary["torch"])[0]
    return {
        "torch": version,
        "device": summary["device"],
        "measured": f"torch {summary['torch']}, {summary['rows']} runs "
        f"({summary['agree']} agree, {summary['diverge']} diverge, {summary['error']} errors)",
        "ops": [
            {"op": op, "phase": phase, **{side: sorted(w) for side, w in sorted(sides.items())}}
            for (op, phase), sides in sorted(ops.items())
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measurements", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    tables = [table(json.loads(path.read_text())) for path in args.measurements]
    tables.sort(key=lambda t: (t["device"], tuple(map(int, t["torch"].split(".")))))
    keys = [(t["torch"], t["device"]) for t in tables]
    if len(set(keys)) != len(keys):
        raise SystemExit(f"two measurements of one torch version and device: {keys}")
    document = {"format": "cl-audit.fake-divergences", "version": 1, "tables": tables}
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    for t in tables:
        names = ", ".join(f"{e['op']} ({e['phase']})" for e in t["ops"]) or "none"
        print(f"torch {t['torch']} {t['device']}: {names}")


if __name__ == "__main__":
    main()
