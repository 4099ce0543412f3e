"""Predicted against measured: how right cl-audit's speed prediction is, table by table.

    python scripts/validate_speed.py reports/speed/speed-truth-cpu.jsonl.gz --device cpu \
        --table cpu-amd-epyc-2c2t_torch-2.14.1_onednn-3.12.0 --table shipped.json \
        --out reports/speed/validation_cpu.json
    python scripts/validate_speed.py TRUTH.jsonl.gz --device cuda --train --amp fp16 \
        --out reports/speed/validation_cuda.json

Each model measured by ``scripts/speed_truth.py`` (both layouts in alternating rounds, on the
machine a table describes) is audited here once with the same input and settings, on fake
tensors (``--fake``: shapes only, as a user predicting for a device they lack), and each
table (``--table NAME|FILE``, repeatable; none: the one an audit here would pick) prices the
two runs' operations: the predicted speedup (NCHW's step over channels_last's) is set beside
the measured one, the median of the round-by-round ratios as the audit's ``--time`` reports
it (the ratio of the two layouts' median rounds beside it, ``median_rounds_speedup``). The
summary per table: for the models whose measured speedup lies outside 0.95-1.05, how many it
gets the direction of; the median of |predicted / measured - 1|; every miss. Nothing is
fitted: the tables' host costs are their own measurements.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

import torch

from cl_audit.enums import Amp, TensorMode
from cl_audit.execution.settings import AuditSettings
from cl_audit.phases.audit_module import operations
from cl_audit.phases.speed import predict_speed
from cl_audit.phases.timed import profiled_class
from cl_audit.predict.table_store import choose, this_machine

BAND = 0.05


def read_truth(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [r for r in map(json.loads, f) if r.get("status") == "ok"]


def build(name: str, size: int) -> torch.nn.Module:
    """The model as ``speed_truth.py`` built it (a timm model for ``size`` where it can)."""
    if name.startswith("tv:"):
        import torchvision

        return torchvision.models.get_model(name[3:], weights=None)
    from speed_truth import timm_model

    return timm_model(name, size)


def predicted(row: dict, a: argparse.Namespace, tables: list) -> dict[str, dict]:
    """Each table's predicted speed for the truth row's model, input and settings."""
    shape = row["input_shape"]
    settings = AuditSettings(
        device=a.device,
        tensor_mode=TensorMode.FAKE,
        train=a.train,
        amp=Amp(a.amp) if a.amp else None,
        batch_size=shape[0],
        input_size=tuple(shape[1:]),
        verify=False,
    )
    torch.manual_seed(0)
    model = build(row["name"], shape[-1])
    cl, nchw = operations(model, (torch.randn(*shape),), settings)
    found = {}
    for choice in tables:
        speed = predict_speed(cl, nchw, choice, settings.compute_dtype, a.train, BAND)
        if speed.speedup is None:
            found[choice.table.name] = {"error": speed.note}
            continue
        c, n = speed.channels_last, speed.nchw
        found[choice.table.name] = {
            "speedup": speed.speedup,
            "verdict": speed.verdict.value,
            "channels_last": {"ms": c.ms, "device_ms": c.device_ms, "host_ms": c.host_ms},
            "nchw": {"ms": n.ms, "device_ms": n.device_ms, "host_ms": n.host_ms},
            "classes": {
                k.speed_class.value: [k.channels_last_ms, k.nchw_ms] for k in speed.classes
            },
            "stand_ins": list(speed.stand_ins),
        }
    return found


def measured_classes(truth: dict) -> dict[str, list[float]]:
    """The measured profile's milliseconds by class in each layout (each operation's own
    time, classed as the audit's ``--time`` classes it)."""
    found: dict[str, list[float]] = {}
    for i, layout in enumerate(("channels_last", "nchw")):
        for r in truth.get("profile", {}).get(layout, []):
            if r["op"].startswith("aten::"):
                cls = profiled_class(r["op"]).value
                found.setdefault(cls, [0.0, 0.0])[i] += r["us"] / 1e3
    return found


