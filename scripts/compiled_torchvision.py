"""Inductor's layout decision for every torchvision model, predicted for CUDA without a GPU
(``cl_audit.compiled_layouts``), for inference and for a training step: per graph on or off,
the heuristic's branch, the convolutions that vetoed it, and the layout copies Inductor's
lowering inserts under the decision and under ``force_layout_optimization`` (the CPU's
lowering under the CUDA decision: a prediction). By default one model per builder module (the
first in name order: a rule, not a choice); ``--all`` for every model (a capture takes up to a
few minutes for the largest on a 2-core machine).

    python scripts/compiled_torchvision.py --out reports/compiled/torchvision_cuda_torch-X.json
    python scripts/compiled_torchvision.py --table reports/compiled/torchvision_cuda_torch-X.json
    python scripts/compiled_torchvision.py --copies A.json B.json   # the copies, release by release

Models are built with zero-filled weights (no random draws) at their documented input size,
batch 2, converted to channels_last, and given the input they take (detection models a list
of images, with targets for training; optical flow a pair of images); nothing runs (fake
copies are traced) unless the model's shapes depend on its values (a detection model's
``nonzero``): then the graphs are traced on real CPU tensors, and the row names the operation
(``inference_data_dependent``, ``training_data_dependent``). Graphs are traced on fake CPU
tensors (autograd's engine needs a device for a CUDA backward) and decided as for a GPU.
``--table`` prints the Markdown summary that reports/pages/compiled.md quotes; ``--copies`` the
predicted layout copies of the models that have any, one column per graph and release.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from cl_audit.compiled.graphs import compiled_layouts
from cl_audit.enums import ModelSource, Strategy
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.execution.convert import apply_strategy
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.torchvision_models import names


def _graphs(compiled: object) -> list[dict[str, object]]:
    return [
        {
            "phase": g.phase.value,
            "inference": g.inference,
            "layout_optimization": g.layout_optimization,
            "branch": g.branch.value,
            "reason": g.reason,
            "convolutions": len(g.convolutions),
            "forced": g.forced,
            "copies": _copies(g.conversions),
            "forced_copies": _copies(g.forced_conversions),
            "lowering_error": g.lowering_error,
            "deciding": [
                {"call_site": c.call_site, "module_path": c.module_path, "class": c.kind.value}
                for c in g.deciding
            ],
        }
        for g in compiled.graphs
    ]


def _copies(copies: object) -> dict[str, object] | None:
    """How many layout copies, their bytes, and the largest's site and consumer."""
    if copies is None:
        return None
    largest = copies[0] if copies else None
    return {
        "count": len(copies),
        "bytes": sum(c.bytes for c in copies),
        "largest": None
        if largest is None
        else {
            "call_site": largest.call_site,
            "consumer": largest.consumer,
            "consumer_site": largest.consumer_site,
            "kind": largest.kind.value,
            "bytes": largest.bytes,
        },
    }


def one_per_module() -> list[str]:
    """The first model name, in name order, of each torchvision builder module (resnet,
    mobilenetv3, regnet, ...): one model per family, by a rule."""
    import torchvision

    first: dict[str, str] = {}
    for name in names():
        module = torchvision.models.get_model_builder(name).__module__
        first.setdefault(module, name)
    return sorted(first.values())


def measure(out: str, models: list[str]) -> None:
    """Every model's decisions into ``out``, written after each; the models already in
    ``out`` (an interrupted run's) are kept, not made again."""
    rows: list[dict[str, object]] = []
    if os.path.exists(out):
        with open(out) as f:
            rows = [r for r in json.load(f)["models"] if r["model"] in models]
    done = {r["model"] for r in rows}
    for name in (m for m in models if m not in done):
        # Dynamo's per-code-object recompile limit counts every earlier model's captures of
        # shared code (the R-CNNs share their forward): without a reset a later model runs
        # eagerly and captures no graph
        torch.compiler.reset()
        row: dict[str, object] = {"model": name}
        try:
            ref = ModelRef(ModelSource.TORCHVISION, name)
            loaded = load_model(ref, BuildOptions(skip_random_init=True))
        except (UsageError, ModelFailedError) as e:
            print(f"{name}: skipped ({e})", flush=True)
            continue
        model = apply_strategy(loaded.module, Strategy.CHANNELS_LAST)  # 5D: channels_last_3d
        x = torch.zeros(2, *loaded.input_shape)
        for mode, train in (("inference", False), ("training", True)):
            start = time.perf_counter()
            example = loaded.arguments(x, train) if loaded.arguments else x
            try:
                compiled = compiled_layouts(model, example, device="cuda", train=train, force=True)
                row[mode] = _graphs(compiled)
                row[f"{mode}_data_dependent"] = compiled.data_dependent
            except Exception as e:  # a row of its own: the table says which model failed
                row[mode] = {"error": f"{type(e).__name__}: {e}"[:300]}
            row[f"{mode}_seconds"] = round(time.perf_counter() - start, 2)
        rows.append(row)
        print(name, {m: _summary(row[m]) for m in ("inference", "training")}, flush=True)
        document = {
            "torch": torch.__version__,
            "device": "cuda (predicted without a GPU)",
            "models": rows,
        }
        with open(out, "w") as f:  # after every model: an interrupted run keeps what it made
            json.dump(document, f, indent=1)
            f.write("\n")


