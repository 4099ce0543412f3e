"""The operator coverage index (``cl-audit ops``): each behaviour proved on a call of known
behaviour beside its control, the worst sample naming an operator, and the real command over
torch's own operator database."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import torch
import torch.nn.functional as F
from literal_reports import cost_site, costed_row, sweep
from rich.console import Console
from test_cli import ANY_COST, TOYS, invoke, runner
from torch_checks import BACKWARD_PROBLEM

from cl_audit.cli import app
from cl_audit.compat.opinfo import OperatorEntry, Sample, opinfo_problem
from cl_audit.enums import CostKind, OpBehaviour, Phase
from cl_audit.errors import UsageError
from cl_audit.fake.cuda_probe import fake_cuda_problem
from cl_audit.features.ops_index.cases import cases
from cl_audit.features.ops_index.diff import diff
from cl_audit.features.ops_index.probe import build_index, operator_row, probe_sample
from cl_audit.features.ops_index.ranking import OpLink, forward_of, rank_costs
from cl_audit.features.ops_index.target import target_for
from cl_audit.render.html_ops import ops_html
from cl_audit.render.ops_table import render_op_costs, render_ops
from cl_audit.report import load_schema
from cl_audit.report.envelope import OPS_VERSION
from cl_audit.report.ops_report import CaseRow, OperatorRow, OpsIndex, SampleResult, Unjudged
from cl_audit.report.verdict import Producer

B = OpBehaviour
REPORTS = Path(__file__).resolve().parents[1] / "reports"


def _map(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, weight, padding=1)


def _merge_batch_and_channels(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0] * x.shape[1], x.shape[2], x.shape[3])


def test_a_convolution_keeps_channels_last_with_its_weight_converted_too():
    result = probe_sample(_conv, Sample(_map(2, 3, 8, 8), (_map(4, 3, 3, 3),), {}))
    assert result.behaviour is B.KEEPS and result.output_strides == (256, 1, 32, 4)
    assert result.input_strides == (192, 1, 24, 3)
    assert result.gradient is B.KEEPS and result.gradient_strides == (192, 1, 24, 3)


def test_softmax_over_channels_and_instance_norm_return_nchw_where_relu_keeps():
    """The losses of the index's first measurement (reports/pages/ops-index.md), on torch 2.4.1 to
    2.15.0 alike; relu, elementwise, is the control that keeps."""
    x = Sample(_map(2, 3, 8, 8), (), {})
    assert probe_sample(lambda t: t.softmax(1), x).behaviour is B.LOSES
    norm = probe_sample(F.instance_norm, x)
    assert norm.behaviour is B.LOSES and norm.gradient is B.LOSES  # its backward too
    relu = probe_sample(F.relu, x)
    assert relu.behaviour is B.KEEPS and relu.gradient is B.KEEPS


def test_size_one_channels_are_ambiguous_not_lost():
    """A 1-channel map is both orders at once: neither a loss nor a keep, and the note says
    which dimensions; the same call on 3 channels is the control that is judged."""
    one = probe_sample(lambda t: t.softmax(1), Sample(_map(2, 1, 8, 8), (), {}))
    assert one.behaviour is B.AMBIGUOUS and one.note == "input: size-1 channels"
    pooled = probe_sample(
        lambda t: F.adaptive_avg_pool2d(t, 1).contiguous(), Sample(_map(2, 3, 8, 8), (), {})
    )
    assert pooled.behaviour is B.AMBIGUOUS and pooled.note == "output: size-1 spatial dimensions"
    assert probe_sample(lambda t: t.softmax(1), Sample(_map(2, 3, 8, 8), (), {})).behaviour is (
        B.LOSES
    )


def test_a_view_channels_last_cannot_give_refuses_and_a_permutation_follows():
    """Merging batch and channels is a view of NCHW data only: channels_last raises. A
    permutation's NCHW output is not NCHW either: the operator follows its input."""
    x = Sample(_map(2, 3, 8, 8), (), {})
    refused = probe_sample(_merge_batch_and_channels, x)
    assert refused.behaviour is B.REFUSES and refused.note.startswith("RuntimeError: view size")
    assert probe_sample(lambda t: t.permute(0, 1, 3, 2), x).behaviour is B.FOLLOWS
    assert probe_sample(lambda t: t.flatten(2), x).behaviour is B.NO_MAP


def test_a_sample_that_fails_in_nchw_or_is_no_map_does_not_count():
    assert probe_sample(_merge_batch_and_channels, Sample(_map(2, 3), (), {})) is None
    assert probe_sample(lambda t: t.view(7, -1), Sample(_map(2, 3, 8, 8), (), {})) is None


