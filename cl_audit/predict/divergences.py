"""What fake tensors get wrong, per torch version and device.

Two kinds of knowledge, both keyed by the torch version they hold for:

- measured tables (``divergences.json``, made by ``scripts/divergence_table.py`` from
  ``scripts/gpu_truth.py`` runs): operations where fake and eager runs on one device disagree
  about losing channels_last. A sweep's ``--confirm`` re-runs eagerly the clean fake rows whose
  findings include one of them. A torch version with no table of its own gets the union of the
  tables measured for the device, and says so.
- kernel-source overrides for CUDA (``CUDA_KERNEL_OVERRIDES``, and the cuDNN layout of a
  training batch norm's input gradient, ``BATCH_NORM_BACKWARD_SOURCE``): where the CUDA
  kernel returns another layout than the fake (meta) implementation, read from the kernel's
  source because no GPU measured it. Fake CUDA runs apply them to the operation's output, so
  the rest of the model sees what CUDA would hand it; a report lists each override that fired
  ("predicted from kernel source").
- measured kernel copies (``kernel_copies.json``, made by ``scripts/kernel_copies.py``): the
  strided inputs that kernels copy inside before they compute (the CPU softmax of a transposed
  matrix, a layer norm of permuted tokens), by operation, input position, rank and
  ``StrideClass``. Fake runs predict these copies from it (``KernelCopies``); eager runs
  measure them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from cl_audit.compat.versions import TORCH_VERSION, torch_version

__all__ = [
    "ATTENTION_SOURCE",
    "BATCH_NORM_BACKWARD_SOURCE",
    "CPU_BATCH_NORM_GRADIENT",
    "CUDA_BATCH_NORM_GRADIENT",
    "CUDA_KERNEL_OVERRIDES",
    "HIDDEN_TRAINING_COPIES",
    "BatchNormGradient",
    "DivergenceTable",
    "KernelCopies",
    "KernelOverride",
    "StridedInput",
    "divergence_table",
    "kernel_copy_table",
]

# Kernels that copy inside in a training step whatever strides they are handed, by device:
# measured with the profiler (scripts/ground_truth.py, torch 2.14.1: on the CPU, the
# channels_last convolution backward writes its weight gradient in another order and converts
# it). Fake tensors run no kernel, so a fake training verdict there is confirmed eagerly.
HIDDEN_TRAINING_COPIES = {"cpu": "aten.convolution_backward"}

Version = tuple[int, int]


@dataclass(frozen=True)
class DivergenceTable:
    """The operations, keyed ``(aten op, phase)``, whose fake layout is known to differ from
    eager on one device; ``name`` says which measurement(s) it comes from."""

    name: str
    ops: Mapping[tuple[str, str], str]

    def __contains__(self, key: object) -> bool:
        return key in self.ops


@functools.cache
def _tables() -> tuple[dict, ...]:
    text = resources.files("cl_audit.predict").joinpath("divergences.json").read_text()
    document = json.loads(text)
    if document.get("format") != "cl-audit.fake-divergences" or document.get("version") != 1:
        raise ValueError("cl_audit/predict/divergences.json: not a version-1 divergence table")
    return tuple(document["tables"])


def _entries(table: dict) -> dict[tuple[str, str], str]:
    return {
        (e["op"], e["phase"]): "; ".join(
            f"{side} loses it in {', '.join(e[side])}" for side in ("eager", "fake") if e.get(side)
        )
        for e in table["ops"]
    }


@functools.cache
def divergence_table(device_type: str, version: Version = TORCH_VERSION) -> DivergenceTable:
    """The measured table for this torch version and device type; without one, the union of
    the device's tables (named as such); without any for the device, an empty table."""
    label = f"{version[0]}.{version[1]}"
    tables = [t for t in _tables() if t["device"] == device_type]
    exact = [t for t in tables if torch_version(t["torch"]) == version]
    if exact:
        (table,) = exact
        return DivergenceTable(
            f"torch {label} {device_type} ({table['measured']})", _entries(table)
        )
    if not tables:
        return DivergenceTable(f"none: no fake-versus-eager table measured on {device_type}", {})
    ops: dict[tuple[str, str], str] = {}
    for table in tables:
        for key, where in _entries(table).items():
            ops.setdefault(key, f"torch {table['torch']}: {where}")
    measured = ", ".join(t["torch"] for t in tables)
    name = f"union of torch {measured} {device_type} (torch {label} not measured)"
    return DivergenceTable(name, ops)


