"""Measure, independently of cl-audit, how fast models run in channels_last against NCHW.

    python scripts/speed_truth.py --device cuda --train --amp fp16 --batch 64 \
        --models-file reports/speed/models_cuda.txt --out $OUT/speed-truth.jsonl
    python scripts/speed_truth.py --device cpu --batch 2 --models resnet18,tv:resnet50 --out F

One JSON line per model, written as each finishes (an error is a row that says so). For each
model: two copies (one ``Module.to(memory_format=torch.channels_last)`` with its input in
channels_last, one left NCHW), each warmed (``--warmup`` steps, then until three steps lie
within 10%; ``cudnn.benchmark`` on, so the first steps autotune), then ``--rounds`` rounds that
alternate the layouts (ABBA), each round ``--steps`` synchronised steps; per layout the median
round, and the quartiles of the round-by-round ratio NCHW / channels_last (> 1: channels_last
faster). Then one profiled step per layout: each aten operation's own time (device time on
CUDA, CPU time on the CPU) grouped by input shapes.
A training step is SGD (momentum 0.9) on cross-entropy of random labels (the sum of the
outputs where the output is not a (batch, classes) tensor), with fp16 autocast through a
gradient scaler, as cl-audit's step. Models: ``name`` (timm) or ``tv:name`` (torchvision),
random weights; with ``--size`` a timm model that takes ``img_size`` is built for that side.
With ``--compile`` each copy is run through ``torch.compile`` (``--compile-mode``) and
compiled by its first steps (until a step adds no Dynamo frame, at most four: their wall time
is ``compile_s``, kept out of the rounds) before the warm-up; the rest as above.
In a lane of ``scripts/quiet_lanes.py`` (``CL_AUDIT_QUIET_LANES`` set) the warm-up and the
rounds run with the other lanes stopped; elsewhere that changes nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from quiet_lanes import quiet  # a sibling script (imports nothing of cl-audit)

CL = torch.channels_last


def build(name: str, size: int | None) -> tuple[torch.nn.Module, tuple[int, int, int]]:
    if name.startswith("tv:"):
        import torchvision

        model = torchvision.models.get_model(name[3:], weights=None)
        return model, (3, size or 224, size or 224)

    model = timm_model(name, size)
    shape = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
    if size:
        shape = (shape[0], size, size)
    return model, shape


def timm_model(name: str, size: int | None) -> torch.nn.Module:
    """A timm model built for ``size`` where it takes an ``img_size`` (a vision transformer's
    position table made for that side), else as it is."""
    import timm

    if size:
        try:
            return timm.create_model(name, pretrained=False, img_size=size)
        except TypeError:  # a model without an img_size argument runs any side
            pass
    return timm.create_model(name, pretrained=False)


def loss_of(output: object, target: torch.Tensor) -> torch.Tensor:
    if isinstance(output, torch.Tensor) and output.dim() == 2:
        return F.cross_entropy(output.float(), target % output.shape[1])
    found = []

    def walk(v: object) -> None:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            found.append(v.float().sum())
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(output)
    return torch.stack(found).sum()


class Runner:
    """One layout's copy of the model, its input and its step."""

    def __init__(self, model, x, target, device, train, amp) -> None:
        self.model, self.x, self.target = model, x, target
        self.device, self.train, self.amp = device, train, amp
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        fp16 = amp == "fp16" and device == "cuda"
        self.scaler = torch.amp.GradScaler("cuda") if fp16 and train else None
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp or "")

    def step(self) -> None:
        with torch.autocast(self.device, dtype=self.dtype or torch.float32,
                            enabled=self.dtype is not None):  # fmt: skip
            if not self.train:
                with torch.no_grad():
                    self.model(self.x)
                return
            out = self.model(self.x)
        loss = loss_of(out, self.target)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()

    def timed(self, steps: int) -> float:
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync(self.device)
        return (time.perf_counter() - t0) / steps * 1e3


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def warm(r: Runner, least: int) -> int:
    times = []
    while len(times) < 30:
        times.append(r.timed(1))
        last = times[-3:]
        if len(times) >= least and len(last) == 3 and max(last) <= min(last) * 1.1:
            break
    return len(times)


def profile(r: Runner, device: str) -> list[dict]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        r.step()
        sync(device)
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:
            dev = getattr(e, "self_cuda_time_total", 0.0)
        own = float(dev) if device == "cuda" else float(e.self_cpu_time_total)
        if own <= 0 or not e.key.startswith("aten::"):
            continue
        rows.append({"op": e.key, "shapes": [list(s) for s in e.input_shapes or []],
                     "calls": e.count, "us": round(own, 2),
                     "cpu_us": round(float(e.self_cpu_time_total), 2)})  # fmt: skip
    return rows


