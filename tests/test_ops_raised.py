"""The operator index's raised samples beyond a first input's shape (issue #60): index lists,
einsum equations, inputs widened by broadcasting, named axes, sources aligned with the input,
and the generic input where no sample can be raised; each with a control."""

from __future__ import annotations

import pytest
import torch

from cl_audit.compat.opinfo import (
    DimArgument,
    OperatorEntry,
    Sample,
    operator_entries,
    opinfo_problem,
)
from cl_audit.enums import OpBehaviour
from cl_audit.features.ops_index.cases import cases
from cl_audit.features.ops_index.probe import operator_row
from cl_audit.report.ops_report import OperatorRow, Unjudged

B = OpBehaviour


def _entry(name: str, call, *samples: Sample, **kwargs) -> OperatorEntry:
    return OperatorEntry(name, call, lambda: iter(samples), **kwargs)


def _raised(entry: OperatorEntry) -> list[Sample]:
    return [c.sample for c in cases(entry) if c.label == "raised"]


def test_an_index_list_takes_the_new_leading_dimensions_whole():
    """index_put's indices name the dimensions they index from the first: raised, the input's
    new leading dimensions get an index that takes each whole (x[a, b, i] as x[:, :, i]) and
    the operator is judged (it keeps channels_last); a list of float tensors is the control:
    given no index, its tensors raised as any other of the input's shape."""
    x, rows, values = torch.randn(5, 5), (torch.tensor([1]),), torch.randn(1, 5)
    entry = _entry("toy.index_put", torch.index_put, Sample(x, (rows, values), {}))
    raised = _raised(entry)[0]
    first, second, index = raised.args[0]
    assert raised.input.shape == (2, 3, 5, 5)
    assert first.shape == (2, 1, 1) and second.shape == (3, 1) and index is rows[0]
    row = operator_row(entry)
    assert isinstance(row, OperatorRow) and row.behaviour is B.KEEPS

    def stacked(t, others):
        return t + torch.stack(others).sum(0)

    floats = (torch.randn(5, 5), torch.randn(5, 5))
    control = _raised(_entry("toy.floats", stacked, Sample(x, (floats,), {})))[0]
    assert [t.shape for t in control.args[0]] == [(2, 3, 5, 5), (2, 3, 5, 5)]


def test_an_einsum_equation_gets_an_ellipsis_for_each_raised_operand():
    a, b = torch.randn(2, 3), torch.randn(3, 4)
    entry = _entry(
        "toy.einsum", lambda xs, eq: torch.einsum(eq, *xs), Sample([a, b], ("ij,jk->ik",), {})
    )
    first, both = _raised(entry)  # the first operand raised; then both (of one rank)
    assert first.args == ("...ij,jk->...ik",) and first.input[0].shape == (2, 3, 2, 3)
    assert both.args == ("...ij,...jk->...ik",) and both.input[1].shape == (2, 3, 3, 4)
    row = operator_row(entry)
    assert isinstance(row, OperatorRow) and row.example.output_shape == (2, 3, 2, 4)
    # the control: a string that is no equation of these operands stays as it was
    reduce = _entry("toy.reduce", lambda t, how: t.amax(-1), Sample(a, ("max",), {}))
    assert _raised(reduce)[0].args == ("max",)


def test_a_first_input_that_others_broadcast_is_widened_then_raised():
    """broadcast_tensors of a (3,) tensor and a (5, 1, 1) one: raising the first alone gives a
    (2, 3, 5, 3) tensor the other cannot broadcast with; widened to the (5, 1, 3) they
    broadcast to, then raised, the call runs and is judged. The control: a first input of the
    broadcast shape already is raised, not widened."""
    sample = Sample(torch.randn(3), (torch.randn(5, 1, 1),), {})
    entry = _entry("toy.broadcast", torch.broadcast_tensors, sample)
    narrow, wide = _raised(entry)
    assert narrow.input.shape == (2, 3, 5, 3) and wide.input.shape == (2, 5, 1, 3)
    row = operator_row(entry)
    assert isinstance(row, OperatorRow) and row.example.input_shape == (2, 5, 1, 3)
    same = Sample(torch.randn(5, 1, 3), (torch.randn(5, 1, 1),), {})
    raised = _raised(_entry("toy.same", torch.broadcast_tensors, same))
    assert {s.input.shape for s in raised} == {(2, 5, 1, 3)}


def test_an_axis_named_axis_moves_with_the_raise_and_over_each_dimension():
    def cumulative(t, axis):
        return t.cumsum(axis)

    entry = _entry("toy.axis", cumulative, Sample(torch.randn(6, 8), (), {"axis": 1}))
    assert _raised(entry)[0].kwargs == {"axis": 3}
    by_case = {c.label: c.sample.kwargs for c in cases(entry)}
    assert by_case["dim=C"] == {"axis": 1} and "dim" not in by_case["dim=H"]
    # the control: a "dim" keyword is still moved as "dim"
    dim = _entry("toy.dim", lambda t, dim: t.cumsum(dim), Sample(torch.randn(6, 8), (), {"dim": 1}))
    assert _raised(dim)[0].kwargs == {"dim": 3}