# (aten op, input position among its tensor arguments, rank, StrideClass value)
StridedInput = tuple[str, int, int, str]


@dataclass(frozen=True)
class KernelCopies:
    """The share of a strided input's bytes that a kernel copies inside, by ``StridedInput``,
    measured on one device; ``name`` says which measurement."""

    name: str
    copied: Mapping[StridedInput, float]

    @functools.cached_property
    def by_op(self) -> Mapping[str, Mapping[tuple[int, int, str], float]]:
        """``copied`` by operation: (input position, rank, stride class) -> share."""
        found: dict[str, dict[tuple[int, int, str], float]] = {}
        for (op, *key), share in self.copied.items():
            found.setdefault(op, {})[tuple(key)] = share
        return found


@functools.cache
def kernel_copy_table(device_type: str, version: Version = TORCH_VERSION) -> KernelCopies:
    """The kernel copies measured for this torch version and device type; without a
    measurement of this version, the newest one before it (else the oldest), named as such;
    without any for the device, none."""
    text = resources.files("cl_audit.predict").joinpath("kernel_copies.json").read_text()
    document = json.loads(text)
    if document.get("format") != "cl-audit.kernel-copies" or document.get("version") != 1:
        raise ValueError("cl_audit/predict/kernel_copies.json: not a version-1 kernel-copy table")
    tables = sorted(
        (t for t in document["tables"] if t["device"] == device_type),
        key=lambda t: torch_version(t["torch"]),
    )
    if not tables:
        return KernelCopies(f"none: no kernel copies measured on {device_type}", {})
    earlier = [t for t in tables if torch_version(t["torch"]) <= version]
    table = earlier[-1] if earlier else tables[0]
    label = f"{version[0]}.{version[1]}"
    name = f"torch {table['torch']} {device_type} ({table['measured']})"
    if torch_version(table["torch"]) != version:
        name += f"; torch {label} not measured"
    copied = {(e["op"], e["input"], e["rank"], e["strides"]): e["copied"] for e in table["copies"]}
    return KernelCopies(name, copied)


@dataclass(frozen=True)
class KernelOverride:
    """A CUDA kernel that, for channels_last input, returns its output ``output`` contiguous
    where the fake implementation keeps channels_last; ``until`` is the last torch version whose
    source was read to do so (None: still so in the newest read)."""

    op: str
    output: int
    since: Version
    until: Version | None
    source: str

    def holds(self, version: Version) -> bool:
        return self.since <= version and (self.until is None or version <= self.until)


# Each entry cites the kernel source it was read from (no GPU has checked them one by one; on an
# H200 with torch 2.11 eager CUDA lost channels_last at group norm too, at the clone of its
# input: reports/pages/cuda-predictions.md). Read and found to agree with fake CUDA,
# so not listed: reflection_pad2d and replication_pad2d (NCHW in both; the meta function keeps
# channels_last for CPU only, _meta_registrations.py, PR 179366), max_unpool2d (NCHW in both;
# the decomposition keeps channels_last for cpu/xpu only, PR 187195), upsample_bicubic2d and
# _upsample_bilinear2d_aa (channels_last in both; PR 190754 copies back into the NHWC output).
_GROUP_NORM_SOURCE = (
    "aten/src/ATen/native/group_norm.cpp: on CUDA the input is made contiguous before the "
    "kernel, so the output is NCHW; NHWC CUDA kernels came with PR 191945 in torch 2.15 (their "
    "symbols are in libtorch_cuda.so of 2.15.0, not of 2.14.1)"
)
CUDA_KERNEL_OVERRIDES: tuple[KernelOverride, ...] = (
    KernelOverride("aten.native_group_norm", 0, (2, 4), (2, 14), _GROUP_NORM_SOURCE),
    KernelOverride("aten.native_group_norm_backward", 0, (2, 4), (2, 14), _GROUP_NORM_SOURCE),
)

