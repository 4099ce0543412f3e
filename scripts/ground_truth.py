"""An independent check of what channels_last costs a model against NCHW, sharing no code with
cl-audit: the profiler's copies counted in both formats, compared call site by call site.

    python scripts/ground_truth.py --out reports/ground-truth/timm_torch-2.14.1.json
    python scripts/ground_truth.py --out /tmp/gt.json resnet50 nf_resnet26   # named models
    python scripts/ground_truth.py --compare GT.json INFERENCE_SWEEP.json.gz TRAINING_SWEEP.json.gz

Method, per model and mode (an inference forward under no_grad, or a training step: forward in
train mode, cross-entropy against random labels of classifier logits or the sum of the
output, backward, an SGD step with momentum), eager CPU, float32, batch 2, one thread:
- run it once in NCHW and once after ``model.to(memory_format=torch.channels_last)`` with a
  channels_last input, each after one unprofiled warm-up step, under ``torch.profiler`` with
  shapes and stacks; every ``aten::copy_`` is a copy, the ones inside kernels included
  (``convolution_backward > contiguous``, ``layer_norm > contiguous``...), except a
  broadcast fill (a copy right after an ``aten::expand`` under the same operation: ``addmm``
  writing its bias into its output); its bytes are the destination's elements times their
  size;
- a copy's site is its outermost aten operation, the innermost module instance and the first
  stack frame outside torch (the model's function), or in a backward the autograd node that
  ran it and the module and function of the forward operation that made the node (the
  profiler's sequence numbers link the two);
- channels_last-only bytes = the sum over sites of max(0, CL bytes - NCHW bytes); saved bytes
  the reverse; the denominator is the bytes written by every aten operation of the
  channels_last step (its new outputs' sizes, views excluded, in-place outputs included,
  counted by a dispatch mode in a separate run);
- the verdict: ``offending`` when the channels_last-only bytes are at least 1% of the bytes
  written and at least 1 MiB, ``minor`` when there are some, ``clean`` when there are none.

The sample (``--sample N``, default 40): timm models in the order of the SHA-1 of their names,
keeping those whose default input side is at most 256 px and whose parameters number at most
30M (counted on the meta device), until N are kept. Nothing is hand-picked.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

GATE_SHARE = 0.01
GATE_BYTES = 1 << 20
MAX_SIDE = 256
MAX_PARAMETERS = 30_000_000
_SIZES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4}


class _BytesWritten(TorchDispatchMode):
    """Sums the bytes every aten operation writes: the tensors it returns in storage none of
    its inputs has (views write nothing), and the outputs of in-place operations."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        flat = list(args) + list((kwargs or {}).values())
        inputs = [t for a in flat for t in (a if isinstance(a, (list, tuple)) else (a,))]
        pointers = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
        in_place = func.overloadpacket.__name__.endswith("_")
        for t in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(t, torch.Tensor) and (
                in_place or t.untyped_storage().data_ptr() not in pointers
            ):
                self.total += t.numel() * t.element_size()
        return out


_BACKWARD = "autograd::engine::evaluate_function"


def _chain(event) -> list:  # type: ignore[no-untyped-def]
    chain, node = [], event
    while node is not None:
        chain.append(node)
        node = node.cpu_parent
    return chain


def _line(chain: list) -> str | None:  # type: ignore[type-arg]
    """The innermost module instance (``nn.Module: Conv2d_3``, the profiler's name for it) and
    the first stack frame outside torch (the model's function)."""
    module = next((n.name for n in chain if n.name.startswith("nn.Module: ")), None)
    line = next(
        (
            n.name
            for n in chain
            if ".py(" in n.name
            and not n.name.startswith(("torch/", "<"))
            and "ground_truth" not in n.name
        ),
        None,
    )
    if module is None and line is None:
        return None
    return f"{module or '?'} in {line or '?'}"


def _site(event, forward_lines: dict[int, str]) -> str:  # type: ignore[no-untyped-def]
    """The outermost aten op above a copy, and the model's line; in a backward, the autograd
    node that ran it and the model line of the forward operation that made the node (matched by
    the profiler's sequence number)."""
    chain = _chain(event)
    outer = event.name
    for node in chain:
        if node.name.startswith("aten::"):
            outer = node.name
        else:
            break
    backward = next((n for n in chain if n.name.startswith(_BACKWARD)), None)
    if backward is not None:
        node = backward.name[len(_BACKWARD) + 2 :]
        return f"{outer} @ {node} of {forward_lines.get(backward.sequence_nr, '?')}"
    return f"{outer} @ {_line(chain) or '?'}"


def _forward_lines(events) -> dict[int, str]:  # type: ignore[no-untyped-def]
    """The model line of each forward operation that recorded an autograd sequence number."""
    lines: dict[int, str] = {}
    for event in events:
        if event.sequence_nr < 0 or event.sequence_nr in lines:
            continue
        chain = _chain(event)
        if any(n.name.startswith(_BACKWARD) for n in chain):
            continue
        line = _line(chain)
        if line is not None:
            lines[event.sequence_nr] = line
    return lines