def compile_runner(r: Runner, mode: str | None) -> float:
    """``r``'s model through torch.compile, compiled by its first steps: their seconds."""
    from torch._dynamo.utils import counters

    r.model = torch.compile(r.model, mode=mode)
    start = time.perf_counter()
    for index in range(4):
        frames = counters["frames"]["ok"]
        r.timed(1)
        if index and counters["frames"]["ok"] == frames:
            break
    return round(time.perf_counter() - start, 3)


def quartiles(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0]] * 3
    q = statistics.quantiles(values, n=4, method="inclusive")
    return [q[0], q[1], q[2]]


def measure(name: str, a: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    model, shape = build(name, a.size)
    model = model.to(a.device).train(a.train)
    x = torch.randn(a.batch, *shape, device=a.device)
    target = torch.randint(0, 1000, (a.batch,), device=a.device)
    runners = {
        "channels_last": Runner(copy.deepcopy(model).to(memory_format=CL),
                                x.contiguous(memory_format=CL), target, a.device, a.train,
                                a.amp),
        "nchw": Runner(model, x, target, a.device, a.train, a.amp),
    }  # fmt: skip
    compile_s = {k: compile_runner(r, a.compile_mode) for k, r in runners.items()} if (
        a.compile
    ) else None  # fmt: skip
    rounds: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners)
    with quiet("truth rounds"):  # other proof lanes stopped meanwhile (scripts/quiet_lanes.py)
        warmed = {k: warm(r, a.warmup) for k, r in runners.items()}
        for i in range(a.rounds):
            for k in order if i % 2 == 0 else order[::-1]:
                rounds[k].append(runners[k].timed(a.steps))
    ratios = [n / c for n, c in zip(rounds["nchw"], rounds["channels_last"], strict=True)]
    row = {
        "name": name,
        "status": "ok",
        "input_shape": [a.batch, *shape],
        "parameters": sum(p.numel() for p in model.parameters()),
        "warmup_steps": warmed,
        "rounds_ms": rounds,
        "median_ms": {k: statistics.median(v) for k, v in rounds.items()},
        "speedup": statistics.median(rounds["nchw"]) / statistics.median(rounds["channels_last"]),
        "ratio_quartiles": quartiles(ratios),
    }
    if compile_s is not None:
        row["compile_s"] = compile_s
    if a.profile:
        row["profile"] = {k: profile(r, a.device) for k, r in runners.items()}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--models", default="")
    p.add_argument("--models-file", type=Path)
    p.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=None, help="input side (default: the model's)")
    p.add_argument("--train", action="store_true")
    p.add_argument("--amp", choices=("fp16", "bf16"), default=None)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--budget-s", type=float, default=1e9, help="no model starts after this")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--compile", action="store_true", help="time torch.compile'd copies")
    p.add_argument("--compile-mode", default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.backends.cudnn.benchmark = True
    names = [n for n in a.models.split(",") if n]
    if a.models_file:
        names += [n.split("#")[0].strip() for n in a.models_file.read_text().splitlines()]
    names = [n for n in names if n]
    done = set()
    if a.out.exists():
        done = {json.loads(line)["name"] for line in a.out.read_text().splitlines() if line}
    settings = {k: v for k, v in vars(a).items() if k not in ("models", "models_file", "out")}
    start = time.monotonic()
    with open(a.out, "a", buffering=1) as out:
        for name in names:
            if name in done:
                continue
            if time.monotonic() - start > a.budget_s:
                print(f"budget spent: {name} and later not run", flush=True)
                break
            t0 = time.monotonic()
            try:
                row = measure(name, a)
            except Exception as e:
                first = str(e).splitlines()[0][:300] if str(e) else ""
                row = {
                    "name": name,
                    "status": "error",
                    "message": f"{type(e).__name__}: {first}" if first else type(e).__name__,
                    "where": traceback.format_exc().splitlines()[-3:],
                }
            row["seconds"] = round(time.monotonic() - t0, 2)
            row["settings"] = settings
            row["versions"] = {"torch": torch.__version__, "python": sys.version.split()[0]}
            if a.device == "cuda":
                row["versions"]["gpu"] = torch.cuda.get_device_name(0)
                row["versions"]["cudnn"] = torch.backends.cudnn.version()
                torch.cuda.empty_cache()
            out.write(json.dumps(row) + "\n")
            speed = f"{row['speedup']:.3f}x" if row["status"] == "ok" else row["message"]
            print(f"{name}: {speed} ({row['seconds']} s)", flush=True)


if __name__ == "__main__":
    main()