# Which fused kernel ``F.scaled_dot_product_attention`` runs on a Hopper GPU (H100, H200),
# measured on an H200 with torch 2.11 and cuDNN 9.19 (scripts/sdpa_backends.py: 432 calls;
# reports/sdpa-backends_cuda_h200_torch-2.11.0.json) and, for a mask that requires a gradient,
# by eager CUDA training of the CoAtNet models (reports/pages/h200-leases.md). Fake tensors
# without a GPU take the math path, whose output is contiguous where the kernels follow the
# query (cuDNN) or lay it out sequence-major (memory-efficient).
ATTENTION_SOURCE = (
    "measured on an H200 (torch 2.11, cuDNN 9.19): float16 and bfloat16 attention runs "
    "cuDNN's kernel (output laid out as the query, gradients as their inputs), float32 "
    "attention and attention whose mask requires a gradient the memory-efficient kernel "
    "(output and gradients sequence-major); where the query, key or value is not dense in its "
    "last dimension, or outside head sizes that are multiples of 8 up to 256, dropout and "
    "grouped-query attention, the math path as fake tensors take it"
)

# A batch norm's backward on CUDA, cuDNN's or the native kernel's, lays the input gradient out
# as the input in training and contiguous outside it; torch's fake decomposition follows the
# incoming gradient. Measured: on an H200 (torch 2.11, bfloat16 autocast, the native kernel)
# five models' backward batch norms returned channels_last from an NCHW incoming gradient where
# fake runs predicted NCHW (reports/pages/h200-leases.md, the second lease). Fake CUDA runs lay
# it out as the kernels do.
BATCH_NORM_BACKWARD_SOURCE = (
    "aten/src/ATen/native/cudnn/BatchNorm.cpp (cudnn_batch_norm_backward: "
    "grad_output.contiguous(input.suggest_memory_format()), grad_input allocated in the "
    "input's memory format) and aten/src/ATen/native/cuda/Normalization.cu (the native "
    "kernel, taken for bfloat16, without affine weights or outside training: "
    "batch_norm_elementwise_backward_train allocates grad_input in the input's "
    "suggest_memory_format since PR 107270, torch 2.1; its fused path, for an input not "
    "channels_last, contiguous; batch_norm_elementwise_backward_eval contiguous)"
)

# The CPU's batch norm backward (``batch_norm_backward_cpu_template`` in
# aten/src/ATen/native/Normalization.cpp) allocates the input gradient in the input's
# ``suggest_memory_format``, in training and outside it; torch's fake decomposition follows
# the incoming gradient. Measured on the CPU of torch 2.4.1, 2.14.1 and 2.15.0, float32 and
# bfloat16, with and without affine weights (``tests/test_compat.py``).
CPU_BATCH_NORM_BACKWARD_SOURCE = (
    "aten/src/ATen/native/Normalization.cpp (batch_norm_backward_cpu_template: grad_input "
    "allocated in the input's suggest_memory_format, in training and outside it; measured on "
    "the CPU of torch 2.4.1, 2.14.1 and 2.15.0)"
)


@dataclass(frozen=True)
class BatchNormGradient:
    """Where a device's batch norm backward writes the input gradient: in the input's memory
    format in training, and outside training too unless ``eval_contiguous``."""

    source: str
    eval_contiguous: bool


CUDA_BATCH_NORM_GRADIENT = BatchNormGradient(BATCH_NORM_BACKWARD_SOURCE, eval_contiguous=True)
CPU_BATCH_NORM_GRADIENT = BatchNormGradient(CPU_BATCH_NORM_BACKWARD_SOURCE, eval_contiguous=False)
