"""Baseline comparison, merge and JUnit on literal sweep reports."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from literal_reports import finding, row, sweep

from cl_audit.errors import UsageError
from cl_audit.render.junit import junit_xml
from cl_audit.report import Status as S
from cl_audit.report import SweepReport, compare, merge

CAT = finding()
FLATTEN = finding("torch.flatten", "aten.clone", round_trips=0)


def test_baseline_gates_new_offences_and_failures_only():
    old = sweep(row("a", (CAT,)), row("b"), row("c", status=S.ERROR, message="boom"))
    new = sweep(row("a", (FLATTEN,)), row("b", (CAT,)), row("c"))
    comparison = compare(old, new)
    assert comparison.new_offences == (("timm:a", "aten.clone"), ("timm:b", "aten.cat"))
    assert comparison.fixed_offences == (("timm:a", "aten.cat"),)
    assert comparison.fixed_failures == ("timm:c",) and comparison.new_failures == ()
    assert comparison.regressed


def test_a_model_missing_now_fixes_nothing_and_same_offences_pass():
    old = sweep(row("a", (CAT,)), row("b", (CAT,)))
    comparison = compare(old, sweep(row("a", (CAT,))))
    assert comparison.fixed_offences == () and not comparison.regressed


def test_offences_are_identified_by_the_aten_op_not_the_python_name():
    renamed = finding("Tensor.cat", "aten.cat")
    assert not compare(sweep(row("a", (CAT,))), sweep(row("a", (renamed,)))).regressed


def test_merge_keeps_every_row_and_refuses_duplicates_and_versions():
    merged = merge([sweep(row("a", (CAT,))), sweep(row("b"))])
    assert [r.name for r in merged.models] == ["a", "b"]
    assert merged.summary.offending == 1 and merged.settings["merged_from"] == 2
    with pytest.raises(UsageError, match="is in two reports"):
        merge([sweep(row("a")), sweep(row("a", (CAT,)))])
    with pytest.raises(UsageError, match="different versions"):
        merge([sweep(row("a")), sweep(row("b"), tool="9.9")])
    forced = merge([sweep(row("a")), sweep(row("a", (CAT,)))], force=True)
    assert forced.models[0].offenders == (CAT,)


def test_junit_maps_offenders_failures_and_skips():
    report = sweep(
        row("off", (CAT, FLATTEN)),
        row("clean"),
        row("crash", status=S.TIMEOUT, message="no result after 5 s"),
        row("small", status=S.SKIPPED, message="below 128 px"),
    )
    suite = ET.fromstring(junit_xml(report))
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "1")
    cases = {c.get("name"): c for c in suite}
    failure = cases["off"].find("failure")
    assert failure.get("message") == "2 losses: torch.cat, torch.flatten"
    assert "torch.cat (aten.cat) in stage2.1 at models/net.py:95 x1" in failure.text
    assert cases["crash"].find("error").get("message") == "forward: no result after 5 s"
    assert cases["small"].find("skipped").get("message") == "below 128 px"
    assert cases["clean"].find("failure") is None and cases["clean"].get("classname") == "timm"


def test_operator_index_counts_offenders_parameters_and_neutral_apart():
    from dataclasses import replace

    from cl_audit.report import Provenance

    param = finding("F.batch_norm", "aten.clone", provenance=Provenance.PARAMETER)
    a = replace(row("a", (FLATTEN,)), parameter_conversions=(param,))
    b = replace(row("b"), format_neutral=(FLATTEN,), parameter_conversions=(param,))
    report = sweep(a, b)
    (clone,) = report.operators
    assert (clone.models, clone.parameter_models, clone.neutral_models) == (1, 2, 1)
    assert (clone.events, clone.parameter_events, clone.neutral_events) == (1, 2, 1)
    again = SweepReport.from_json(report.to_json())
    assert again.operators == report.operators and again.models == report.models


def test_version_1_sweeps_are_read_merged_and_compared():
    from pathlib import Path

    import jsonschema

    from cl_audit.report import load_schema
    from cl_audit.report.files import read_sweep

    path = Path(__file__).with_name("data") / "sweep-v1.json"
    jsonschema.validate(__import__("json").loads(path.read_text()), load_schema("sweep", 1))
    old = read_sweep(path)
    assert {r.name for r in old.models if r.offending} == {"cait_xxs24_224", "nfnet_l0"}
    assert all(r.parameter_conversions == () for r in old.models)
    assert sum(1 for r in old.models if r.status.failed) == 1
    now = sweep(row("cait_xxs24_224"), row("nfnet_l0"), row("resnest14d", (CAT,)))
    comparison = compare(old, now)
    assert comparison.new_offences == (("timm:resnest14d", "aten.cat"),)
    assert {key for key, _ in comparison.fixed_offences} == {"timm:cait_xxs24_224", "timm:nfnet_l0"}
    merged = merge([old, sweep(row("other"))], force=True)
    assert merged.summary.models == len(old.models) + 1
