"""The JSON envelope: schema-valid, round-trips, refuses what it cannot read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import torch
import toy_models
from literal_reports import before_version_7

import cl_audit
from cl_audit.report import (
    REPORT_VERSION,
    DifferentialStatus,
    ModelReport,
    ReportFormatError,
    load_schema,
)

DATA = Path(__file__).with_name("data")


@pytest.fixture(scope="module")
def report() -> ModelReport:
    return cl_audit.audit_model(toy_models.MixedConcat(), torch.randn(2, 3, 16, 16), name="mixed")


def test_real_report_validates_against_the_shipped_schema(engine):
    for model in (toy_models.MixedConcat(), toy_models.ChannelShuffle(), toy_models.CleanNet()):
        data = cl_audit.audit_model(model, torch.randn(2, 3, 16, 16), engine=engine).to_dict()
        jsonschema.validate(data, load_schema())


def test_envelope_and_contract_keys(report):
    data = json.loads(report.to_json())
    assert (data["format"], data["version"]) == ("cl-audit.report", REPORT_VERSION)
    assert [f["kind"] for f in data["offenders"]] == ["loss"]
    assert all(f["kind"] == "regain" for f in data["regains"])
    env = data["environment"]
    assert env["engine"] == "dispatch" and env["torch"] == torch.__version__
    assert env["device"] == "cpu" and env["dtype"] == "float32" and env["autocast"] is None
    assert data["summary"]["losses"] == 1 and data["input_shape"] == [2, 3, 16, 16]


def test_round_trip_through_json(report):
    assert ModelReport.from_json(report.to_json()) == report


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "cl-audit.sweep"}, "unknown format 'cl-audit.sweep'"),
        (
            {"version": REPORT_VERSION + 1},
            f"unsupported cl-audit.report version {REPORT_VERSION + 1}",
        ),
        ({"format": None}, "unknown format None"),
    ],
)
def test_unknown_format_or_version_is_refused_clearly(report, change, message):
    data = {**report.to_dict(), **change}
    with pytest.raises(ReportFormatError, match=message):
        ModelReport.from_dict(data)


def test_not_json_and_missing_keys_are_refused(report):
    with pytest.raises(ReportFormatError, match="not JSON"):
        ModelReport.from_json("{nope")
    with pytest.raises(ReportFormatError, match="no 'format' key"):
        ModelReport.from_dict({"offenders": []})
    data = report.to_dict()
    del data["summary"]
    with pytest.raises(ReportFormatError, match="malformed"):
        ModelReport.from_dict(data)


def test_autocast_is_recorded():
    model = toy_models.CleanNet().eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16),
        cl_audit.audit() as audit,
    ):
        model(x)
    assert audit.report().environment.autocast == "cpu:bfloat16"


def test_version_1_reports_are_still_read_with_empty_new_lists():
    # As committed by the first release, whose environment had no "mode" yet (read as eager).
    data = json.loads((DATA / "report-v1.json").read_text())
    old = ModelReport.from_dict(data)
    assert old.model == "shufflenet_v2_x0_5" and old.summary.losses == len(old.offenders) == 16
    assert old.parameter_conversions == () and old.format_neutral == ()
    assert old.differential.status is DifferentialStatus.SKIPPED
    assert "version 1" in old.differential.message
    jsonschema.validate(old.to_dict(), load_schema())  # written again as the current version


def test_version_3_reports_without_compiled_graphs_are_still_read(report):
    """Version 4 added ``compiled`` (--compile); a version 3 document is read as before."""
    data = {k: v for k, v in before_version_7(report.to_dict()).items() if k != "compiled"}
    data |= {"version": 3}
    jsonschema.validate(data, load_schema("report", 3))
    old = ModelReport.from_dict(data)
    assert old.cost.gate.batch is None and old.cost.at_gate.projected is False
    unstrided = tuple(replace(site, strides=None) for site in report.cost.sites)  # version 15
    unbatched = replace(report.cost, gate=replace(report.cost.gate, batch=None), batch=None,
                        fixed_bytes=0, fixed_written_bytes=0, sites=unstrided)  # fmt: skip
    assert old == replace(report, cost=unbatched, speed=None) and old.compiled is None
    compiled = {**data, "compiled": {"device": "cpu"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(compiled, load_schema("report", 3))