def _summary(graphs: object) -> str:
    if isinstance(graphs, dict):
        return "error"
    return " / ".join(
        f"{g['phase']} {'on' if g['layout_optimization'] else 'off'} ({g['branch']})"
        for g in graphs
    )


_COLUMNS = (("inference", "forward"), ("training", "forward"), ("training", "backward"))


def table(path: str) -> str:
    """Per model: each graph's decision and branch with its predicted layout copies (and the
    copies under Inductor's force switch where forcing changes the decision), and the first
    vetoing convolution; "(real values)" marks a model traced on real tensors."""
    with open(path) as f:
        document = json.load(f)
    lines = [
        "| model | inference | training forward | training backward | first vetoing convolution |",
        "|---|---|---|---|---|",
    ]
    for row in sorted(document["models"], key=lambda r: r["model"]):
        cells, vetoes = [], []
        for mode, phase in _COLUMNS:
            graphs = row[mode]
            if isinstance(graphs, dict):
                cells.append("error")
                continue
            chosen = [g for g in graphs if g["phase"] == phase]
            cells.append(_cells(chosen))
            vetoes += [
                f"{c['call_site']} ({c['module_path']}, {c['class']})"
                for g in chosen
                if not g["layout_optimization"]
                for c in g["deciding"][:1]
            ]
        real = any(row.get(f"{mode}_data_dependent") for mode in ("inference", "training"))
        name = f"{row['model']} (real values)" if real else row["model"]
        lines.append(f"| {name} | {' | '.join(cells)} | {vetoes[0] if vetoes else ''} |")
    return "\n".join(lines)


def _cells(graphs: list[dict[str, object]]) -> str:
    """A phase's graphs; where a model's graph breaks make several, the graphs with neither a
    convolution nor a layout copy are counted ("+N other graphs"), not listed."""
    if len(graphs) <= 1:
        return ", ".join(_cell(g) for g in graphs) or "-"
    shown = [g for g in graphs if g["convolutions"] or _copied(g)]
    rest = len(graphs) - len(shown)
    more = f"+{rest} other graph{'s' if rest > 1 else ''}"
    return ", ".join([_cell(g) for g in shown] + ([more] if rest else []))


def _cell(graph: dict[str, object]) -> str:
    """``**off** (grouped); 12 copies, 3.1 MB; forced: 0`` (decimal megabytes)."""
    on = graph["layout_optimization"]
    cell = f"{'on' if on else '**off**'} ({graph['branch']})"
    copies, forced = graph.get("copies"), graph.get("forced_copies")
    if copies is None:
        return cell + ("; not lowered" if "copies" in graph else "")
    count = copies["count"]
    cell += f"; {count} {'copy' if count == 1 else 'copies'}"
    if count:
        cell += f", {copies['bytes'] / 1e6:.1f} MB"
    if forced is not None and graph.get("forced") != on:
        cell += f"; forced: {forced['count']}"
    return cell


def copies_table(paths: list[str]) -> str:
    """Per model with any predicted copy: each graph's copies (count and MB) per release, and
    under the force switch where forcing changes the decision."""
    documents = []
    for path in paths:
        with open(path) as f:
            documents.append(json.load(f))
    columns = [(d, mode, phase) for d in documents for mode, phase in _COLUMNS]
    header = " | ".join(f"{mode} {phase}, {d['torch'].split('+')[0]}" for d, mode, phase in columns)
    lines = [f"| model | {header} |", "|---" * (len(columns) + 1) + "|"]
    by_name = [{r["model"]: r for r in d["models"]} for d in documents]
    for name in sorted(by_name[0]):
        graphs = []
        for d, mode, phase in columns:
            found = by_name[documents.index(d)][name][mode]
            graphs.append(
                [] if isinstance(found, dict) else [g for g in found if g["phase"] == phase]
            )
        if not any(_copied(g) for chosen in graphs for g in chosen):
            continue
        cells = [", ".join(_copies_cell(g) for g in chosen) or "-" for chosen in graphs]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _copied(graph: dict[str, object]) -> bool:
    return any((graph.get(k) or {}).get("count") for k in ("copies", "forced_copies"))


def _copies_cell(graph: dict[str, object]) -> str:
    copies, forced = graph.get("copies"), graph.get("forced_copies")
    if copies is None:
        return "not lowered"
    cell = str(copies["count"]) + (f" ({copies['bytes'] / 1e6:.1f} MB)" if copies["count"] else "")
    if forced is not None and graph.get("forced") != graph["layout_optimization"]:
        cell += f"; forced {forced['count']}"
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--table", help="print the Markdown table of such a file")
    parser.add_argument("--copies", nargs="+", help="print the copies table of such files")
    parser.add_argument(
        "--all", action="store_true", help="every model (default: one per builder module)"
    )
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
    elif args.copies:
        print(copies_table(args.copies))
    elif args.out:
        measure(args.out, names() if args.all else one_per_module())
    else:
        parser.error("give --out or --table")


if __name__ == "__main__":
    main()
