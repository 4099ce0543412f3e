"""Which fused attention kernel ``F.scaled_dot_product_attention`` runs on this device, and the
strides of what it returns and of its gradients: the truth a fake prediction of the CUDA
attention backend (which fake tensors cannot choose: without a GPU torch always takes the math
path) is to be checked against.

    python scripts/sdpa_backends.py --device cuda --out reports/sdpa-backends_cuda.json

For each point of a grid (dtype; head size; sequence length; how the query, key and value are
laid out: contiguous (B, H, L, D), transposed from (B, L, H, D), or one slice of a packed qkv
(B, L, 3, H, D) permuted as timm's attention blocks make it; no mask, a boolean mask, an
additive float mask, or causal), one forward and backward runs under cl-audit's dispatch
observer: the row holds the aten operations called (the backend is the fused op among them)
and the strides of the output and of the query's, key's and value's gradients. The file is
rewritten every 25 rows, so a run stopped at a time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from typing import Any

import torch
import torch.nn.functional as F

from cl_audit.compat.operators import aten_op_name
from cl_audit.intercept.dispatch import DispatchEngine

BATCH, HEADS = 2, 4
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
HEAD_SIZES = (32, 64, 80, 96, 128, 256)
LENGTHS = (64, 197)
LAYOUTS = ("bhld", "blhd", "packed")
MASKS = ("none", "bool", "float", "causal")


class _Ops:
    """An ``Observer``: the name of each aten operation called."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    def observe(self, aten_op: Any, python_op: Any, args: Any, kwargs: Any, result: Any) -> None:
        self.ops.append(aten_op_name(aten_op))


def _qkv(layout: str, length: int, size: int, dtype: torch.dtype, device: str) -> list:
    shape = (BATCH, length, HEADS, size)
    if layout == "bhld":
        made = [torch.randn(BATCH, HEADS, length, size, dtype=dtype, device=device) for _ in "qkv"]
    elif layout == "blhd":
        made = [torch.randn(shape, dtype=dtype, device=device).transpose(1, 2) for _ in "qkv"]
    else:
        packed = torch.randn(BATCH, length, 3, HEADS, size, dtype=dtype, device=device)
        leaf = packed.requires_grad_()
        return [leaf, *leaf.permute(2, 0, 3, 1, 4).unbind(0)]
    leaves = [t.detach().requires_grad_() for t in made]
    return [None, *leaves]


def _mask(kind: str, length: int, dtype: torch.dtype, device: str) -> torch.Tensor | None:
    if kind == "bool":
        return torch.rand(length, length, device=device) > 0.2
    if kind == "float":
        return torch.randn(BATCH, HEADS, length, length, dtype=dtype, device=device)
    return None


def _row(dtype: str, size: int, length: int, layout: str, mask: str, device: str) -> dict:
    packed, q, k, v = _qkv(layout, length, size, DTYPES[dtype], device)
    attn_mask = _mask(mask, length, DTYPES[dtype], device)
    seen = _Ops()
    engine = DispatchEngine(seen)
    engine.install()
    try:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=mask == "causal")
        out.backward(torch.ones_like(out))
    finally:
        engine.uninstall()
    grads = {"packed": packed.grad.stride()} if packed is not None else {
        name: t.grad.stride() for name, t in zip("qkv", (q, k, v), strict=True)
    }  # fmt: skip
    fused = [op for op in seen.ops if "attention" in op]
    return {
        "dtype": dtype, "head_size": size, "length": length, "layout": layout, "mask": mask,
        "query_strides": q.stride(), "fused": fused, "output_strides": out.stride(),
        "grad_strides": grads, "ops": sorted(set(seen.ops)),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    document: dict = {
        "torch": torch.__version__, "cudnn": cudnn, "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "batch": BATCH, "heads": HEADS, "rows": [],
    }  # fmt: skip
    start = time.perf_counter()
    grid = itertools.product(DTYPES, HEAD_SIZES, LENGTHS, LAYOUTS, MASKS)
    for n, point in enumerate(grid, start=1):
        try:
            document["rows"].append(_row(*point, device=args.device))
        except Exception as error:  # a combination the device refuses is a row, not a stop
            keys = ("dtype", "head_size", "length", "layout", "mask")
            document["rows"].append({**dict(zip(keys, point, strict=True)), "error": repr(error)})
        if n % 25 == 0:
            document["seconds"] = round(time.perf_counter() - start, 1)
            with open(args.out, "w") as out:
                json.dump(document, out, indent=1)
    document["seconds"] = round(time.perf_counter() - start, 1)
    with open(args.out, "w") as out:
        json.dump(document, out, indent=1)
    backends: dict[str, int] = {}
    for row in document["rows"]:
        key = ",".join(row.get("fused", ["error"])) or "math"
        backends[key] = backends.get(key, 0) + 1
    print(f"{len(document['rows'])} rows in {document['seconds']} s: {backends}")


if __name__ == "__main__":
    main()
