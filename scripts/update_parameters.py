"""Refresh the parameter counts that ``--shard`` uses to balance shards, from sweep reports.

python scripts/update_parameters.py reports/timm_*.json.gz reports/torchvision_*.json.gz
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cl_audit.report import ModelSource, SweepReport

TABLE = Path(__file__).resolve().parents[1] / "cl_audit" / "sweep" / "parameters.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    args = parser.parse_args()
    table = json.loads(TABLE.read_text())
    for path in args.reports:
        for row in SweepReport.from_bytes(path.read_bytes()).models:
            if row.parameters is not None and row.source is not ModelSource.USER:
                table[row.key] = row.parameters
    TABLE.write_text(json.dumps(dict(sorted(table.items())), indent=0) + "\n")
    print(f"{len(table)} parameter counts in {TABLE}")


if __name__ == "__main__":
    main()
