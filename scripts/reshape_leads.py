"""Which committed sweep rows would change their reshape lead now that a reshape's remedy is
keyed to the call's shapes: every model of the committed sweeps with a site offered the
flattening entry is audited again (fake, inference, CPU, its sweep's input size, verify off, as
the sweeps ran), and its sites offered each reshape entry are counted.

    python scripts/reshape_leads.py --out reports/reshape-leads_torch-2.14.1.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from collections import Counter
from pathlib import Path

import torch

from cl_audit.enums import ModelSource, TensorMode
from cl_audit.execution.settings import AuditSettings
from cl_audit.report.files import write_text
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.source_audit import audit_loaded

FLATTEN = "flatten or reshape of a channels_last map"
PER_CHANNEL = "batch and channels of a channels_last map merged"
SWEEPS = ("reports/torchvision_torch-2.14.1_cpu_eager.json.gz",
          "reports/timm_torch-2.14.1_cpu_fake.json.gz")  # fmt: skip


def committed() -> dict[tuple[str, str], int]:
    """(source, name) -> the sites offered the flattening in the committed sweeps."""
    found: dict[tuple[str, str], int] = {}
    for path in SWEEPS:
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
        for row in data["models"]:
            sites = (row.get("cost") or {}).get("sites", [])
            n = sum(1 for s in sites if (s.get("remedy") or {}).get("pattern") == FLATTEN)
            if n:
                found[row.get("source", "torchvision"), row["name"]] = n
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = AuditSettings(tensor_mode=TensorMode.FAKE, verify=False)
    rows = []
    for (source, name), before in sorted(committed().items()):
        start = time.perf_counter()
        row: dict[str, object] = {"model": f"{source}:{name}", "flatten_committed": before}
        try:
            options = BuildOptions(max_input_size=256, skip_random_init=True)  # as the sweeps
            loaded = load_model(ModelRef(ModelSource(source), name), options)
            report = audit_loaded(loaded, settings)
            patterns = Counter(
                s.remedy.pattern for s in report.cost.sites if s.extra and s.remedy is not None
            )
            row["flatten_now"] = patterns[FLATTEN]
            row["per_channel_now"] = sum(
                n for p, n in patterns.items() if p.startswith(PER_CHANNEL)
            )
        except Exception as e:  # a model that fails is a row
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    moved = [r for r in rows if r.get("per_channel_now")]
    summary = {"models": len(rows), "errors": sum("error" in r for r in rows),
               "models_with_a_per_channel_lead": len(moved)}  # fmt: skip
    document = {"torch": torch.__version__, "summary": summary, "models": rows}
    write_text(args.out, json.dumps(document, indent=1) + "\n", "--out")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
