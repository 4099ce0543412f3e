"""The check of the fake step (``--train --fake``): a training step on fake CPU tensors, its
backward run node by node, against the eager CPU training audit of the same model, settings and
torch release.

The eager side is read from committed reports: ``reports/torchvision/cpu-train_torch-X.json.gz``
(the channels_last tier of torchvision) and the eagerly confirmed rows of
``reports/timm_torch-X_cpu_train_fake+eager.json.gz`` (timm models, the first ``--timm N`` of
them in name order among those that ran eagerly). The fake step runs here, one thread as those
ran.
A model agrees when its findings (kind, phase, operation, module, call site, count) and its
cost sites (kind, phase, operation, module, call site and channels_last-only bytes) are the
same. Each disagreement gets a cause: copies inside CPU kernels only (cost sites of kind
``kernel`` that the profiler measures eagerly and fake tensors cannot see); fake tensors (the
same step on fake CPU tensors through torch's autograd engine gives exactly the node-by-node
findings and sites: the difference is the fake method's, not the backward's); else the
node-by-node backward, with what it adds or misses against torch's engine.

    python scripts/fake_step_selfcheck.py --timm 50 \
        --out reports/fake-step-selfcheck_torch-2.14.1.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from cl_audit.enums import ModelSource, TensorMode
from cl_audit.execution.plan import plan_run
from cl_audit.execution.settings import AuditSettings
from cl_audit.execution.tensors import TENSORS
from cl_audit.report import ModelReport, ModelRow, decode_document
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.source_audit import audit_loaded

REPORTS = Path(__file__).resolve().parents[1] / "reports"


def findings(report: ModelReport | ModelRow) -> list[tuple]:
    return sorted(
        (f.kind.value, f.phase.value, f.python_op, f.aten_op, f.module_path, f.call_site, f.count)
        for f in (*report.offenders, *report.regains)
    )


def sites(report: ModelReport | ModelRow) -> list[tuple]:
    cost = report.cost
    return sorted(
        (s.kind.value, s.phase.value, s.op, s.module_path, s.call_site, s.extra)
        for s in (cost.sites if cost is not None else ())
        if s.extra
    )


KERNEL_COPIES = "kernel copies (eager profiler only)"
FAKE_TENSORS = "fake tensors (torch's autograd engine on fake CPU tensors differs from eager alike)"
NODE_BY_NODE = "the node-by-node backward (differs from torch's engine on fake CPU tensors)"


def compare(
    name: str, eager: ModelReport | ModelRow, stepped: ModelReport, engine: ModelReport
) -> dict[str, Any]:
    """``stepped`` against ``eager``; ``engine`` (the same step on fake CPU tensors through
    torch's autograd engine) tells the fake method's differences from the backward's. Cost
    sites are compared where the eager row recorded a cost (the committed timm rows did not)."""
    eager_f, stepped_f, engine_f = findings(eager), findings(stepped), findings(engine)
    eager_s, stepped_s, engine_s = sites(eager), sites(stepped), sites(engine)
    return classify(
        {
            "model": name,
            "sites_compared": eager.cost is not None,
            "node_by_node_equals_engine": engine_f == stepped_f and engine_s == stepped_s,
            "only_stepped_vs_engine_findings": [f for f in stepped_f if f not in engine_f],
            "only_engine_vs_stepped_findings": [f for f in engine_f if f not in stepped_f],
            "only_stepped_vs_engine_sites": [s for s in stepped_s if s not in engine_s],
            "only_engine_vs_stepped_sites": [s for s in engine_s if s not in stepped_s],
            "eager_verdict": eager.verdict.value if eager.cost is not None else None,
            "stepped_verdict": stepped.verdict.value,
            "only_eager_findings": [f for f in eager_f if f not in stepped_f],
            "only_stepped_findings": [f for f in stepped_f if f not in eager_f],
            "only_eager_sites": [s for s in eager_s if s not in stepped_s],
            "only_stepped_sites": [s for s in stepped_s if s not in eager_s],
        }
    )


def classify(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with whether it agrees and, if not, the cause (module docstring)."""
    findings_agree = not (result["only_eager_findings"] or result["only_stepped_findings"])
    only_eager_sites, only_stepped_sites = result["only_eager_sites"], result["only_stepped_sites"]
    if not result["sites_compared"]:
        only_eager_sites = only_stepped_sites = []
    kernel_only = all(s[0] == "kernel" for s in only_eager_sites) and not only_stepped_sites
    agree = findings_agree and not only_eager_sites and not only_stepped_sites
    cause = None
    if not agree:
        cause = (
            KERNEL_COPIES
            if findings_agree and kernel_only
            else FAKE_TENSORS
            if result["node_by_node_equals_engine"]
            else NODE_BY_NODE
        )
    return {**result, "agree": agree, "findings_agree": findings_agree, "cause": cause}


def summary_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    checked = [r for r in results if "error" not in r]
    return {
        "models": len(results),
        "errors": len(results) - len(checked),
        "sites_compared": sum(r["sites_compared"] for r in checked),
        "agree": sum(r["agree"] for r in checked),
        "findings_agree": sum(r["findings_agree"] for r in checked),
        "kernel_copies_only": sum(r["cause"] == KERNEL_COPIES for r in checked),
        "fake_tensors": sum(r["cause"] == FAKE_TENSORS for r in checked),
        "node_by_node": sum(r["cause"] == NODE_BY_NODE for r in checked),
        "node_by_node_equals_engine": sum(r["node_by_node_equals_engine"] for r in checked),
    }


def breakdown(results: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """What the disagreements are made of: (kind, phase, operation) of the findings and cost
    sites that one side has and the other not, and in how many models, by cause."""
    found: dict[str, Counter[str]] = {}
    for result in results:
        if result.get("agree", True):
            continue
        seen = found.setdefault(result["cause"], Counter())
        keys = set()
        for side in ("only_eager_findings", "only_stepped_findings"):
            keys |= {f"{side[5:-9]} finding {f[0]} {f[1]} {f[2]}/{f[3]}" for f in result[side]}
        for side in ("only_eager_sites", "only_stepped_sites"):
            keys |= {f"{side[5:-6]} site {s[0]} {s[1]} {s[2]}" for s in result[side]}
        seen.update(keys)
    return {cause: dict(counts.most_common()) for cause, counts in found.items()}


def torchvision_eager(version: str) -> dict[str, ModelReport]:
    path = REPORTS / "torchvision" / f"cpu-train_torch-{version}.json.gz"
    documents = decode_document(path.read_bytes())["reports"]
    return {d["model"]: ModelReport.from_dict(d) for d in documents}


def timm_eager(version: str, count: int | None = None) -> dict[str, ModelRow]:
    path = REPORTS / f"timm_torch-{version}_cpu_train_fake+eager.json.gz"
    rows = json.loads(gzip.decompress(path.read_bytes()))["models"]
    eager = [r for r in rows if r["mode"] == "fake+eager" and r["status"] == "ok"]
    chosen = sorted(eager, key=lambda r: r["name"])[:count]
    return {r["name"]: ModelRow.from_dict(r) for r in chosen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timm", type=int, default=50, help="how many timm models")
    parser.add_argument("--out")
    parser.add_argument("--summarise", metavar="FILE", help="add the breakdown to a finished run")
    args = parser.parse_args()
    if args.summarise:  # classified again, by this script's rules
        done = json.loads(Path(args.summarise).read_text())
        version = done["torch"].split("+")[0]
        recorded = {
            f"torchvision:{name}": r.cost is not None
            for name, r in torchvision_eager(version).items()
        }
        recorded |= {f"timm:{name}": r.cost is not None for name, r in timm_eager(version).items()}
        results = [
            r
            if "error" in r
            else classify(
                {
                    **r,
                    "sites_compared": recorded[r["model"]],
                    "eager_verdict": r["eager_verdict"] if recorded[r["model"]] else None,
                }
            )
            for r in done["results"]
        ]
        document = {**done, **summary_of(results), "breakdown": breakdown(results)}
        Path(args.summarise).write_text(
            json.dumps({**document, "results": results}, indent=1) + "\n"
        )
        return
    version = torch.__version__.split("+")[0]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    results = []
    sources = [
        (ModelSource.TORCHVISION, torchvision_eager(version)),
        (ModelSource.TIMM, timm_eager(version, args.timm)),
    ]
    start_all = time.perf_counter()
    for source, eager in sources:
        for name, reference in eager.items():
            start = time.perf_counter()
            settings = AuditSettings(
                train=True,
                tensor_mode=TensorMode.FAKE,
                input_size=tuple(reference.input_shape[1:]) if reference.input_shape else None,
            )
            try:
                side = max(reference.input_shape[-2:]) if reference.input_shape else None
                options = BuildOptions(meta=True, max_input_size=side)  # built as it was audited
                loaded = load_model(ModelRef(source, name), options)
                stepped = audit_loaded(loaded, settings)
                plan = replace(plan_run(settings), tensors=TENSORS[TensorMode.FAKE])
                engine = audit_loaded(load_model(ModelRef(source, name), options), plan)
            except Exception as e:  # a row of the check, as a sweep would make it
                results.append({"model": f"{source.value}:{name}", "error": f"{e}"[:300]})
                print(f"{source.value}:{name:28s} error {e}"[:200], flush=True)
                continue
            result = compare(f"{source.value}:{name}", reference, stepped, engine)
            result["seconds"] = round(time.perf_counter() - start, 1)
            results.append(result)
            print(
                f"{result['model']:36s} {result['seconds']:6.1f}s agree={result['agree']} "
                f"findings={result['findings_agree']} cause={result['cause']}",
                flush=True,
            )
    summary = {
        "torch": torch.__version__,
        **summary_of(results),
        "seconds": round(time.perf_counter() - start_all, 1),
    }
    print(json.dumps(summary))
    if args.out:
        document = {**summary, "breakdown": breakdown(results), "results": results}
        Path(args.out).write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
