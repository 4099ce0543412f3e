"""Remedies tried on models: each model audited eagerly with the what-if runs on, and per call
site tried, what each change did (held or failed, and why); the counts of verified, refuted and
untried (lead) remedies over the cost sites that carry one.

    python scripts/verify_remedies.py --out reports/remedies_torch-2.14.1_eager-cpu.json \\
        shufflenet_v2_x1_0 timm:coatnet_0_rw_224 timm:mobilevitv2_050 timm:halonet50ts
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from cl_audit.enums import ModelSource
from cl_audit.execution.settings import AuditSettings, parse_input_size
from cl_audit.report import ModelReport
from cl_audit.report.files import write_text
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.source_audit import audit_loaded


def _ref(name: str) -> ModelRef:
    source, _, model = name.rpartition(":")
    return ModelRef(ModelSource(source) if source else ModelSource.TORCHVISION, model)


def tried(report: ModelReport) -> dict[str, Any]:
    cost = report.cost
    if cost is None:
        return {"model": report.model, "error": "no cost weighed"}
    remedied = [s for s in cost.sites if s.remedy is not None]
    lines: dict[str, list[dict[str, Any]]] = {}
    for site in remedied:
        for trial in site.remedy.evidence:
            lines.setdefault(trial.line, [])
            entry = {
                "change": trial.change,
                "holds": trial.holds,
                "failure": trial.failure,
                "max_abs_diff": trial.max_abs_diff,
                "site_bytes": [trial.site_bytes_before, trial.site_bytes_after],
                "moved_bytes": trial.moved_bytes,
            }
            if entry not in lines[trial.line]:
                lines[trial.line].append(entry)
    return {
        "model": report.model,
        "verdict": report.verdict.value,
        "extra_bytes": cost.extra_bytes,
        "verify_seconds": cost.verify_seconds,
        "sites_with_remedy": len(remedied),
        "status": dict(Counter(s.remedy.status.value for s in remedied)),
        "lead_notes": dict(Counter(s.remedy.note for s in remedied if s.remedy.note)),
        "lines_tried": lines,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="torchvision names, or timm:NAME")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--input-size", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = AuditSettings(
        input_size=None if args.input_size is None else parse_input_size(args.input_size),
        verify=True,
    )
    results = []
    for name in args.models:
        start = time.perf_counter()
        try:
            loaded = load_model(_ref(name), BuildOptions(skip_random_init=True))
            result = tried(audit_loaded(loaded, settings))
        except Exception as e:  # a model that fails is a row, as in a sweep
            result = {"model": name, "error": f"{type(e).__name__}: {e}"[:300]}
        result["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps({k: v for k, v in result.items() if k != "lines_tried"}), flush=True)
        results.append(result)
    status = Counter()
    for r in results:
        status.update(r.get("status", {}))
    summary = {"models": len(results), "sites_by_status": dict(status)}
    document = {"torch": torch.__version__, "summary": summary, "models": results}
    write_text(args.out, json.dumps(document, indent=1) + "\n", "--out")  # whole, by rename
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
