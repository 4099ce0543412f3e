"""The report codec: nested frozen dataclasses written and read back by their type hints, and
reports of old and current versions written again exactly as they were read."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum, unique
from pathlib import Path
from typing import ClassVar

import jsonschema
import pytest
from literal_reports import (
    before_version_7,
    before_version_9,
    before_version_10,
    before_version_11,
    before_version_13,
    model_report,
)

from cl_audit.enums import (
    BucketMatch,
    ConvClass,
    CopyKind,
    CostKind,
    Differential,
    Evidence,
    Fate,
    LayoutBranch,
    Phase,
    TensorMode,
    Verdict,
    WrapOrder,
)
from cl_audit.render.wording import predicted_note
from cl_audit.report import (
    REPORT_VERSION,
    Compiled,
    CompiledConv,
    CompiledCopy,
    CompiledGraph,
    CompiledSite,
    Cost,
    CostSite,
    Gate,
    ModelReport,
    Producer,
    SweepReport,
    Timing,
    load_schema,
)
from cl_audit.report.codec import JsonForm, decode, encode
from cl_audit.report.distributed_report import (
    BucketParameter,
    DdpCheck,
    DdpRun,
    FsdpCheck,
    FsdpRun,
    ShardedParameter,
)

DATA = Path(__file__).with_name("data")


@unique
class Colour(str, Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Leaf:
    colour: Colour
    size: tuple[int, ...]
    ratio: float = 1.0

    json_form: ClassVar[JsonForm] = JsonForm(
        keys={"colour": "class"}, written={"ratio": lambda r: round(r, 2)}, derived=("area",)
    )

    @property
    def area(self) -> int:
        return self.size[0] * self.size[1]


@dataclass(frozen=True)
class Tree:
    name: str
    leaves: tuple[Leaf, ...]
    best: Leaf | None
    pair: tuple[str, int]
    by_name: dict[str, Colour]
    parent: Tree | None = None


TREE = Tree(
    name="oak",
    leaves=(Leaf(Colour.RED, (2, 3)), Leaf(Colour.BLUE, (1, 4), 0.5)),
    best=None,
    pair=("a", 1),
    by_name={"x": Colour.BLUE},
    parent=Tree("root", (), Leaf(Colour.RED, (1, 1)), ("b", 2), {}),
)


def test_nested_dataclasses_round_trip_by_their_type_hints():
    data = encode(TREE)
    assert data == {
        "name": "oak",
        "leaves": [
            {"class": "red", "size": [2, 3], "ratio": 1.0, "area": 6},
            {"class": "blue", "size": [1, 4], "ratio": 0.5, "area": 4},
        ],
        "best": None,
        "pair": ["a", 1],
        "by_name": {"x": "blue"},
        "parent": {
            "name": "root",
            "leaves": [],
            "best": {"class": "red", "size": [1, 1], "ratio": 1.0, "area": 1},
            "pair": ["b", 2],
            "by_name": {},
            "parent": None,
        },
    }
    again = decode(Tree, json.loads(json.dumps(data)))
    assert again == TREE and type(again.leaves[0].colour) is Colour
    assert type(again.pair) is tuple and type(again.leaves[0].size) is tuple


def test_written_values_defaults_and_unknown_keys():
    assert encode(Leaf(Colour.RED, (1, 1), 1 / 3))["ratio"] == 0.33  # changed on writing only
    leaf = decode(Leaf, {"class": "blue", "size": [2, 2], "area": 99, "other": 1})
    assert leaf == Leaf(Colour.BLUE, (2, 2))  # a missing key takes its default; unknown skipped
    with pytest.raises(KeyError, match="size"):
        decode(Leaf, {"class": "blue"})
    with pytest.raises(ValueError):
        decode(Leaf, {"class": "green", "size": []})


def test_a_version_1_report_is_written_again_as_it_was_read():
    old = ModelReport.from_dict(json.loads((DATA / "report-v1.json").read_text()))
    data = old.to_dict()
    jsonschema.validate(data, load_schema())
    again = ModelReport.from_dict(json.loads(json.dumps(data)))
    assert again == old and json.dumps(again.to_dict()) == json.dumps(data)


def test_a_version_1_sweep_is_written_again_as_it_was_read():
    old = SweepReport.from_dict(json.loads((DATA / "sweep-v1.json").read_text()))
    data = old.to_dict()
    jsonschema.validate(data, load_schema("sweep"))
    again = SweepReport.from_dict(json.loads(json.dumps(data)))
    assert again == old and json.dumps(again.to_dict()) == json.dumps(data)


def _full_report() -> ModelReport:
    """The literal report with timing, cost and compiled graphs: every class of the model."""
    site = CostSite(
        CostKind.COPY, Phase.FORWARD, "torch.flatten", "aten.clone", "", None, "net.py:120",
        4096, 0, 1, 0,
    )  # fmt: skip
    conv = CompiledConv(
        "net.py:10", "conv", "Conv2d", ConvClass.GROUPED, 16, 8, 128, (3, 3), 0.5, True
    )
    copy = CompiledCopy(
        "net.py:95", "stage2.1", "aten.cat", "aten.view", "net.py:96", CopyKind.TO_CONTIGUOUS,
        (2, 8, 4, 4), (128, 1, 32, 8), (128, 16, 4, 1), 1024,
    )  # fmt: skip
    graph = CompiledGraph(
        index=0, phase=Phase.FORWARD, inference=True, layout_optimization=True,
        branch=LayoutBranch.VOTE, reason="the vote", nodes=12, forced=False,
        convolutions=(conv,), conversions=(copy,), forced_conversions=None,
    )  # fmt: skip
    base = model_report()
    neutral = tuple(replace(f, differential=Differential.NEUTRAL) for f in base.format_neutral)
    return replace(
        base,
        format_neutral=neutral,
        timing=Timing("cpu", 2, 3.0, (3.0, 2.5, 3.5), 9.0, 0.25, 0.5, 0.125),
        cost=Cost(Gate(), Verdict.MINOR, 1 << 20, 4096, 0, Evidence.MEASURED, (site,)),
        compiled=Compiled(
            "cpu", "cpu", False, "2.14.1", True, True, 1.25, (graph,),
            (CompiledSite("net.py:95", "stage2.1", Fate.KEPT, 3, 3072, 1, 1024),),
        ),
        ddp=DdpCheck(2, "gloo", (DdpRun(WrapOrder.AFTER, True, "Grad strides", 512, (
            BucketParameter("conv.weight", (8, 3, 3, 3), (27, 1, 9, 3), (27, 9, 3, 1),
                            (27, 9, 3, 1), BucketMatch.MISMATCHED),
        )),), True),
        fsdp=FsdpCheck(2, "gloo", (
            FsdpRun("fsdp2", None, (ShardedParameter("conv.weight", (8, 3, 3, 3), (27, 1, 9, 3),
                                                     None, None),),
                    ("conv.weight",), "NotImplementedError: non-contiguous"),
            FsdpRun("fsdp1", True, (ShardedParameter("conv.weight", (8, 3, 3, 3), (27, 1, 9, 3),
                                                     (27, 1, 9, 3), True),)),
        )),
    )  # fmt: skip


def test_a_version_5_report_is_written_again_exactly():
    report = _full_report()
    data = report.to_dict()
    jsonschema.validate(data, load_schema())
    text = json.dumps(data, indent=2)
    again = ModelReport.from_dict(json.loads(text))
    assert again == report and json.dumps(again.to_dict(), indent=2) == text
    assert data["compiled"]["graphs"][0]["convolutions"][0]["class"] == "grouped"
    assert data["timing"]["share"] == (0.25 + 0.125) / 3.0 and data["cost"]["net_bytes"] == 4096


def test_a_version_9_report_reads_its_compiled_graphs_as_traced_on_fake_tensors():
    """Version 10 names the operation that made the compiled graphs traced on real values;
    version 9 wrote no such key, and its graphs were traced on fake tensors."""
    report = _full_report()
    report = replace(
        report, compiled=replace(report.compiled, data_dependent="aten.nonzero.default")
    )
    current = report.to_dict()
    jsonschema.validate(current, load_schema("report"))
    assert current["compiled"]["data_dependent"] == "aten.nonzero.default"
    data = before_version_10(current) | {"version": 9}
    jsonschema.validate(data, load_schema("report", 9))
    old = ModelReport.from_dict(data)
    assert old.compiled.data_dependent is None and old.compiled.graphs == report.compiled.graphs


def test_a_version_10_report_reads_without_a_ddp_check():
    """Version 11 added ``ddp`` (``--train --ddp``), which a version 10 schema refuses."""
    current = _full_report().to_dict()
    jsonschema.validate(current, load_schema("report"))
    assert current["ddp"]["runs"][0]["parameters"][0]["match"] == "mismatched"
    data = before_version_11(current) | {"version": 10}
    jsonschema.validate(data, load_schema("report", 10))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(current | {"version": 10}, load_schema("report", 10))
    assert ModelReport.from_dict(data).ddp is None and ModelReport.from_dict(data).fsdp is None
    assert ModelReport.from_dict(current) == _full_report()


def test_a_version_11_replayed_report_reads_and_renders_as_it_was_made():
    """Version 12 says ``fake-step`` for a fake training step, which a version 11 schema
    refuses; a version 11 document's ``replayed`` still reads, is predicted, and renders as a
    traced step (the control: a version 12 one says node by node)."""
    current = _full_report().to_dict()
    fake_step = current | {"environment": current["environment"] | {"mode": "fake-step"}}
    jsonschema.validate(fake_step, load_schema("report"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            before_version_13(fake_step) | {"version": 11}, load_schema("report", 11)
        )
    replayed = before_version_13(current) | {
        "version": 11,
        "environment": current["environment"] | {"mode": "replayed"},
    }
    jsonschema.validate(replayed, load_schema("report", 11))
    old, new = ModelReport.from_dict(replayed), ModelReport.from_dict(fake_step)
    assert old.predicted and old.environment.mode is TensorMode.REPLAYED
    assert "from a traced step" in predicted_note(old)
    assert "the backward run node by node" in predicted_note(new)


def test_a_version_8_report_reads_its_cost_sites_without_a_root_cause():
    """Version 9 names where a cost site's NCHW data began; version 8 wrote no such key."""
    report = _full_report()
    began = Producer("Tensor.contiguous", "aten.clone", "attn", "Attention", "net.py:90")
    site = replace(report.cost.sites[0], root_cause=began)
    report = replace(report, cost=replace(report.cost, sites=(site,)))
    current = report.to_dict()
    jsonschema.validate(current, load_schema("report"))
    assert current["cost"]["sites"][0]["root_cause"]["call_site"] == "net.py:90"
    data = before_version_9(current) | {"version": 8}
    jsonschema.validate(data, load_schema("report", 8))
    old = ModelReport.from_dict(data)
    assert old.cost.sites[0].root_cause is None
    assert old.cost.sites[0].fix_site == site.fix_site and old.verdict is report.verdict