def test_a_source_shaped_as_the_input_without_its_dimension_is_raised_with_it():
    """select_scatter's (4, 6) source is its (4, 5, 6) input without dimension 1: raised with
    the input (and the dimension moved), the call runs; a (6, 4) source is the control, not
    raised with it; and an LU's (3,) pivots beside its (3, 3) factor, the input's leading
    dimensions, are raised with it."""
    x, src = torch.randn(4, 5, 6), torch.randn(4, 6)
    entry = _entry(
        "toy.select_scatter", torch.select_scatter, Sample(x, (src, 1, 2), {}), dim_position=1
    )
    alone, together = _raised(entry)
    assert alone.args[0].shape == (4, 6) and together.args[0].shape == (2, 4, 6)
    assert together.args[1] == 2  # dim 1 of the (4, 5, 6) input is dim 2 of the raised one
    assert isinstance(operator_row(entry), OperatorRow)
    other = Sample(x, (torch.randn(6, 4), 1, 2), {})
    assert len(_raised(_entry("toy.other", torch.select_scatter, other, dim_position=1))) == 1
    lu, pivots = torch.linalg.lu_factor(torch.randn(3, 3))
    solve = _entry(
        "toy.lu_solve", torch.linalg.lu_solve, Sample(lu, (pivots, torch.randn(3, 4)), {})
    )
    (_, both) = _raised(solve)
    assert both.args[0].shape == (2, 3, 3) and both.args[1].shape == (2, 3, 3, 4)
    assert isinstance(operator_row(solve), OperatorRow)


def test_where_no_sample_can_be_raised_a_generic_input_is_tried():
    """A concatenation along dimension 1 of (5, 2, 1) and (5, 3, 1) tensors cannot be raised
    (raised alike, they differ in dimension 2); two (2, 3, 5, 7) tensors join: a ``generic``
    case. The control: an operator judged on its own samples gets none."""

    def joined(xs):
        return torch.cat(xs, dim=1)

    pair = [torch.randn(5, 2, 1), torch.randn(5, 3, 1)]
    row = operator_row(_entry("toy.join", joined, Sample(pair, (), {})))
    assert isinstance(row, OperatorRow) and [c.case for c in row.cases] == ["generic"]
    assert row.example.input_shape == (2, 3, 5, 7) and row.behaviour is B.KEEPS
    relu = operator_row(_entry("toy.relu", torch.relu, Sample(torch.randn(5, 7), (), {})))
    assert "generic" not in [c.case for c in relu.cases]
    refused = operator_row(
        _entry("toy.dot", torch.dot, Sample(torch.randn(5), (torch.randn(5),), {}))
    )
    assert isinstance(refused, Unjudged)  # nothing takes a 4-D dot, generic or raised


def test_the_dimensions_a_schema_names_move_with_their_axes_given_or_by_default():
    """A diagonal of a (5, 5) matrix raised to (2, 3, 5, 5) is still the matrix's: its
    ``dim1=0, dim2=1`` defaults are passed moved (2, 3), not left to take the diagonal of N and
    C; a transpose's positional dims and a reduction's list of dims move the same way; a
    dimension counted from the end stays as it was (the control), as does an argument the
    schema does not name as a dimension (``tile``'s repetitions)."""
    matrix = torch.randn(5, 5)
    diagonal = (DimArgument("dim1", 1, 0), DimArgument("dim2", 2, 1))
    entry = _entry("toy.diagonal", torch.diagonal, Sample(matrix, (), {}), dim_arguments=diagonal)
    (raised,) = _raised(entry)
    assert raised.kwargs == {"dim1": 2, "dim2": 3}
    assert torch.diagonal(raised.input, **raised.kwargs).shape == (2, 3, 5)  # the matrices'
    swap = (DimArgument("dim0", 0), DimArgument("dim1", 1))
    transposed = _raised(
        _entry("toy.t", torch.transpose, Sample(matrix, (0, -1), {}), dim_arguments=swap)
    )
    assert transposed[0].args == (2, -1)
    over = (DimArgument("dim", 0),)
    summed = _raised(
        _entry("toy.sum", torch.sum, Sample(matrix, ((0, 1),), {}), dim_arguments=over)
    )
    assert summed[0].args == ((2, 3),)
    ends = _raised(
        _entry("toy.sum", torch.sum, Sample(matrix, ((-2, -1),), {}), dim_arguments=over)
    )
    assert ends[0].args == ((-2, -1),)
    tiled = _raised(_entry("toy.tile", torch.tile, Sample(matrix, ((1, 2),), {})))
    assert tiled[0].args == ((1, 2),)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_an_operator_of_sparse_tensors_is_listed_as_such_not_a_row_with_an_error():
    """A sparse CSR matrix has no strides to raise or to make channels_last: its operator is
    listed with that reason (it was a row with expand's error); the same operator given a
    dense matrix is judged (the control)."""

    def product(a, b):
        return a @ b if a.layout is torch.strided else torch.sparse.mm(a, b)

    dense = torch.randn(5, 5)
    sparse = _entry("toy.sparse", product, Sample(dense.to_sparse_csr(), (torch.randn(5, 3),), {}))
    row = operator_row(sparse)
    assert isinstance(row, Unjudged) and "sparse (sparse_csr): no strides" in row.reason
    strided = _entry("toy.dense", product, Sample(dense, (torch.randn(5, 3),), {}))
    assert isinstance(operator_row(strided), OperatorRow)


@pytest.mark.skipif(opinfo_problem() is not None, reason=str(opinfo_problem()))
def test_torchs_index_put_einsum_broadcast_tensors_and_lu_solve_have_rows():
    wanted = {"index_put", "einsum", "broadcast_tensors", "linalg.lu_solve", "select_scatter"}
    entries = [e for e in operator_entries("cpu", torch.float32) if e.name in wanted]
    rows = {e.name: operator_row(e) for e in entries}
    assert rows.keys() == wanted
    unjudged = {name: row for name, row in rows.items() if isinstance(row, Unjudged)}
    assert not unjudged
    (diagonal,) = [e for e in operator_entries("cpu", torch.float32) if e.name == "diagonal"]
    assert {(a.name, a.default) for a in diagonal.dim_arguments} == {("dim1", 0), ("dim2", 1)}
