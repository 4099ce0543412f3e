"""How often two identical ``cl-audit bench`` runs agree, on a machine loaded on purpose.

Runs ``cl-audit bench MODEL --input-size SIZE --json`` in pairs, back to back, while a load
process keeps one core busy with torch work (``--load 0``: no load). Each run's verdict is read
from its JSON: the word (faster / slower / inconclusive) where the report carries one, else
from the sentence older versions wrote. A pair disagrees when one run says faster and the other
slower; "inconclusive" contradicts neither.

    python scripts/bench_agreement.py --pairs 6 --out reports/bench-agreement.json
    PYTHONPATH=/path/to/other/checkout python scripts/bench_agreement.py ...  # other code
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOAD = """
import torch
torch.set_num_threads(1)
a = torch.randn(512, 512)
while True:
    a = (a @ a).tanh()
"""


def verdict_word(report: dict) -> str:
    """faster, slower or inconclusive: the report's own word (version 2), or read from the
    sentence version 1 wrote."""
    if report["version"] >= 2:
        return report["verdict"]
    return "faster" if "faster" in report["verdict"] else "slower"


def bench(model: str, size: str, env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "bench.json"
        command = [sys.executable, "-m", "cl_audit", "bench", model, "--input-size", size]
        subprocess.run([*command, "--json", str(out)], check=True, env=env, capture_output=True)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--input-size", default="3x96x96")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--load", type=int, default=1, help="busy load processes")
    parser.add_argument("--out", help="write the runs as JSON here")
    args = parser.parse_args()
    env = dict(os.environ)
    loads = [subprocess.Popen([sys.executable, "-c", LOAD]) for _ in range(args.load)]
    runs = []
    try:
        time.sleep(2)
        for _ in range(args.pairs):
            pair = [bench(args.model, args.input_size, env) for _ in range(2)]
            words = [verdict_word(r) for r in pair]
            sentences = [r.get("verdict_text", r["verdict"]) for r in pair]
            runs.append({"words": words, "sentences": sentences})
            print(words, sentences, flush=True)
    finally:
        for load in loads:
            load.kill()
    contradictions = sum(set(r["words"]) == {"faster", "slower"} for r in runs)
    inconclusive = sum(w == "inconclusive" for r in runs for w in r["words"])
    result = {
        "model": args.model,
        "input_size": args.input_size,
        "load_processes": args.load,
        "pairs": len(runs),
        "contradicting_pairs": contradictions,
        "inconclusive_runs": inconclusive,
        "runs": runs,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
