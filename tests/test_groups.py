"""The cost sites grouped by what fixes them (``group_sites``): the one grouping the terminal, the
page and the JSON (``cost.groups``) read."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest
import torch
import toy_models
from literal_reports import before_version_15
from rich.console import Console

import cl_audit
from cl_audit.enums import CostKind, Evidence, Phase, RemedyStatus
from cl_audit.render.terminal import cost_table
from cl_audit.report import Cost, CostSite, Gate, ModelReport, Producer, Remedy, load_schema
from cl_audit.report.verdict import group_sites


@pytest.fixture(scope="module")
def report() -> ModelReport:
    """A real report (a small model's audit) whose cost the tests replace."""
    return cl_audit.audit_model(toy_models.MixedConcat(), torch.randn(2, 3, 16, 16), name="mixed")


NORM = Remedy("group norm backward", "advice", "pytorch#1", RemedyStatus.VERIFIED)


def _site(block: int, *, extra: int = 1 << 20, line: str = "timm/layers/norm.py:40",
          remedy: Remedy | None = NORM, module_class: str = "GroupNorm") -> CostSite:  # fmt: skip
    """The group norm's backward site of block ``block`` of a repeated stage, its NCHW data
    from the activation before it (the same line in every block)."""
    fix = Producer("F.silu", "aten.silu", f"stages.{block}.act", "SiLU", "timm/layers/act.py:9")
    return CostSite(
        kind=CostKind.KERNEL,
        phase=Phase.BACKWARD,
        op="NativeGroupNormBackward0",
        aten_op="aten.native_group_norm_backward",
        module_path=f"stages.{block}.norm",
        module_class=module_class,
        call_site=line,
        channels_last_bytes=extra,
        nchw_bytes=0,
        channels_last_count=1,
        nchw_count=0,
        fix_site=fix,
        remedy=remedy,
    )


def test_a_repeated_blocks_sites_form_one_group_costliest_member_first():
    sites = tuple(_site(b, extra=(1 << 20) * (b + 1)) for b in range(77))
    sites = tuple(sorted(sites, key=lambda s: -s.extra))
    (group,) = group_sites(sites)
    assert len(group.sites) == 77 and group.sites[0] == 0
    assert group.extra == sum(s.extra for s in sites) and group.share == 1.0
    assert (group.op, group.module_class, group.call_site) == (
        "NativeGroupNormBackward0", "GroupNorm", "timm/layers/norm.py:40")  # fmt: skip


def test_a_different_remedy_at_the_same_line_is_another_group():
    other = Remedy("group norm backward", "advice", "pytorch#1", RemedyStatus.REFUTED)
    sites = (_site(0), _site(1), _site(2, remedy=other), _site(3, remedy=None))
    groups = group_sites(sites)
    assert sorted(len(g.sites) for g in groups) == [1, 1, 2]
    assert {sites[g.sites[0]].remedy for g in groups} == {NORM, other, None}


def test_another_line_or_class_is_another_group_and_sites_nchw_pays_for_are_in_none():
    saved = replace(_site(4), channels_last_bytes=0, nchw_bytes=1 << 20)
    sites = (
        _site(0),
        _site(1, line="timm/layers/norm.py:41"),
        _site(2, module_class="Norm"),
        saved,
    )
    groups = group_sites(sites)
    assert len(groups) == 3 and all(len(g.sites) == 1 for g in groups)
    assert 3 not in {p for g in groups for p in g.sites}  # saved bytes: nothing to fix there
    control = group_sites((_site(0), _site(1)))  # the same line, class and remedy: one group
    assert [len(g.sites) for g in control] == [2]


def _cost(sites: tuple[CostSite, ...]) -> Cost:
    extra = sum(s.extra for s in sites)
    gate = Gate()
    return Cost(gate, gate.verdict(extra, 1 << 30, None), 1 << 30, extra, 0, Evidence.MEASURED,
                sites)  # fmt: skip


def test_the_terminal_folds_the_same_groups_the_json_carries(report: ModelReport):
    sites = (*(_site(b) for b in range(5)), _site(9, line="models/net.py:3"))
    cost = _cost(sites)
    written = replace(report, cost=cost).to_dict()
    jsonschema.validate(written, load_schema("report"))
    groups = written["cost"]["groups"]
    assert [len(g["sites"]) for g in groups] == [5, 1]
    console = Console(width=140, no_color=True, record=True)
    with console.capture() as capture:
        console.print(cost_table(cost.sites, train=True))
    text = capture.get()
    assert "stages.0.norm (GroupNorm) and 4 more modules" in text
    assert text.count("NativeGroupNormBackward0") == len(groups)


def test_a_version_14_document_reads_with_its_groups_computed(report: ModelReport):
    cost = _cost(tuple(_site(b) for b in range(3)))
    data = before_version_15(replace(report, cost=cost).to_dict()) | {"version": 14}
    jsonschema.validate(data, load_schema("report", 14))
    old = ModelReport.from_dict(json.loads(json.dumps(data)))
    assert [len(g.sites) for g in old.cost.groups] == [3]
    newer = {**data, "cost": {**data["cost"], "groups": []}}
    with pytest.raises(jsonschema.ValidationError):  # a version 14 reader refuses the groups
        jsonschema.validate(newer, load_schema("report", 14))


def test_each_member_of_a_group_carries_its_strides_in_the_json_and_on_the_page(report):
    """A real audit's sites carry their first call's strides, in and out (version 15): the
    page prints them beside each member's module and bytes."""
    from cl_audit.render.html_model import model_html

    site = report.cost.sites[0]
    assert site.strides is not None and len(site.strides) == 2
    written = report.to_dict()
    jsonschema.validate(written, load_schema("report"))
    assert ModelReport.from_dict(json.loads(json.dumps(written))).cost.sites[0] == site
    source, output = site.strides
    assert f"{source} &rarr; {output}" in model_html(report)
    old = before_version_15(written) | {"version": 14}
    jsonschema.validate(old, load_schema("report", 14))  # version 14 wrote none
    assert ModelReport.from_dict(old).cost.sites[0].strides is None
