from __future__ import annotations

import pytest
import torch

from cl_audit.rule.layout import (
    MemoryLayout,
    StrideClass,
    classify,
    layout_of,
    stride_class,
)

CL, CONTIG, AMBIG, OTHER = (
    MemoryLayout.CHANNELS_LAST,
    MemoryLayout.CONTIGUOUS,
    MemoryLayout.AMBIGUOUS,
    MemoryLayout.OTHER,
)


def strides_of(shape: tuple[int, ...], fmt: torch.memory_format) -> tuple[int, ...]:
    return torch.empty(shape).contiguous(memory_format=fmt).stride()


@pytest.mark.parametrize(
    ("shape", "expected_cl", "expected_contiguous"),
    [
        ((2, 8, 4, 4), CL, CONTIG),
        ((1, 8, 4, 4), CL, CONTIG),  # batch of one: the order of the other dims decides
        ((2, 1, 4, 4), AMBIG, AMBIG),  # N1HW: a gate map
        ((2, 8, 1, 1), AMBIG, AMBIG),  # NC11: a pooled map
        ((1, 1, 1, 1), AMBIG, AMBIG),
        ((2, 8, 1, 4), CL, CONTIG),
        ((2, 8, 4, 1), CL, CONTIG),
    ],
)
def test_4d_layouts_with_size_one_dims(shape, expected_cl, expected_contiguous):
    assert classify(shape, strides_of(shape, torch.channels_last)) is expected_cl
    assert classify(shape, strides_of(shape, torch.contiguous_format)) is expected_contiguous


@pytest.mark.parametrize(
    ("shape", "expected_cl"),
    [
        ((2, 8, 3, 4, 4), CL),
        ((2, 1, 3, 4, 4), AMBIG),
        ((2, 8, 1, 1, 1), AMBIG),
        ((1, 8, 1, 4, 4), CL),
    ],
)
def test_5d_layouts(shape, expected_cl):
    assert classify(shape, strides_of(shape, torch.channels_last_3d)) is expected_cl
    contiguous = classify(shape, strides_of(shape, torch.contiguous_format))
    assert contiguous is (AMBIG if expected_cl is AMBIG else CONTIG)


def test_channel_slice_of_nhwc_is_channels_last_though_not_dense():
    x = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)[:, :3]
    assert not x.is_contiguous(memory_format=torch.channels_last)
    assert layout_of(x) is CL


def test_permuted_and_transposed_orders_are_other():
    x = torch.randn(2, 8, 4, 5)
    assert layout_of(x.transpose(2, 3)) is OTHER
    assert layout_of(x.permute(1, 0, 2, 3)) is OTHER


def test_nhwc_permute_of_channels_last_is_contiguous_ordered():
    x = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    assert layout_of(x.permute(0, 2, 3, 1)) is CONTIG


def test_broadcast_dims_carry_no_order():
    bias = torch.randn(1, 8, 1, 1).expand(2, 8, 4, 4)
    assert layout_of(bias) is AMBIG


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 4)])
def test_other_ranks_are_contiguous_or_other(shape):
    x = torch.randn(shape)
    assert layout_of(x) is CONTIG
    if len(shape) >= 2:
        assert layout_of(x.transpose(0, 1)) is OTHER


def test_stride_classes_say_how_a_strided_tensor_lies():
    tokens = torch.randn(2, 16, 24)
    nhwc = torch.randn(2, 4, 6, 8).to(memory_format=torch.channels_last)
    cases = {
        "contiguous": (tokens, None),
        "transposed": (tokens.mT, StrideClass.DENSE_SECOND),
        "outer dims swapped": (tokens.permute(1, 0, 2), StrideClass.DENSE_LAST),
        "a slice of rows": (tokens[:, :8], StrideClass.SPARSE_LAST),
        "flattened channels_last": (nhwc.flatten(2), StrideClass.DENSE_SECOND),
        "its channels split": (nhwc.flatten(2)[:, :2], StrideClass.SPARSE_SECOND),
        "batch dim fastest": (torch.randn(16, 24, 2).permute(2, 0, 1), StrideClass.DENSE_NEITHER),
        "a broadcast": (torch.randn(3, 1).expand(3, 4), StrideClass.SPARSE_SECOND),
    }
    assert {k: stride_class(t) for k, (t, _) in cases.items()} == {
        k: c for k, (_, c) in cases.items()
    }