def cause(row: dict, table: str) -> str:
    """The class whose channels_last-minus-NCHW time the prediction gets most wrong against the
    measured profile (the convolutions' gradients as one class, as the profiler holds them)."""
    merged = {"convolution input gradient": "convolution gradients",
              "convolution weight gradient": "convolution gradients"}  # fmt: skip
    predicted: dict[str, list[float]] = {}
    for cls, times in row["predicted"][table]["classes"].items():
        both = predicted.setdefault(merged.get(cls, cls), [0.0, 0.0])
        both[0] += times[0]
        both[1] += times[1]
    measured = row["measured_classes"]
    worst, gap = "", 0.0
    for cls in set(predicted) | set(measured):
        p = predicted.get(cls, [0.0, 0.0])
        m = measured.get(cls, [0.0, 0.0])
        wrong = (p[0] - p[1]) - (m[0] - m[1])
        if abs(wrong) > abs(gap):
            worst, gap = cls, wrong
    p, m = predicted.get(worst, [0.0, 0.0]), measured.get(worst, [0.0, 0.0])
    return (f"{worst}: channels_last minus NCHW predicted {p[0] - p[1]:+.2f} ms, measured "
            f"{m[0] - m[1]:+.2f} ms (the profiled step's own times)")  # fmt: skip


def summarise(rows: list[dict], table: str) -> dict:
    judged = [r for r in rows if "error" not in r["predicted"].get(table, {"error": 1})]
    outside = [r for r in judged if abs(r["speedup"] - 1) > BAND]

    def guess(r: dict) -> float:
        return r["predicted"][table]["speedup"]

    right = [r for r in outside if (guess(r) > 1) == (r["speedup"] > 1)]
    errors = [abs(guess(r) / r["speedup"] - 1) for r in judged]
    return {
        "models": len(rows),
        "predicted": len(judged),
        "outside_band": len(outside),
        "direction_right": len(right),
        "direction_share": round(len(right) / len(outside), 4) if outside else None,
        "median_abs_error": round(statistics.median(errors), 4) if errors else None,
        "p90_abs_error": (
            round(statistics.quantiles(errors, n=10)[-1], 4) if len(errors) > 1 else None
        ),
        "misses": [
            {"name": r["name"], "measured": round(r["speedup"], 3), "predicted": round(guess(r), 3),
             "cause": cause(r, table)}
            for r in outside if r not in right
        ],
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("truth", type=Path, help="scripts/speed_truth.py's JSON lines")
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--train", action="store_true")
    p.add_argument("--amp", choices=("fp16", "bf16"), default=None)
    p.add_argument("--table", action="append", default=[], help="a table's name or file")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    here = this_machine(a.device)
    dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(a.amp or "", "float32")
    tables = [choose(a.device, dtype, t, here) for t in a.table or [None]]
    rows = []
    for r in read_truth(a.truth):
        try:
            guess = predicted(r, a, tables)
        except Exception as e:  # a model this torch cannot fake is a row that says so
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            guess = {t.table.name: {"error": why} for t in tables}
        rows.append({"name": r["name"], "input_shape": r["input_shape"],
                     "speedup": r["ratio_quartiles"][1], "quartiles": r["ratio_quartiles"],
                     "median_rounds_speedup": r["speedup"], "median_ms": r["median_ms"],
                     "measured_classes": measured_classes(r), "predicted": guess})  # fmt: skip
        said = ", ".join(f"{g.get('speedup', float('nan')):.3f}" for g in guess.values())
        print(f"{r['name']}: measured {rows[-1]['speedup']:.3f}, predicted {said}",
              file=sys.stderr, flush=True)  # fmt: skip
    result = {
        "truth": str(a.truth),
        "device": a.device,
        "train": a.train,
        "amp": a.amp,
        "band": BAND,
        "tables": {
            t.table.name: {
                "source": t.table.source,
                "match": t.use.match.value,
                "label": t.use.label,
            }
            for t in tables
        },
        "summary": {t.table.name: summarise(rows, t.table.name) for t in tables},
        "rows": rows,
    }
    tmp = a.out.with_name(a.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(a.out)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