def _broadcast_fill(event) -> bool:  # type: ignore[no-untyped-def]
    """A copy right after an ``aten::expand`` under the same operation: a broadcast written
    into an output (``addmm``'s bias), not a conversion."""
    parent = event.cpu_parent
    siblings = list(parent.cpu_children) if parent is not None else []
    index = next((i for i, e in enumerate(siblings) if e is event), 0)
    return index > 0 and siblings[index - 1].name == "aten::expand"


def _copies(profile) -> dict[str, int]:  # type: ignore[no-untyped-def]
    events = profile.events()
    forward_lines = _forward_lines(events)
    by_site: dict[str, int] = defaultdict(int)
    for event in events:
        if event.name != "aten::copy_" or not event.input_shapes or _broadcast_fill(event):
            continue
        shape = event.input_shapes[0]
        size = _SIZES.get((event.input_dtypes or ["float"])[0], 4)
        by_site[_site(event, forward_lines)] += math.prod(shape) * size if shape else size
    return dict(by_site)


def _step(model: torch.nn.Module, x: torch.Tensor, train: bool, optimizer):  # type: ignore[no-untyped-def]
    if not train:
        with torch.no_grad():
            model(x)
        return
    out = model(x)
    if isinstance(out, torch.Tensor) and out.dim() == 2:
        labels = torch.randint(
            out.shape[1], (out.shape[0],), generator=torch.Generator().manual_seed(0)
        )
        loss = F.cross_entropy(out, labels)
    else:
        tensors = out if isinstance(out, (list, tuple)) else [out]
        loss = sum(t.float().sum() for t in tensors if isinstance(t, torch.Tensor))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def measure(model: torch.nn.Module, shape: tuple[int, ...], train: bool) -> dict[str, object]:
    """One model in one mode: copies by site in both formats, and the bytes written."""
    torch.manual_seed(0)
    x = torch.randn(shape)
    runs = {}
    written = 0
    for fmt in ("nchw", "channels_last"):
        m = copy.deepcopy(model).train(train)
        xi = x
        if fmt == "channels_last":
            m = m.to(memory_format=torch.channels_last)
            xi = x.contiguous(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) if train else None
        _step(m, xi, train, optimizer)  # warm-up (and the optimizer's state)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_stack=True
        ) as profile:
            _step(m, xi, train, optimizer)
        runs[fmt] = _copies(profile)
        if fmt == "channels_last":
            with _BytesWritten() as counter:
                _step(m, xi, train, optimizer)
            written = counter.total
    sites = sorted(set(runs["nchw"]) | set(runs["channels_last"]))
    extra = {s: runs["channels_last"].get(s, 0) - runs["nchw"].get(s, 0) for s in sites}
    cl_only = sum(v for v in extra.values() if v > 0)
    saved = -sum(v for v in extra.values() if v < 0)
    share = cl_only / written if written else 0.0
    verdict = "clean" if cl_only == 0 else "minor"
    if cl_only >= GATE_BYTES and share >= GATE_SHARE:
        verdict = "offending"
    top = sorted(((v, s) for s, v in extra.items() if v > 0), reverse=True)[:5]
    return {
        "bytes_written": written,
        "cl_only_bytes": cl_only,
        "saved_bytes": saved,
        "net_bytes": cl_only - saved,
        "share": share,
        "verdict": verdict,
        "copies_nchw": sum(runs["nchw"].values()),
        "copies_channels_last": sum(runs["channels_last"].values()),
        "top_sites": [{"site": s, "bytes": v} for v, s in top],
    }


def sample(count: int) -> list[tuple[str, tuple[int, ...]]]:
    """The first ``count`` timm models in SHA-1 order that fit the size rule."""
    import timm
    from timm.models import get_pretrained_cfg

    chosen = []
    for name in sorted(timm.list_models(), key=lambda n: hashlib.sha1(n.encode()).hexdigest()):
        cfg = get_pretrained_cfg(name)
        size = tuple(cfg.input_size) if cfg is not None else (3, 224, 224)
        if len(size) != 3 or max(size[1:]) > MAX_SIDE:
            continue
        try:
            with torch.device("meta"):
                parameters = sum(p.numel() for p in timm.create_model(name).parameters())
        except Exception:
            continue  # not buildable on the meta device: not in the sample
        if parameters <= MAX_PARAMETERS:
            chosen.append((name, size))
        if len(chosen) == count:
            break
    return chosen


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else float("nan")


def _verdict(row: dict) -> str:
    """A sweep row's verdict: its summary's (version 3), else offending when it has offenders."""
    verdict = row["summary"].get("verdict")
    return verdict or ("offending" if row["offenders"] else "clean")


def _offends(row: dict) -> bool:
    return _verdict(row) == "offending"