def test_an_operator_is_its_worst_sample_with_every_count_kept():
    samples = [Sample(_map(2, 3, 8, 8), (), {}), Sample(_map(2, 1, 8, 8), (), {})]
    entry = OperatorEntry(
        "toy.softmax",
        lambda t, dim: t.softmax(dim),
        lambda: iter([Sample(s.input, (d,), {}) for s in samples for d in (1, -1)]),
    )
    row = operator_row(entry)
    assert row.behaviour is B.LOSES and row.example.input_shape == (2, 3, 8, 8)
    assert dict(row.counts) == {B.LOSES: 2, B.AMBIGUOUS: 2}


def test_an_operator_whose_samples_cannot_be_made_is_a_row_with_its_error():
    def broken():
        raise ValueError("no sample here")
        yield  # a generator, as the database's

    row = operator_row(OperatorEntry("toy.broken", F.relu, broken))
    assert row.behaviour is None and row.error == "ValueError: no sample here"


@pytest.mark.skipif(opinfo_problem() is not None, reason=str(opinfo_problem()))
def test_cl_audit_ops_runs_torchs_own_samples(tmp_path):
    out = tmp_path / "ops.json"
    result = invoke(
        "ops",
        "--op",
        "nn.functional.conv2d",
        "--op",
        "nn.functional.instance_norm",
        "--json",
        str(out),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema("ops"))
    index = OpsIndex.from_dict(data)
    assert {r.op: r.behaviour for r in index.rows} == {
        "nn.functional.conv2d": B.KEEPS,
        "nn.functional.instance_norm": B.LOSES,
    }
    assert index.to_dict() == data
    assert "2 operators judged (loses 1, keeps 1)" in result.output
    assert "2 of 2 operators shown" in result.output
    only = invoke(
        "ops", "--op", "nn.functional.conv2d", "--op", "nn.functional.instance_norm", "--loses"
    )
    assert "1 of 2 operators shown" in only.output and "conv2d" not in only.output


def test_cl_audit_ops_with_no_matching_operator_is_a_usage_error():
    result = invoke("ops", "--op", "no_such_operator*")
    assert result.exit_code == 2
    assert "no operator" in result.output or "pip install" in result.output


def _index(torch_version: str, **behaviours: OpBehaviour) -> OpsIndex:
    rows = tuple(OperatorRow(op, b, ((b, 1),), None) for op, b in behaviours.items())
    return OpsIndex(torch_version, "cpu", "float32", rows, 0, 1.0)


def test_the_diff_names_what_a_release_broke_fixed_and_added(tmp_path):
    old = _index("2.0", conv=B.KEEPS, norm=B.LOSES, pool=B.KEEPS, gone=B.LOSES)
    new = _index("2.1", conv=B.KEEPS, norm=B.KEEPS, pool=B.LOSES, added=B.KEEPS)
    changes = {c.op: c for c in diff(old, new)}
    assert "conv" not in changes  # unchanged: the control
    assert changes["norm"].better is True and changes["pool"].better is False
    assert changes["added"].old is None and changes["gone"].new is None
    paths = []
    for name, index in (("old", old), ("new", new)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(index.to_json())
    result = invoke("ops", "diff", *map(str, paths))
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("│")]
    assert [line.split()[1] for line in lines] == ["pool", "norm", "added", "gone"]
    assert "worse" in lines[0] and "better" in lines[1] and "only in new" in lines[2]
    assert invoke("ops", "diff", str(paths[0]), str(tmp_path / "missing.json")).exit_code == 2


def _with_gradients(index: OpsIndex, **gradients: OpBehaviour) -> OpsIndex:
    rows = tuple(replace(r, gradient=gradients.get(r.op)) for r in index.rows)
    return replace(index, rows=rows)


def test_the_diff_names_a_gradient_that_a_release_broke_unless_one_side_judged_none(tmp_path):
    """max_pool3d's case: the forward unchanged, its gradient keeps -> loses; the
    convolution's gradient, unchanged, is the control; an index that judged no gradient
    (torch 2.4.1's predicted one) is compared by forward behaviour only, and the diff says so."""
    old = _with_gradients(_index("2.0", conv=B.KEEPS, pool=B.KEEPS), conv=B.KEEPS, pool=B.KEEPS)
    new = _with_gradients(_index("2.1", conv=B.KEEPS, pool=B.KEEPS), conv=B.KEEPS, pool=B.LOSES)
    (change,) = diff(old, new)
    assert (change.op, change.gradient, change.better) == ("pool", True, False)
    unjudged = replace(_index("2.0", conv=B.KEEPS, pool=B.KEEPS), gradients_not_judged="why")
    assert diff(unjudged, new) == ()
    paths = []
    for name, index in (("old", old), ("new", new), ("unjudged", unjudged)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(index.to_json())
    result = invoke("ops", "diff", str(paths[0]), str(paths[1]))
    assert "0 changed, 0 cases changed, 1 gradients changed" in result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("│")]
    assert line.split()[1:9:2] == ["pool", "gradient", "keeps", "loses"] and "worse" in line
    result = invoke("ops", "diff", str(paths[2]), str(paths[1]))
    assert "gradients not compared" in result.output and "says why" in result.output