def test_a_version_6_report_reads_as_judged_at_its_audited_batch():
    """Version 7 judges the cost at the gate's batch; a version 6 cost has none, and reads
    back with the verdict it was written with, judged at the audited batch (not projected)."""
    report = _full_report()
    old = ModelReport.from_dict(before_version_7(report.to_dict()) | {"version": 6})
    jsonschema.validate(
        before_version_7(report.to_dict()) | {"version": 6}, load_schema("report", 6)
    )
    assert old.cost.gate.batch is None and old.cost.batch is None
    assert old.verdict is report.verdict and not old.cost.at_gate.projected
    written = old.to_dict()
    assert written["version"] == REPORT_VERSION and written["cost"]["at_gate"]["projected"] is False
    jsonschema.validate(written, load_schema("report"))


def test_a_version_4_report_reads_without_the_lowerings_copies():
    """Version 5 added each graph's copies and the side-by-side sites; version 4 lacks them."""
    data = before_version_7(_full_report().to_dict()) | {"version": 4}
    compiled = data["compiled"] = {k: v for k, v in data["compiled"].items() if k != "sites"}
    lowering = ("conversions", "forced_conversions", "lowering_error")
    compiled["graphs"] = [
        {k: v for k, v in g.items() if k not in lowering} for g in compiled["graphs"]
    ]
    jsonschema.validate(data, load_schema("report", 4))
    old = ModelReport.from_dict(data)
    assert old.compiled.sites is None and old.compiled.graphs[0].conversions is None
    written = old.to_dict()
    assert (
        written["version"] == REPORT_VERSION
        and written["compiled"]["graphs"][0]["conversions"] is None
    )
    assert ModelReport.from_dict(json.loads(json.dumps(written))) == old
