"""Run a cl-audit command and measure it from outside: wall time and the peak memory of its
whole process tree (the sum of PSS, so pages shared by forked workers count once), sampled
every 0.5 s.

    python scripts/measure_sweep.py --out reports/x.measure.json -- cl-audit --timm all --fake
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from process_tree import tree  # a sibling script


def tree_memory_mb(root: int) -> tuple[float, float]:
    """(sum of PSS, sum of RSS) in MB over ``root`` and its descendants."""
    pss = rss = 0
    for pid in tree([root]):
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                pss += int(line.split()[1])
            elif line.startswith("Rss:"):
                rss += int(line.split()[1])
    return pss / 1024, rss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    start = time.monotonic()
    process = subprocess.Popen(command)
    peak_pss = peak_rss = 0.0
    while process.poll() is None:
        pss, rss = tree_memory_mb(process.pid)
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        time.sleep(0.5)
    result = {
        "command": command,
        "exit_code": process.returncode,
        "wall_seconds": round(time.monotonic() - start, 1),
        "peak_tree_pss_mb": round(peak_pss),
        "peak_tree_rss_mb": round(peak_rss),
        "cpus": os.cpu_count(),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), file=sys.stderr)


if __name__ == "__main__":
    main()