@pytest.mark.skipif(fake_cuda_problem() is not None, reason=str(fake_cuda_problem()))
def test_fake_cuda_predicts_what_the_cuda_kernels_return_where_the_cpu_differs():
    """Reflection padding keeps channels_last on the CPU (torch 2.4.1 to 2.15.0) and writes
    NCHW on CUDA (read from the kernel source; fake tensors agree); the convolution keeps it on
    both: the control."""
    cuda = target_for("cuda")
    assert cuda.predicted and cuda.device == "cuda"
    x = Sample(_map(2, 3, 8, 8), ((1, 1, 1, 1),), {"mode": "reflect"})
    assert probe_sample(F.pad, x).behaviour is B.KEEPS
    assert probe_sample(F.pad, x, cuda).behaviour is B.LOSES
    conv = probe_sample(_conv, Sample(_map(2, 3, 8, 8), (_map(4, 3, 3, 3),), {}), cuda)
    assert conv.behaviour is B.KEEPS


@pytest.mark.skipif(fake_cuda_problem() is not None, reason=str(fake_cuda_problem()))
def test_fake_cuda_gradients_come_from_a_backward_run_node_by_node_on_fake_tensors():
    """Autograd's engine needs the device: the backward runs node by node on fake CUDA
    tensors. The convolution's input gradient keeps channels_last; reflection
    padding's backward, like its forward there, writes NCHW; no kernel ran, so no copy is
    measured."""
    cuda = target_for("cuda")
    conv = probe_sample(_conv, Sample(_map(2, 3, 8, 8), (_map(4, 3, 3, 3),), {}), cuda)
    assert conv.gradient is B.KEEPS and conv.gradient_strides == (192, 1, 24, 3)
    pad = probe_sample(F.pad, Sample(_map(2, 3, 8, 8), ((1, 1, 1, 1),), {"mode": "reflect"}), cuda)
    assert pad.gradient is B.LOSES and pad.gradient_strides == (192, 64, 8, 1)
    entry = OperatorEntry(
        "toy.copying_relu", _copying_relu, lambda: iter([Sample(_map(2, 3, 8, 8), (), {})])
    )
    assert operator_row(entry, cuda).example.copied is None


def test_a_predicted_index_says_in_its_json_why_no_gradient_was_judged():
    """Where this torch's autograd nodes cannot run one by one (2.4.1), a predicted index
    judges no gradient and says why in its JSON, terminal and HTML; where they can, the
    convolution's gradient is judged and the field is null (whichever this torch is, one
    branch runs: CI runs both)."""
    entry = OperatorEntry(
        "toy.conv", _conv, lambda: iter([Sample(_map(2, 3, 8, 8), (_map(4, 3, 3, 3),), {})])
    )
    index = build_index([entry], target_for("cuda"), torch.float32)
    data = index.to_dict()
    jsonschema.validate(data, load_schema("ops"))
    if BACKWARD_PROBLEM is None:
        assert data["gradients_not_judged"] is None and index.rows[0].gradient is B.KEEPS
        index = replace(index, gradients_not_judged="gradients are not judged: a reason")
    else:
        assert BACKWARD_PROBLEM in data["gradients_not_judged"]
        assert index.rows[0].behaviour is B.KEEPS and index.rows[0].gradient is None
    console = Console(record=True, width=200)
    render_ops(index, index.rows, console)
    assert f"note: {index.gradients_not_judged}" in console.export_text()
    assert f"note: {index.gradients_not_judged}" in ops_html(index)
    plain = replace(index, gradients_not_judged=None)
    console = Console(record=True, width=200)
    render_ops(plain, plain.rows, console)
    assert "note:" not in console.export_text() and "note:" not in ops_html(plain)


