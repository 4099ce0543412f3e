"""Predicted against measured: how right cl-audit's speed prediction is.

    python scripts/validate_speed.py reports/speed/speed-truth-cpu.jsonl.gz --device cpu \
        --out reports/speed/validation_cpu.json
    python scripts/validate_speed.py TRUTH.jsonl.gz --device cuda --train --amp fp16 \
        --calibrate cspresnet50,resnet50,... --out reports/speed/validation_cuda.json

Each model measured by ``scripts/speed_truth.py`` (both layouts in alternating rounds, on the
machine the table describes) is audited here with the same input and settings, on fake tensors
(``--fake``: shapes only, as a user predicting for a device they lack), and its predicted
speedup (NCHW's step over channels_last's) set beside the measured one: the median of the
round-by-round ratios, as the audit's ``--time`` reports it (the ratio of the two layouts'
median rounds beside it, ``median_rounds_speedup``: it drifts when rounds do). The summary: for the
models whose measured speedup lies outside 0.95-1.05, how many the prediction gets the
direction of; the median of |predicted / measured - 1|; every miss with its classes.

``--calibrate NAMES`` first fits the table's host cost per operation and the share of the
kernels' time a step waits for (``host.step_us`` or ``host.forward_us``, ``host.overlap``) to
the measured steps of those models alone (least squares over both layouts), writes them into
the table with what they were fitted on, and validates on every model, calibration ones marked.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from cl_audit.enums import Amp, SpeedClass, TensorMode
from cl_audit.predict import speed_table
from cl_audit.run.audit_module import audit_module
from cl_audit.settings import AuditSettings

BAND = 0.05


def read_truth(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [r for r in map(json.loads, f) if r.get("status") == "ok"]


def build(name: str) -> torch.nn.Module:
    if name.startswith("tv:"):
        import torchvision

        return torchvision.models.get_model(name[3:], weights=None)
    import timm

    return timm.create_model(name, pretrained=False)


def predicted(row: dict, a: argparse.Namespace) -> dict:
    """The audit's predicted speed for the truth row's model, input and settings."""
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
    report = audit_module(build(row["name"]), (torch.randn(*shape),), settings, name=row["name"])
    speed = report.speed
    if speed is None or speed.speedup is None:
        return {"error": speed.note if speed else "no speed section"}
    cl, nchw = speed.channels_last, speed.nchw
    return {
        "speedup": speed.speedup,
        "verdict": speed.verdict.value,
        "channels_last": {"ms": cl.ms, "device_ms": cl.device_ms, "launches": cl.operations},
        "nchw": {"ms": nchw.ms, "device_ms": nchw.device_ms, "launches": nchw.operations},
        "classes": {c.speed_class.value: [c.channels_last_ms, c.nchw_ms] for c in speed.classes},
        "stand_ins": list(speed.stand_ins),
        "bytes_verdict": report.verdict.value,
        "byte_share": report.cost.share if report.cost else None,
    }


def calibrate(rows: list[dict], names: set[str], table_path: Path, train: bool) -> dict:
    """Fit step = launches * host + overlap * kernels on the named models' measured steps."""
    a, b = [], []
    for r in rows:
        if r["name"] in names and "error" not in r["predicted"]:
            for layout in ("channels_last", "nchw"):
                p = r["predicted"][layout]
                a.append([p["launches"], p["device_ms"]])
                b.append(r["median_ms"][layout])
    (host_ms, overlap), *_ = np.linalg.lstsq(np.array(a, float), np.array(b, float), rcond=None)
    data = json.loads(table_path.read_text())
    key = "step_us" if train else "forward_us"
    data.setdefault("host", {})
    data["host"][key] = round(float(host_ms) * 1e3, 3)
    data["host"]["overlap"] = round(float(overlap), 4)
    data["host"]["basis"] = (
        f"{key} and overlap fitted (least squares, both layouts) to the measured steps of "
        f"{', '.join(sorted(names))} (scripts/validate_speed.py --calibrate)"
    )
    tmp = table_path.with_name(table_path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=0, separators=(",", ":")) + "\n")
    tmp.replace(table_path)
    speed_table.tables.cache_clear()
    return data["host"]


def summarise(rows: list[dict]) -> dict:
    judged = [r for r in rows if "error" not in r["predicted"]]
    outside = [r for r in judged if abs(r["speedup"] - 1) > BAND]
    right = [r for r in outside if (r["predicted"]["speedup"] > 1) == (r["speedup"] > 1)]
    errors = [abs(r["predicted"]["speedup"] / r["speedup"] - 1) for r in judged]
    return {
        "models": len(rows),
        "predicted": len(judged),
        "outside_band": len(outside),
        "direction_right": len(right),
        "direction_share": round(len(right) / len(outside), 4) if outside else None,
        "median_abs_error": round(statistics.median(errors), 4) if errors else None,
        "misses": [r["name"] for r in outside if r not in right],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("truth", type=Path, help="scripts/speed_truth.py's JSON lines")
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--train", action="store_true")
    p.add_argument("--amp", choices=("fp16", "bf16"), default=None)
    p.add_argument("--calibrate", default="", help="fit the table's host costs on these models")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    truth = read_truth(a.truth)
    rows = []
    for r in truth:
        try:
            guess = predicted(r, a)
        except Exception as e:  # a model this torch cannot fake is a row that says so
            guess = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        rows.append({"name": r["name"], "input_shape": r["input_shape"],
                     "speedup": r["ratio_quartiles"][1], "quartiles": r["ratio_quartiles"],
                     "median_rounds_speedup": r["speedup"], "median_ms": r["median_ms"],
                     "predicted": guess})  # fmt: skip
        print(f"{r['name']}: measured {rows[-1]['speedup']:.3f}, predicted "
              f"{guess.get('speedup', float('nan')):.3f}", file=sys.stderr, flush=True)  # fmt: skip
    calibration = None
    names = {n for n in a.calibrate.split(",") if n}
    if names:
        table = speed_table.table_for(a.device)
        path = Path(speed_table.__file__).parent / "tables" / f"{table.name}.json"
        calibration = calibrate(rows, names, path, a.train)
        rows = [
            dict(r, predicted=predicted(next(t for t in truth if t["name"] == r["name"]), a))
            for r in rows
        ]
    for r in rows:
        r["calibration"] = r["name"] in names
    held_out = [r for r in rows if not r["calibration"]]
    result = {
        "truth": str(a.truth),
        "device": a.device,
        "train": a.train,
        "amp": a.amp,
        "band": BAND,
        "table": speed_table.table_for(a.device).name,
        "calibration": calibration,
        "summary": summarise(rows),
        "summary_held_out": summarise(held_out) if names else None,
        "classes": [c.value for c in SpeedClass],
        "rows": rows,
    }
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    if names:
        print("held out:", json.dumps(result["summary_held_out"], indent=1))


if __name__ == "__main__":
    main()
