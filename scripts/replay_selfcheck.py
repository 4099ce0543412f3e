"""The check of the replay (``--train --fake``): a training step replayed on fake CPU tensors
against the eager CPU training audit of the same model, settings and torch release.

The eager side is read from committed reports: ``reports/torchvision/cpu-train_torch-X.json.gz``
(the channels_last tier of torchvision) and the eagerly confirmed rows of
``reports/timm_torch-X_cpu_train_fake+eager.json.gz`` (timm models, the first ``--timm N`` of
them in name order among those that ran eagerly). The replay runs here, one thread as those ran.
A model agrees when its findings (kind, phase, operation, module, call site, count) and its
cost sites (kind, phase, operation, module, call site and channels_last-only bytes) are the
same. A disagreement is explained when it lies only in cost sites of kind ``kernel`` (copies
that the CPU kernels make inside, which the profiler measures eagerly and fake tensors cannot
see), or in the divergences the release's table lists; every other one is listed as is.

    python scripts/replay_selfcheck.py --timm 50 --out reports/replay-selfcheck_torch-2.14.1.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path
from typing import Any

import torch

from cl_audit.enums import ModelSource, TensorMode
from cl_audit.report import ModelReport, ModelRow, decode_document
from cl_audit.settings import AuditSettings
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.audit import audit_loaded

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


def compare(name: str, eager: ModelReport | ModelRow, replayed: ModelReport) -> dict[str, Any]:
    eager_f, replay_f = findings(eager), findings(replayed)
    eager_s, replay_s = sites(eager), sites(replayed)
    only_eager_sites = [s for s in eager_s if s not in replay_s]
    only_replay_sites = [s for s in replay_s if s not in eager_s]
    kernel_only = all(s[0] == "kernel" for s in only_eager_sites) and not only_replay_sites
    agree = eager_f == replay_f and eager_s == replay_s
    return {
        "model": name,
        "agree": agree,
        "findings_agree": eager_f == replay_f,
        "cause": None
        if agree
        else "kernel copies (eager profiler only)"
        if eager_f == replay_f and kernel_only
        else "other",
        "eager_verdict": eager.verdict.value if eager.verdict else None,
        "replay_verdict": replayed.verdict.value,
        "only_eager_findings": [f for f in eager_f if f not in replay_f],
        "only_replay_findings": [f for f in replay_f if f not in eager_f],
        "only_eager_sites": only_eager_sites,
        "only_replay_sites": only_replay_sites,
    }


def torchvision_eager(version: str) -> dict[str, ModelReport]:
    path = REPORTS / "torchvision" / f"cpu-train_torch-{version}.json.gz"
    documents = decode_document(path.read_bytes())["reports"]
    return {d["model"]: ModelReport.from_dict(d) for d in documents}


def timm_eager(version: str, count: int) -> dict[str, ModelRow]:
    path = REPORTS / f"timm_torch-{version}_cpu_train_fake+eager.json.gz"
    rows = json.loads(gzip.decompress(path.read_bytes()))["models"]
    eager = [r for r in rows if r["mode"] == "fake+eager" and r["status"] == "ok"]
    chosen = sorted(eager, key=lambda r: r["name"])[:count]
    return {r["name"]: ModelRow.from_dict(r) for r in chosen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timm", type=int, default=50, help="how many timm models")
    parser.add_argument("--out")
    args = parser.parse_args()
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
                replayed = audit_loaded(loaded, settings)
            except Exception as e:  # a row of the check, as a sweep would make it
                results.append({"model": f"{source.value}:{name}", "error": f"{e}"[:300]})
                print(f"{source.value}:{name:28s} error {e}"[:200], flush=True)
                continue
            result = compare(f"{source.value}:{name}", reference, replayed)
            result["seconds"] = round(time.perf_counter() - start, 1)
            results.append(result)
            print(
                f"{result['model']:36s} {result['seconds']:6.1f}s agree={result['agree']} "
                f"findings={result['findings_agree']} cause={result['cause']}",
                flush=True,
            )
    checked = [r for r in results if "error" not in r]
    summary = {
        "torch": torch.__version__,
        "models": len(results),
        "errors": len(results) - len(checked),
        "agree": sum(r["agree"] for r in checked),
        "findings_agree": sum(r["findings_agree"] for r in checked),
        "kernel_copies_only": sum(
            r["cause"] == "kernel copies (eager profiler only)" for r in checked
        ),
        "other": sum(r["cause"] == "other" for r in checked),
        "seconds": round(time.perf_counter() - start_all, 1),
    }
    print(json.dumps(summary))
    if args.out:
        Path(args.out).write_text(json.dumps({**summary, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