def test_a_version_2_index_reads_as_one_whose_gradients_were_judged():
    example = SampleResult(B.KEEPS, (1, 2, 3, 3), (18, 1, 6, 2))
    row = OperatorRow("conv", B.KEEPS, ((B.KEEPS, 1),), example, gradient=B.KEEPS)
    data = OpsIndex("2.14.1", "cuda", "float32", (row,), 0, 1.0, True).to_dict()
    data["version"] = 2
    del data["gradients_not_judged"], data["unjudged"], data["rows"][0]["cases"]
    jsonschema.validate(data, load_schema("ops", 2))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, load_schema("ops"))
    index = OpsIndex.from_dict(data)
    assert index.gradients_not_judged is None and index.rows[0].gradient is B.KEEPS


def test_a_device_the_index_cannot_run_on_is_a_usage_error():
    with pytest.raises(UsageError, match="runs on cpu or cuda, not mps"):
        target_for("mps")


def test_a_sweeps_losses_are_charged_to_the_operation_that_wrote_the_nchw_data():
    """A cost site is charged to its fix site (the interpolation that wrote NCHW data a
    convolution converts), else to itself; the operations rank by bytes, each beside the
    index's rows found by name or, for the same name, by the aten operation that made the
    outputs; a site that channels_last does not cost (no extra bytes) is the control."""
    wrote = Producer("F.interpolate", "aten.upsample_bilinear2d", "up", "Upsample", "net.py:9")
    upsampled = replace(
        cost_site(CostKind.KERNEL, phase=Phase.FORWARD, extra=5 << 20), fix_site=wrote
    )
    norm = cost_site(CostKind.COPY, "F.instance_norm", "aten.clone", Phase.FORWARD, extra=1 << 20)
    free = cost_site(CostKind.COPY, "Tensor.reshape", "aten.clone", Phase.FORWARD, extra=0)
    report = sweep(costed_row("a", upsampled, norm), costed_row("b", upsampled, free))
    index = OpsIndex(
        "2.14.1",
        "cpu",
        "float32",
        (
            OperatorRow(
                "nn.functional.interpolate.nearest",
                B.KEEPS,
                ((B.KEEPS, 1),),
                None,
                aten_ops=("aten.upsample_nearest2d",),
            ),
            OperatorRow(
                "nn.functional.interpolate.bilinear",
                B.KEEPS,
                ((B.KEEPS, 1),),
                None,
                aten_ops=("aten.upsample_bilinear2d",),
            ),
            OperatorRow(
                "nn.functional.instance_norm",
                B.LOSES,
                ((B.LOSES, 1),),
                None,
                aten_ops=("aten.view",),
            ),
        ),
        0,
        1.0,
    )
    costs = rank_costs(index, [report])
    assert [(c.python_op, c.models, c.bytes) for c in costs] == [
        ("F.interpolate", 2, 10 << 20),
        ("F.instance_norm", 1, 1 << 20),
    ]
    assert [r.op for r in costs[0].rows] == ["nn.functional.interpolate.bilinear"]
    assert [r.op for r in costs[1].rows] == ["nn.functional.instance_norm"]


def test_a_backward_operations_cost_is_set_beside_its_operators_gradient():
    """A backward site (run by ``NativeGroupNormBackward0``) joins the row of the operator whose
    backward it is, and reads that row's gradient: here it keeps the format forward and loses
    it backward. The forward site of the same operator (the control) reads its behaviour; a
    view's backward joins no row that merely ends in a view (instance norm's)."""
    group_norm = OperatorRow(
        "native_group_norm",
        B.KEEPS,
        ((B.KEEPS, 2),),
        None,
        aten_ops=("aten.native_group_norm",),
        gradient=B.LOSES,
        gradient_counts=((B.LOSES, 2),),
    )
    viewing = OperatorRow("nn.functional.instance_norm", B.LOSES, ((B.LOSES, 1),), None,
                          aten_ops=("aten.view",), gradient=B.LOSES)  # fmt: skip
    index = OpsIndex("2.14.1", "cuda", "float32", (group_norm, viewing), 0, 1.0, True)
    backward = cost_site(
        CostKind.KERNEL, "NativeGroupNormBackward0", "aten.native_group_norm_backward",
        Phase.BACKWARD, extra=3 << 20,
    )  # fmt: skip
    forward = cost_site(
        CostKind.KERNEL, "F.group_norm", "aten.native_group_norm", Phase.FORWARD, extra=1 << 20
    )
    view = cost_site(CostKind.COPY, "ViewBackward0", "aten.clone", Phase.BACKWARD, extra=1 << 10)
    report = sweep(costed_row("a", backward, forward, view))
    costs = {c.python_op: c for c in rank_costs(index, [report])}
    assert costs["NativeGroupNormBackward0"].gradient
    assert costs["NativeGroupNormBackward0"].rows == (group_norm,)
    assert not costs["F.group_norm"].gradient and costs["ViewBackward0"].rows == ()
    link = OpLink("NativeGroupNormBackward0", None, 1, (group_norm,), gradient=True)
    assert link.reading.startswith("its backward loses channels_last in all 2 of its samples")
    assert "keeps the order" in replace(link, gradient=False).reading
    console = Console(record=True, width=200)
    render_op_costs(index, tuple(costs.values()), console)
    assert "native_group_norm: gradient loses" in console.export_text()
    assert forward_of("ReflectionPad2DBackward0", None) == "aten.reflection_pad2d"
    assert forward_of(None, "aten.avg_pool2d_backward") == "aten.avg_pool2d"
    assert forward_of("torch::autograd::AccumulateGrad", "aten.copy_") is None


