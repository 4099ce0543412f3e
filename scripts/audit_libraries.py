"""Audit the popular-libraries tier: models as people have them in Ultralytics, diffusers,
segmentation_models_pytorch, MONAI, transformers, kornia and pytorchcv
(``examples/libraries.py``, each with its own example input), random weights, no download. Per
model: eager CPU inference (the remedies of its cost sites tried in what-if runs), an eager CPU
training step, and fake CUDA inference with fp16 autocast (a prediction). Every report goes to
one JSON file (written whole, by rename) and the Markdown table of reports/pages/libraries.md to
stdout: per model and configuration the verdict and the channels_last-only cost against NCHW,
and the top cost sites with their fix site and remedy (and whether it was verified).

    pip install -e '.[libraries]'
    python scripts/audit_libraries.py --out reports/libraries_torch-2.14.1_cpu.json.gz
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from cl_audit.execution.settings import Amp, AuditSettings, TensorMode
from cl_audit.fake.cuda_probe import fake_cuda_problem
from cl_audit.phases.audit_module import audit_module
from cl_audit.report import ModelReport
from cl_audit.report.files import write_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import libraries

CONFIGURATIONS = {
    "inference": AuditSettings(verify=True),
    "training": AuditSettings(train=True),
    "fake-cuda-fp16": AuditSettings(device="cuda", tensor_mode=TensorMode.FAKE, amp=Amp.FP16),
}


def _row(name: str, configuration: str, report: ModelReport, seconds: float) -> dict:
    cost = report.cost
    groups: dict[tuple, dict] = {}
    for site in cost.sites if cost is not None else ():
        if not site.extra:
            continue
        key = (site.op, site.call_site)
        entry = groups.setdefault(key, {
            "op": site.op, "call_site": site.call_site, "kind": site.kind.value, "extra": 0,
            "fix_site": None if site.fix_site is None else
            f"{site.fix_site.python_op or site.fix_site.aten_op} {site.fix_site.call_site}",
            "remedy": None if site.remedy is None else site.remedy.pattern,
            "remedy_status": None if site.remedy is None else site.remedy.status.value,
        })  # fmt: skip
        entry["extra"] += site.extra
    top = sorted(groups.values(), key=lambda s: -s["extra"])[:3]
    return {
        "model": name,
        "configuration": configuration,
        "status": "ok",
        "verdict": report.verdict.value,
        "extra_bytes": None if cost is None else cost.extra_bytes,
        "saved_bytes": None if cost is None else cost.saved_bytes,
        "share": None if cost is None else cost.share,
        "offenders": len(report.offenders),
        "input_shape": list(report.input_shape or ()),
        "top_sites": top,
        "seconds": round(seconds, 1),
        "report": report.to_dict(),
    }


def _cell(row: dict) -> str:
    if row["status"] != "ok":
        return row["status"]
    if not row["extra_bytes"]:
        return row["verdict"]
    return f"{row['verdict']} ({row['extra_bytes'] / 2**20:.1f} MiB, {row['share']:.1%})"


def table(rows: list[dict]) -> str:
    """The Markdown table of reports/pages/libraries.md: per model, each configuration's verdict and
    channels_last-only cost, and the top sites (inference, else training) with fix site and
    remedy."""
    lines = [
        "| model | input | inference | training step | fake CUDA fp16 | top cost sites "
        "(inference, else training): fix site; remedy |",
        "|---|---|---|---|---|---|",
    ]
    by_model: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_model.setdefault(row["model"], {})[row["configuration"]] = row
    for model, runs in by_model.items():
        first = runs.get("inference", {})
        shape = "x".join(map(str, first.get("input_shape", [])))
        source = runs["inference"] if runs["inference"].get("top_sites") else runs["training"]
        sites = "; ".join(
            f"`{s['op']}` {s['call_site']} ({s['extra'] / 2**20:.1f} MiB"
            + (f", from `{s['fix_site']}`" if s["fix_site"] else "")
            + f"): {s['remedy'] or 'no known remedy'}"
            + (f" ({s['remedy_status']})" if s.get("remedy_status") else "")
            for s in source.get("top_sites", [])[:2]
        )
        cells = [_cell(runs[c]) for c in CONFIGURATIONS]
        lines.append(f"| {model} | {shape} | {' | '.join(cells)} | {sites or '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("models", nargs="*", default=list(libraries.ALL))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.models:
        for configuration, settings in CONFIGURATIONS.items():
            start = time.perf_counter()
            if settings.tensor_mode is TensorMode.FAKE and fake_cuda_problem() is not None:
                rows.append({"model": name, "configuration": configuration,
                             "status": "skipped", "message": fake_cuda_problem()})  # fmt: skip
                continue
            try:
                torch.manual_seed(0)
                model, example = getattr(libraries, name)()
                report = audit_module(model, example, settings, name=name)
                row = _row(name, configuration, report, time.perf_counter() - start)
            except Exception as e:  # a model that fails is a row, not the end of the run
                row = {"model": name, "configuration": configuration, "status": "error",
                       "message": f"{type(e).__name__}: {e}"[:300]}  # fmt: skip
            rows.append(row)
            print(f"{name:20s} {configuration:15s} {_cell(row)}", flush=True)
    document = {"format": "cl-audit.libraries", "version": 1, "torch": torch.__version__,
                "rows": rows}  # fmt: skip
    write_text(args.out, json.dumps(document, indent=1) + "\n", "--out")  # whole or not at all
    print(table(rows))


if __name__ == "__main__":
    main()