def _reported(row: dict) -> int:
    """The bytes a row reports: its cost's channels_last-only bytes (version 3), else the
    bytes its findings converted."""
    if row.get("cost") is not None:
        return row["cost"]["extra_bytes"]
    return row["summary"]["bytes_converted"] + row["summary"]["parameter_bytes"]


def compare(truth_path: Path, inference: Path, training: Path) -> dict[str, object]:
    """Agreement of cl-audit's sweep verdicts (a row offends or not; and the same of the three
    verdicts) with the ground truth's, and the Spearman correlation of cl-audit's reported
    bytes with the measured channels_last-only bytes, per mode. Reads the sweeps' JSON, not
    cl-audit."""
    import gzip

    def rows(path: Path) -> dict[str, dict]:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        return {r["name"]: r for r in data["models"]}

    truth = json.loads(truth_path.read_text())["rows"]
    result: dict[str, object] = {}
    for mode, path in (("inference", inference), ("training", training)):
        sweep = rows(path)
        pairs = [
            (t, sweep[t["model"]])
            for t in truth
            if t["mode"] == mode
            and t["verdict"] != "error"
            and t["model"] in sweep
            and sweep[t["model"]]["status"] == "ok"
        ]
        if not pairs:
            continue
        offends = [_offends(r) for _, r in pairs]
        measured = [t["verdict"] == "offending" for t, _ in pairs]
        disagree = [
            {"model": t["model"], "truth": t["verdict"], "cl_audit": _verdict(r),
             "cl_only_bytes": t["cl_only_bytes"], "reported": _reported(r), "share": t["share"]}
            for (t, r) in pairs
            if _offends(r) != (t["verdict"] == "offending")
        ]  # fmt: skip
        reported = [_reported(r) for _, r in pairs]
        verdicts = sum(_verdict(r) == t["verdict"] for t, r in pairs)
        result[mode] = {
            "models": len(pairs),
            "agree": sum(a == b for a, b in zip(offends, measured, strict=True)),
            "same_verdict": verdicts,
            "truth_offending": sum(measured),
            "cl_audit_offending": sum(offends),
            "spearman_reported_vs_cl_only": spearman(
                reported, [t["cl_only_bytes"] for t, _ in pairs]
            ),
            "disagreements": disagree,
        }
    return result


def _isolated(name: str, size: tuple[int, ...], mode: str) -> dict[str, object]:
    """One model in one mode, in a process of its own: a crash or a hang is an error row."""
    start = time.perf_counter()
    row: dict[str, object] = {"model": name, "mode": mode, "input_shape": [2, *size]}
    command = [sys.executable, __file__, "--one", name, mode]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode == 0:
            row.update(json.loads(done.stdout.strip().splitlines()[-1]))
        else:
            tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            row.update(verdict="error", message=f"exit {done.returncode}: {tail}"[:300])
    except subprocess.TimeoutExpired:
        row.update(verdict="error", message="timed out after 600 s")
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def _one(name: str, mode: str) -> None:
    """The child's side of ``_isolated``: measure, and print the row's figures as JSON."""
    import timm
    from timm.models import get_pretrained_cfg

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False)
    size = tuple(get_pretrained_cfg(name).input_size)
    print(json.dumps(measure(model, (2, *size), mode == "training")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", nargs=3, type=Path, metavar=("TRUTH", "INFERENCE", "TRAINING"))
    parser.add_argument("--sample", type=int, default=40)
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("models", nargs="*", help="timm models (default: the sample rule)")
    args = parser.parse_args()
    if args.one:
        _one(*args.one)
        return
    if args.compare:
        print(json.dumps(compare(*args.compare), indent=1))
        return
    if args.out is None:
        parser.error("--out is required to measure")
    from timm.models import get_pretrained_cfg

    models = (
        [(n, tuple(get_pretrained_cfg(n).input_size)) for n in args.models]
        if args.models
        else sample(args.sample)
    )
    rows = []
    for name, size in models:
        for mode in args.modes.split(","):
            row = _isolated(name, size, mode)
            rows.append(row)
            share = row.get("share")
            print(
                f"{name:40s} {mode:9s} {row['verdict']:9s} "
                f"cl-only {row.get('cl_only_bytes', 0) / 2**20:8.2f} MiB "
                f"({(share or 0) * 100:5.2f}% of {row.get('bytes_written', 0) / 2**20:8.1f} MiB) "
                f"saved {row.get('saved_bytes', 0) / 2**20:7.2f} MiB  {row['seconds']}s",
                flush=True,
            )
            _write(args.out, rows)  # after every row: an interruption loses nothing


def _write(path: Path, rows: list[dict[str, object]]) -> None:
    import timm

    document = {
        "format": "cl-audit.ground-truth",
        "version": 1,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "gate": {"share": GATE_SHARE, "bytes": GATE_BYTES},
        "rows": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