def test_a_saved_index_with_a_device_or_dtype_is_refused_not_ignored():
    saved = str(REPORTS / "ops" / "cpu-float32_torch-2.14.1.json.gz")
    result = invoke("ops", "--index", saved, "--device", "cuda")
    assert result.exit_code == 2 and "--device and --dtype do not apply" in result.output
    assert invoke("ops", "--index", saved, "--op", "nn.functional.conv2d").exit_code == 0


def test_cl_audit_ops_from_sweep_ranks_a_committed_registry_against_a_saved_index():
    result = invoke(
        "ops",
        "--index",
        str(REPORTS / "ops" / "cpu-float32_torch-2.14.1.json.gz"),
        "--from-sweep",
        str(REPORTS / "torchvision_torch-2.14.1_cpu_eager.json.gz"),
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("│")]
    assert lines and "MiB" in lines[0]
    assert any("F.instance_norm" in line and "instance_norm: loses" in line for line in lines)


@pytest.mark.parametrize(
    "path", sorted((REPORTS / "ops").glob("*.json.gz")), ids=lambda p: p.name.split(".")[0]
)
def test_the_committed_indexes_match_the_schema_and_read_back(path):
    data = json.loads(gzip.decompress(path.read_bytes()))
    jsonschema.validate(data, load_schema("ops", data["version"]))
    index = OpsIndex.from_dict(data)
    written = {**data, "version": OPS_VERSION, "gradients_not_judged": index.gradients_not_judged}
    if data["version"] < 4:  # no cases nor reasons before version 4
        written["unjudged"] = []
        written["rows"] = [{**row, "cases": []} for row in data["rows"]]
    assert index.rows and index.to_dict() == written
    assert index.predicted == path.name.startswith("cuda")


def _copying_relu(x: torch.Tensor) -> torch.Tensor:
    """A kernel that makes its input NCHW inside, computes, and hands back channels_last."""
    return x.contiguous().relu().contiguous(memory_format=torch.channels_last)


def test_a_kernel_that_copies_inside_is_copies_where_one_that_does_not_keeps():
    """The profiler's ``aten::copy_`` events inside the channels_last call, beyond the NCHW
    call's: ``_copying_relu`` keeps the order but converts twice; relu is the control."""
    sample = [Sample(_map(2, 3, 8, 8), (), {})]
    copying = operator_row(OperatorEntry("toy.copying_relu", _copying_relu, lambda: iter(sample)))
    assert copying.behaviour is B.COPIES and "copies" in copying.example.note
    # two conversions of the map, where the NCHW call converts once (on the way out)
    assert copying.example.copied == 2 * 3 * 8 * 8 * 4
    plain = operator_row(OperatorEntry("toy.relu", torch.relu, lambda: iter(sample)))
    assert plain.behaviour is B.KEEPS and plain.example.copied == 0


def test_a_list_given_first_counts_by_its_first_map():
    """``torch.cat`` takes its maps in a list: each is made channels_last; the control
    concatenates their NCHW copies, and loses."""
    maps = ([_map(2, 3, 4, 4), _map(2, 5, 4, 4)],)
    sample = Sample(maps[0], (1,), {})
    kept = probe_sample(torch.cat, sample)
    assert kept.behaviour is B.KEEPS and kept.input_strides == (48, 1, 12, 3)
    assert kept.gradient is B.KEEPS
    lost = probe_sample(lambda xs, dim: torch.cat([t.contiguous() for t in xs], dim), sample)
    assert lost.behaviour is B.LOSES


def test_pooling_indices_are_made_channels_last_with_the_data():
    """A channels_last model's max pooling hands channels_last indices to max_unpool, which
    then keeps the order without copying them (NCHW indices beside channels_last data made the
    kernel copy them: a finding about the sample, not the operator)."""
    x = _map(2, 3, 8, 8)
    pooled, indices = F.max_pool2d(x, 2, return_indices=True)
    entry = OperatorEntry(
        "toy.max_unpool2d",
        lambda t, i: F.max_unpool2d(t, i, 2),
        lambda: iter([Sample(pooled, (indices,), {})]),
    )
    row = operator_row(entry)
    assert row.behaviour is B.KEEPS and row.example.copied == 0


