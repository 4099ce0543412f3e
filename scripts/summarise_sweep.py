"""Markdown tables for reports/README.md from a sweep report (.json or .json.gz).

python scripts/summarise_sweep.py reports/timm_torch-2.14.1_cpu_fake+eager.json.gz --top 15
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from cl_audit.report import Status, SweepReport


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    report = SweepReport.from_bytes(args.report.read_bytes())
    s = report.summary
    modes = Counter(r.mode.value for r in report.models)
    print(
        f"{s.models} models: {s.clean} clean, {s.offending} offending, {s.failed} failed, "
        f"{s.skipped} skipped; rows by mode: {dict(sorted(modes.items()))}\n"
    )
    print("| op | Python-level calls | models | events | converted | for example |")
    print("|---|---|---|---|---|---|")
    for cov in report.operators[: args.top]:
        mib = cov.bytes_converted / 2**20
        examples = ", ".join(f"`{e}`" for e in cov.examples[:2])
        python_ops = ", ".join(f"`{p}`" for p in cov.python_ops)
        print(
            f"| `{cov.op}` | {python_ops} | {cov.models} | {cov.events} | {mib:,.1f} MiB "
            f"| {examples} |"
        )
    failed = [r for r in report.models if r.status is not Status.OK]
    if failed:
        print("\n| model | status | stage | message |\n|---|---|---|---|")
        for row in failed:
            message = (row.message or "").replace("|", "/").replace("\n", " ")[:140]
            stage = row.stage.value if row.stage else ""
            print(f"| {row.name} | {row.status.value} | {stage} | {message} |")


if __name__ == "__main__":
    main()
