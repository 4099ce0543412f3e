"""Audit, on CPU, the torchvision models that PyTorch's memory-format tutorial lists as fully
supporting channels_last, plus a few that are known not to; write every report to one file.

    python scripts/audit_torchvision.py --out reports/torchvision/cpu_torch-X.Y.Z.json.gz
    python scripts/audit_torchvision.py --train \
        --out reports/torchvision/cpu-train_torch-X.Y.Z.json.gz

X.Y.Z is the torch release: the slow test tier compares with the file of the running release.
One thread, as the tests and sweep workers run: the CPU convolution backward copies inside
with two threads where it does not with one (mobilenet_v2's training step: 8.4 MiB against
0.26 MiB), so verdicts are per thread count.
``--table FILE`` prints the Markdown table of reports/pages/torchvision-tier.md from such a file
instead: per model the verdict, the channels_last-only cost against NCHW, and the costliest site
with its fix site and remedy.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cl_audit.execution.settings import AuditSettings, Engine
from cl_audit.report import ModelReport, ModelSource, decode_document, encode_document
from cl_audit.sources import ModelRef, load_model
from cl_audit.sources.source_audit import audit_loaded
from cl_audit.sources.torchvision_models import CHANNELS_LAST_TIER

REPORTS_FORMAT = "cl-audit.reports"


def table(path: str) -> str:
    """The verdicts of a committed file as Markdown, offending first."""
    with open(path, "rb") as f:
        reports = [ModelReport.from_dict(r) for r in decode_document(f.read())["reports"]]
    lines = [
        "| model | verdict | channels_last only | share | saved | costliest site: fix site; "
        "remedy |",
        "|---|---|---|---|---|---|",
    ]
    order = {"offending": 0, "minor": 1, "clean": 2}
    for report in sorted(reports, key=lambda r: (order[r.verdict.value], r.model or "")):
        cost = report.cost
        if cost is None:
            continue
        sites = [site for site in cost.sites if site.extra]
        where = "-"
        if sites:
            top = max(sites, key=lambda site: site.extra)
            fix = top.fix_site
            where = (
                f"`{top.op}` ({top.kind.value}, {top.phase.value}) at `{top.call_site}`"
                + (f", from `{fix.python_op or fix.aten_op}` at `{fix.call_site}`" if fix else "")
                + f"; {top.remedy.pattern if top.remedy else 'no known remedy'}"
            )
        lines.append(
            f"| {report.model} | {report.verdict.value} | {cost.extra_bytes / 2**20:.2f} MiB | "
            f"{cost.share:.2%} | {cost.saved_bytes / 2**20:.2f} MiB | {where} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", metavar="FILE", help="print the Markdown table of FILE")
    parser.add_argument("--out")
    parser.add_argument("--engine", default="dispatch", choices=["dispatch", "patch"])
    parser.add_argument("--train", action="store_true", help="audit one SGD training step")
    parser.add_argument("models", nargs="*", default=list(CHANNELS_LAST_TIER))
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    if not args.out:
        parser.error("--out is required to audit")
    torch.manual_seed(0)
    torch.set_num_threads(1)  # as the test tiers and sweep workers: kernels take other paths
    reports = []
    for name in args.models:
        start = time.perf_counter()
        loaded = load_model(ModelRef(ModelSource.TORCHVISION, name))
        settings = AuditSettings(engine=Engine(args.engine), train=args.train)
        report = audit_loaded(loaded, settings)
        s = report.summary
        print(
            f"{name:22s} {time.perf_counter() - start:6.1f}s  losses {s.losses:3d} "
            f"(round trips {s.round_trips}, terminal {s.terminal_conversions}) "
            f"ops {sorted({f.op for f in report.offenders})}",
            flush=True,
        )
        reports.append(report.to_dict())
    text = json.dumps({"format": REPORTS_FORMAT, "version": 3, "reports": reports}, indent=1)
    with open(args.out, "wb") as f:  # gzip-compressed when the path ends in .gz
        f.write(encode_document(text + "\n", args.out.endswith(".gz")))


if __name__ == "__main__":
    main()