@pytest.mark.skipif(opinfo_problem() is not None, reason=str(opinfo_problem()))
def test_torchs_module_database_gives_rows_per_module_and_mode():
    """``module_db``'s samples run through the module with its parameters made channels_last
    as ``module.to(memory_format=...)`` does: a convolution keeps the order; instance norm,
    the control, loses it; batch norm has a row per mode (its training and evaluation
    differ)."""
    from cl_audit.compat.opinfo import module_entries

    wanted = ("nn.Conv2d", "nn.InstanceNorm2d", "nn.BatchNorm2d", "nn.BatchNorm2d.train")
    entries = [e for e in module_entries("cpu", torch.float32) if e.name in wanted]
    rows = {e.name: operator_row(e) for e in entries}
    assert set(rows) == set(wanted)
    assert rows["nn.Conv2d"].behaviour is B.KEEPS and rows["nn.Conv2d"].gradient is B.KEEPS
    assert rows["nn.InstanceNorm2d"].behaviour is B.LOSES
    assert rows["nn.BatchNorm2d.train"].behaviour is B.KEEPS


def test_a_version_1_index_reads_without_copies():
    row = OperatorRow(
        "conv", B.KEEPS, ((B.KEEPS, 1),), SampleResult(B.KEEPS, (1, 2, 3, 3), (18, 1, 6, 2))
    )
    data = OpsIndex("2.14.1", "cpu", "float32", (row,), 0, 1.0).to_dict()
    data["version"] = 1
    del data["rows"][0]["example"]["copied"], data["gradients_not_judged"]
    del data["unjudged"], data["rows"][0]["cases"]
    jsonschema.validate(data, load_schema("ops", 1))
    index = OpsIndex.from_dict(data)
    assert index.rows[0].example.copied is None and index.rows[0].behaviour is B.KEEPS


def _link(*counts: tuple[OpBehaviour, int]) -> OpLink:
    row = OperatorRow("nn.functional.interpolate.bilinear", counts[0][0], counts, None)
    return OpLink("F.interpolate", "aten.upsample_bilinear2d", 1024, (row,))


def test_a_links_reading_says_whether_the_operator_always_loses_or_only_here():
    assert "the operator's to fix" in _link((B.LOSES, 3)).reading
    assert "2 of its 5 samples" in _link((B.LOSES, 2), (B.KEEPS, 3)).reading
    assert "lost with this model's" in _link((B.KEEPS, 4)).reading
    assert "not in the index" in OpLink("F.thing", None, 1, ()).reading


def test_a_models_losses_link_to_the_index_rows_in_the_terminal_and_html(tmp_path):
    """``MixedConcat``'s pooled branch loses the format at its bilinear interpolation of a 1x1
    map: the index's bilinear row (the aten operation that made the output) keeps it in torch's
    samples, so the loss is this model's strides; the nearest row, the control, is not linked."""
    rows = (
        OperatorRow(
            "nn.functional.interpolate.bilinear",
            B.KEEPS,
            ((B.KEEPS, 4),),
            None,
            aten_ops=("aten.upsample_bilinear2d",),
        ),
        OperatorRow(
            "nn.functional.interpolate.nearest",
            B.LOSES,
            ((B.LOSES, 4),),
            None,
            aten_ops=("aten.upsample_nearest2d",),
        ),
    )
    index = tmp_path / "ops.json"
    index.write_text(OpsIndex("2.14.1", "cpu", "float32", rows, 0, 1.0).to_json())
    html = tmp_path / "model.html"
    model = (f"{TOYS}:MixedConcat", "--input-size", "3x16x16", *ANY_COST)
    wide = runner.invoke(
        app, [*model, "--ops-index", str(index), "--html", str(html)], env={"COLUMNS": "400"}
    )
    result = wide
    assert result.exit_code == 1, result.output
    assert "In torch's operator index" in result.output
    line = next(x for x in result.output.splitlines() if "F.interpolate (aten" in x)
    assert "nn.functional.interpolate.bilinear: keeps" in line and "nearest" not in line
    assert "keeps the order in all 4 of its samples" in line
    page = html.read_text()
    assert "keeps the order in all 4 of its samples" in page
    assert 'href="#op-nn.functional.interpolate.bilinear"' in page
    assert 'id="op-nn.functional.interpolate.bilinear"' in page
    assert "op-nn.functional.interpolate.nearest" not in page
    report = tmp_path / "report.json"
    assert invoke(*model, "--json", str(report)).exit_code == 1
    again = tmp_path / "again.html"
    rendered = invoke("render", str(report), "--html", str(again), "--ops-index", str(index))
    assert (
        rendered.exit_code == 0
        and 'href="#op-nn.functional.interpolate.bilinear"' in again.read_text()
    )


def test_ops_index_is_refused_for_a_sweep_and_unreadable_indexes_before_any_model_runs(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = invoke(f"{TOYS}:MixedConcat", "--ops-index", str(bad))
    assert result.exit_code == 2 and "Traceback" not in result.output
    good = tmp_path / "ops.json"
    good.write_text(OpsIndex("2.14.1", "cpu", "float32", (), 0, 1.0).to_json())
    result = invoke(
        "--torchvision", "resnet18", "--torchvision", "alexnet", "--ops-index", str(good)
    )
    assert result.exit_code == 2 and "--from-sweep" in result.output


@pytest.mark.skipif(fake_cuda_problem() is not None, reason=str(fake_cuda_problem()))
def test_a_fake_call_reaching_the_cuda_runtime_is_its_rows_error_not_an_invalid_sample():
    """torch 2.9 and earlier reach the CUDA runtime from some fake CUDA calls: that row says
    there is no prediction; a sample that is merely invalid (the control) is not counted."""

    def reaches_runtime(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: CUDA driver version is insufficient for CUDA runtime")

    def invalid(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("not for these arguments")

    cuda = target_for("cuda")
    sample = [Sample(_map(2, 3, 8, 8), (), {})]
    row = operator_row(OperatorEntry("toy.runtime", reaches_runtime, lambda: iter(sample)), cuda)
    assert row.behaviour is None and "no prediction" in row.error and "CUDA error" in row.error
    invalid_row = operator_row(OperatorEntry("toy.invalid", invalid, lambda: iter(sample)), cuda)
    assert isinstance(invalid_row, Unjudged) and "not for these arguments" in invalid_row.reason


def _entry(name: str, call, *samples: Sample, **kwargs) -> OperatorEntry:
    return OperatorEntry(name, call, lambda: iter(samples), **kwargs)


def test_an_operator_without_4d_samples_is_judged_on_samples_raised_to_4d():
    """relu's database samples are 1-D and 2-D (as softmax's are): raised, with leading
    dimensions and their values repeated, relu keeps channels_last; a matrix sample keeps its
    two last dimensions (matmul works on them)."""
    row = operator_row(_entry("toy.relu", F.relu, Sample(_map(5, 7), (), {})))
    (case,) = row.cases
    assert case.case == "raised" and row.behaviour is B.KEEPS
    assert row.example.input_shape == (2, 3, 5, 7) and row.example.gradient is B.KEEPS
    products = operator_row(
        _entry("toy.matmul", torch.matmul, Sample(_map(4, 6), (_map(6, 5),), {}))
    )
    assert products.example.input_shape == (2, 3, 4, 6)
    assert products.example.output_shape == (2, 3, 4, 5)
    # the control: the same raise of an operator that loses (softmax over the last dimension)
    lost = operator_row(_entry("toy.softmax", lambda t: t.softmax(-1), Sample(_map(5, 7), (), {})))
    assert lost.behaviour is B.LOSES


def test_an_operator_that_takes_no_4d_input_is_listed_with_its_reason():
    refused = operator_row(_entry("toy.dot", torch.dot, Sample(_map(5), (_map(5),), {})))
    assert isinstance(refused, Unjudged) and "1D tensors expected" in refused.reason
    factory = operator_row(_entry("toy.zeros", lambda size: torch.zeros(size), Sample(3, (), {})))
    assert isinstance(factory, Unjudged) and factory.reason.startswith("no sample takes a tensor")
    skipped = operator_row(_entry("toy.ints", F.relu, unsupported="takes no float32 on cpu"))
    assert skipped == Unjudged("toy.ints", "takes no float32 on cpu")
    # the control: an operator of a 1-D sample that broadcasts is judged
    assert isinstance(
        operator_row(_entry("toy.neg", torch.neg, Sample(_map(5), (), {}))), OperatorRow
    )


def test_a_reduction_and_a_scan_are_judged_over_each_dimension():
    """cumsum and softmax over the channels lose channels_last on the CPU (2.14.1 measured:
    over every dimension); a sort along a dimension keeps it over each: the control."""

    def over(name, call, keepdim=False):
        entry = _entry(name, call, Sample(_map(6, 8), (1,), {}), dim_position=0, keepdim=keepdim)
        return {c.case: c.behaviour for c in operator_row(entry).cases}

    cumsum = over("toy.cumsum", torch.cumsum)
    assert {"dim=N", "dim=C", "dim=H", "dim=W"} <= cumsum.keys() and cumsum["dim=C"] is B.LOSES
    assert over("toy.softmax", torch.softmax)["dim=C"] is B.LOSES
    flipped = over("toy.flip", lambda t, dim: t.flip(dim))
    assert flipped["dim=C"] is B.KEEPS and flipped["dim=H"] is B.KEEPS
    summed = over("toy.sum", torch.sum, keepdim=True)
    assert summed["dim=C"] is B.NO_MAP and summed["dim=C keepdim"] is B.AMBIGUOUS  # 1 channel
    assert summed["dim=H keepdim"] is B.LOSES


def test_an_operator_of_two_tensors_says_which_layout_its_output_takes_when_they_differ():
    x = Sample(_map(2, 3, 8, 8), (_map(2, 3, 8, 8),), {})
    row = operator_row(
        _entry("toy.add", torch.add, x, inplace=torch.Tensor.add_, supports_out=True)
    )
    cases = {c.case: c.behaviour for c in row.cases}
    assert cases["channels_last + NCHW"] is B.KEEPS  # the first input's layout wins
    assert cases["NCHW + channels_last"] is B.LOSES
    assert cases["channels_last + (1, C, 1, 1)"] is B.KEEPS
    assert cases["channels_last + scalar"] is B.KEEPS
    assert cases["in-place"] is B.KEEPS and cases["out="] is B.KEEPS
    # mixed cases say what the output takes; the row's own behaviour is its samples'
    assert row.behaviour is B.KEEPS and dict(row.counts) == {B.KEEPS: 1}
    # the control: an operator of one tensor has no mixed case but its in-place form
    relu = operator_row(_entry("toy.relu", F.relu, Sample(_map(2, 3, 8, 8), (), {})))
    assert [c.case for c in relu.cases] == ["samples"]


@pytest.mark.skipif(opinfo_problem() is not None, reason=str(opinfo_problem()))
def test_cl_audit_ops_op_add_shows_each_mixed_case_with_the_outputs_layout(tmp_path):
    out = tmp_path / "ops.json"
    result = invoke("ops", "--op", "add", "--op", "item", "--json", str(out))
    assert result.exit_code == 0, result.output
    for case in ("channels_last + NCHW", "NCHW + channels_last", "channels_last + scalar"):
        assert case in result.output
    assert "channels_last" in result.output and "NCHW" in result.output
    assert "item: not judged, no sample runs with a 4-D input" in result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema("ops"))
    index = OpsIndex.from_dict(data)
    assert [u.op for u in index.unjudged] == ["item"] and index.without_map == 1
    (add,) = index.rows
    assert add.case("channels_last + NCHW").behaviour is B.KEEPS


def test_the_diff_names_a_case_that_moved():
    def index(version: str, behaviour: OpBehaviour) -> OpsIndex:
        case = CaseRow("dim=C", behaviour, ((behaviour, 1),), SampleResult(behaviour, (2,), (1,)))
        row = OperatorRow("cumsum", B.LOSES, ((B.LOSES, 1),), None, cases=(case,))
        return OpsIndex(version, "cpu", "float32", (row,), 0, 1.0)

    (change,) = diff(index("2.14", B.LOSES), index("2.15", B.KEEPS))
    assert change.case == "dim=C" and change.better
    assert diff(index("2.14", B.LOSES), index("2.15", B.LOSES)) == ()  # the control


def test_a_lower_rank_tensor_aligned_with_the_inputs_batch_is_raised_with_it():
    """An LU's pivots (3, 3) beside its (3, 3, 5) factor hold one value per leading entry:
    raising the factor alone would misalign them (torch 2.4.1's lu_unpack aborts the process on
    that), so they get the same leading dimensions; a lower-rank tensor that broadcasts (a (5,)
    bias) is the control, left as it is."""

    def call(x, other):
        return x * other.float().sum()

    aligned = Sample(_map(3, 3, 5), (torch.zeros(3, 3, dtype=torch.int32),), {})
    (raised,) = [c for c in cases(_entry("toy.lu", call, aligned)) if c.label == "raised"]
    assert raised.sample.input.shape == (2, 3, 3, 5) and raised.sample.args[0].shape == (2, 3, 3)
    broadcast = Sample(_map(3, 3, 5), (_map(5),), {})
    (raised,) = [c for c in cases(_entry("toy.bias", call, broadcast)) if c.label == "raised"]
    assert raised.sample.input.shape == (2, 3, 3, 5) and raised.sample.args[0].shape == (5,)
