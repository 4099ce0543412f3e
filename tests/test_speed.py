"""The speed verdict: does channels_last pay. Predicted from the shipped CPU table (so the figures
are the table's, not this machine's: nothing here is a timed assertion), measured through the
real CLI (only its shape is asserted), the verdict's rule on literal numbers, the gate on speed
in real subprocesses, and the tables' contract (a missing table or dtype is said, never stood
in for)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import speed_models as sm
import torch
from torch_checks import needs_node_by_node

from cl_audit import audit_model
from cl_audit.enums import SpeedBasis, SpeedClass, SpeedVerdict, TensorMode
from cl_audit.execution.settings import AuditSettings
from cl_audit.phases.audit_module import audit_module
from cl_audit.predict import table_store
from cl_audit.report import ModelReport, load_schema
from cl_audit.report.speed_report import speed_verdict

MODELS = str(Path(__file__).with_name("speed_models.py"))


def _speed(model: torch.nn.Module, size: int = 32, **kwargs):
    """The predicted speed section of a fake audit (shapes only: the same on any machine, and
    for any thread count, where an eager run's measured kernel copies are not)."""
    torch.manual_seed(0)
    settings = AuditSettings(tensor_mode=TensorMode.FAKE, verify=False, **kwargs)
    report = audit_module(model, (torch.randn(2, 3, size, size),), settings)
    assert report.speed is not None
    return report.speed


def _classes(speed) -> dict[SpeedClass, tuple[float, float]]:
    return {c.speed_class: (c.channels_last_ms, c.nchw_ms) for c in speed.classes}


@pytest.mark.parametrize(
    ("speedup", "low", "high", "verdict"),
    [
        (1.30, 1.20, 1.40, SpeedVerdict.FASTER),
        (0.70, 0.60, 0.80, SpeedVerdict.SLOWER),
        (1.02, 0.99, 1.04, SpeedVerdict.NO_DIFFERENCE),
        (1.10, 0.95, 1.30, SpeedVerdict.INCONCLUSIVE),  # the middle half spans even
        (1.03, 0.96, 1.08, SpeedVerdict.INCONCLUSIVE),  # nor does it lie within the band
        (1.30, None, None, SpeedVerdict.FASTER),  # predicted: the speedup alone
        (0.97, None, None, SpeedVerdict.NO_DIFFERENCE),
        (None, None, None, SpeedVerdict.UNKNOWN),
    ],
)
def test_the_verdict_needs_the_rounds_on_one_side_and_the_speedup_past_the_band(
    speedup, low, high, verdict
):
    assert speed_verdict(speedup, low, high, 0.05) is verdict


def test_a_wider_band_calls_the_same_speedup_no_difference():
    assert speed_verdict(1.08, None, None, 0.05) is SpeedVerdict.FASTER
    assert speed_verdict(1.08, None, None, 0.10) is SpeedVerdict.NO_DIFFERENCE


def test_each_class_is_priced_where_its_operations_run_and_nowhere_else():
    """Convolutions alone: their forward class, no normalisation; batch norm adds the
    normalisation class (its control: ``Convolutions``); elementwise and pooling without a
    convolution (control); attention where a model attends."""
    conv = _classes(_speed(sm.Convolutions()))
    assert conv[SpeedClass.CONV_FORWARD][0] > 0 and conv[SpeedClass.CONV_FORWARD][1] > 0
    assert SpeedClass.NORMALISATION not in conv and SpeedClass.ATTENTION not in conv
    norm = _classes(_speed(sm.Normalised()))
    assert norm[SpeedClass.NORMALISATION][0] > 0 and norm[SpeedClass.NORMALISATION][1] > 0
    pointwise = _classes(_speed(sm.Pointwise()))
    assert pointwise[SpeedClass.ELEMENTWISE][0] > 0 and SpeedClass.CONV_FORWARD not in pointwise
    attention = _classes(_speed(sm.Attention()))
    assert attention[SpeedClass.ATTENTION][0] > 0
    assert SpeedClass.ATTENTION not in conv


@needs_node_by_node
def test_a_training_step_prices_both_gradients_of_each_convolution():
    classes = _classes(_speed(sm.Convolutions(), train=True))
    for cls in (SpeedClass.CONV_FORWARD, SpeedClass.CONV_INPUT_GRAD, SpeedClass.CONV_WEIGHT_GRAD):
        assert classes[cls][0] > 0 and classes[cls][1] > 0, cls
    forward_only = _classes(_speed(sm.Convolutions()))
    assert SpeedClass.CONV_WEIGHT_GRAD not in forward_only  # the control: inference


def test_conversions_cost_time_in_channels_last_only_where_the_model_converts():
    thrash, steady = _speed(sm.Thrash(), size=64), _speed(sm.Steady(), size=64)
    converted = _classes(thrash)[SpeedClass.CONVERSION]
    assert converted[0] > 0 and converted[1] == 0  # NCHW's contiguous() copies nothing
    assert thrash.conversion_share > 0.1 and thrash.sites_ms > 0
    assert thrash.fixed_speedup > thrash.speedup  # fixing the sites would gain
    assert thrash.verdict is SpeedVerdict.SLOWER
    assert _classes(steady).get(SpeedClass.CONVERSION, (0.0, 0.0))[0] == 0
    assert steady.verdict is not SpeedVerdict.SLOWER and steady.speedup > thrash.speedup


def test_a_prediction_names_its_table_and_the_operations_it_had_no_samples_of():
    speed = _speed(sm.Pointwise())
    (table,) = table_store.store().of("cpu")  # the shipped one: the tests' folder is empty
    assert speed.basis is SpeedBasis.PREDICTED and speed.table.name == table.name
    assert speed.table.identity == table.identity and speed.table.source == "shipped"
    assert ("table", table.described) in speed.settings
    assert "aten::sigmoid" in speed.stand_ins  # not probed: priced as an addition, and said
    assert "aten::max_pool2d_with_indices" not in speed.stand_ins  # probed: its own samples


def test_without_a_table_the_speed_is_unknown_and_says_so(monkeypatch):
    monkeypatch.setattr(table_store, "_shipped", lambda: ())
    speed = _speed(sm.Convolutions())
    assert speed.verdict is SpeedVerdict.UNKNOWN and speed.speedup is None
    assert "no speed table for cpu" in speed.note
    control = _speed(sm.Convolutions(), differential=False)
    assert control.verdict is SpeedVerdict.UNKNOWN and "no NCHW run" in control.note


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cl_audit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_speed_gate_exits_1_for_a_slower_step_and_0_for_its_control(tmp_path):
    """Predicted from the shipped table (deterministic): ``Thrash`` converts every block's
    map in channels_last; ``Steady`` is the same without the conversions. The byte gate
    (default) exits 1 for ``Thrash`` too: its conversions are channels_last-only bytes."""
    args = ("--input-size", "3x64x64", "--no-verify", "--gate", "speed")
    slow = _cli(f"{MODELS}:thrash", *args, "--json", str(tmp_path / "slow.json"))
    assert slow.returncode == 1, slow.stderr
    report = json.loads((tmp_path / "slow.json").read_text())
    assert report["speed"]["verdict"] == "slower" and report["cost"]["gate"]["on"] == "speed"
    jsonschema.validate(report, load_schema())
    steady = _cli(f"{MODELS}:steady", *args)
    assert steady.returncode == 0, steady.stdout + steady.stderr
    assert "channels_last" in steady.stdout and "predicted" in steady.stdout


def test_the_speed_gate_is_refused_where_no_verdict_can_be_had(monkeypatch):
    from typer.testing import CliRunner

    from cl_audit.cli import app

    monkeypatch.setattr(table_store, "_shipped", lambda: ())
    refused = CliRunner().invoke(app, [f"{MODELS}:steady", "--gate", "speed"])
    assert refused.exit_code == 2
    assert "--gate speed needs a speed verdict, and no cpu table" in refused.output
    assert "--time" in refused.output  # the way to have one: measure it


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (("--engine", "patch"), "--gate speed prices the operations the dispatch engine sees"),
        (("--no-differential",), "--gate speed compares with the NCHW run"),
    ],
)
def test_the_speed_gate_refuses_a_run_that_has_no_speed(args, reason):
    """Never the byte verdict in its place (issue #67): the patch engine sees no operation to
    price, and without the NCHW run there is nothing to set beside it. The control: the same
    run gated on bytes goes."""
    from typer.testing import CliRunner

    from cl_audit.cli import app

    refused = CliRunner().invoke(app, [f"{MODELS}:steady", *args, "--gate", "speed", "--no-verify"])
    assert refused.exit_code == 2 and reason in refused.output, refused.output
    assert CliRunner().invoke(app, [f"{MODELS}:steady", *args, "--no-verify"]).exit_code == 0


def test_the_speed_gate_refuses_a_model_left_as_given():
    from cl_audit.enums import GateOn, Strategy
    from cl_audit.errors import UsageError
    from cl_audit.execution.plan import plan_run
    from cl_audit.report.verdict import Gate

    gate = Gate(on=GateOn.SPEED)
    with pytest.raises(UsageError, match="`convert` as-given runs one layout"):
        plan_run(AuditSettings(strategy=Strategy.AS_GIVEN, gate=gate))
    plan_run(AuditSettings(strategy=Strategy.CONV_WEIGHTS, gate=gate))  # the control: compared


def test_the_speed_gate_exits_2_when_the_nchw_run_fails(tmp_path):
    """Known only once the model ran: its NCHW run fails, so the speed is unknown; the report
    is written, and the exit is 2 with the reason, in one model and in a sweep. The control:
    gated on bytes, the same model exits by its byte verdict (clean: 0)."""
    out = tmp_path / "one.json"
    args = (f"{MODELS}:channels_last_only", "--input-size", "3x32x32", "--no-verify")
    one = _cli(*args, "--gate", "speed", "--json", str(out))
    assert one.returncode == 2, one.stdout + one.stderr
    assert "--gate speed cannot decide: the speed is unknown (no NCHW run" in one.stderr
    assert "Traceback" not in one.stderr
    assert json.loads(out.read_text())["speed"]["verdict"] == "unknown"  # the report is kept
    swept = _cli(*args, f"{MODELS}:steady", "--gate", "speed", "--json", str(tmp_path / "s.json"))
    assert swept.returncode == 2, swept.stdout + swept.stderr
    assert "cannot decide 1 model of 2" in swept.stderr
    assert "channels_last_only" in swept.stderr
    assert _cli(*args).returncode == 0  # the control: the byte gate decides


def test_time_measures_both_layouts_in_alternating_rounds_through_the_cli(tmp_path):
    """Measured on this machine: only the section's shape is asserted (seven rounds each,
    quartiles around the median, the classes of both layouts), never its figures; and issue
    #67's one step time per layout: the ``--time`` line's step is the speed table's (they were
    two measurements of the channels_last step, 95.2 against 67.4 ms on resnet18)."""
    out = tmp_path / "timed.json"
    done = _cli(f"{MODELS}:steady", "--input-size", "3x32x32", "--time", "--json", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema())
    report = ModelReport.from_dict(data)
    speed, timing = report.speed, report.timing
    assert timing.rounds_ms == speed.channels_last.rounds_ms  # one measurement, read twice
    assert timing.step_ms == speed.channels_last.ms == speed.rows()[-1].channels_last_ms
    assert f"step {timing.step_ms:.1f} ms (median of 7 rounds" in done.stdout
    assert speed.basis is SpeedBasis.MEASURED and speed.table is None
    assert len(speed.channels_last.rounds_ms) == len(speed.nchw.rounds_ms) == 7
    assert speed.low <= speed.speedup <= speed.high
    assert speed.verdict is not SpeedVerdict.UNKNOWN
    assert {c.speed_class for c in speed.classes} >= {SpeedClass.CONV_FORWARD}
    assert "Time by operation class, measured (cpu)" in done.stdout


def test_an_older_report_is_read_without_a_speed_section():
    data = audit_model(sm.Convolutions(), torch.randn(2, 3, 16, 16), verify=False).to_dict()
    data["version"] = 12
    del data["speed"]
    for key in ("on", "slowdown"):
        del data["cost"]["gate"][key]
    del data["cost"]["kernel_copy_table"]
    del data["cost"]["groups"]  # version 15's
    jsonschema.validate(data, load_schema(version=12))
    report = ModelReport.from_dict(data)
    assert report.speed is None and report.cost.gate.on.value == "bytes"


def _committed_speeds() -> list[tuple[str, object]]:
    """Every speed section with classes of the committed model and sweep reports under
    reports/ (read without their schemas: the readers' tests validate them)."""
    import gzip

    from cl_audit.report import REPORT_FORMAT, SWEEP_FORMAT, SweepReport

    found = []
    for path in sorted(Path(__file__).parent.parent.glob("reports/**/*.json*")):
        raw = path.read_bytes()
        text = gzip.decompress(raw) if path.suffix == ".gz" else raw
        if b'"classes"' not in text:
            continue
        data = json.loads(text)
        kind = data.get("format") if isinstance(data, dict) else None
        if kind == SWEEP_FORMAT:
            rows = SweepReport.from_dict(data).models
        elif kind == REPORT_FORMAT:
            rows = (ModelReport.from_dict(data),)
        else:  # a validation's rows, a table
            continue
        for r in rows:
            if r.speed is not None:  # a sweep's row has its name, a model report its model
                found.append((f"{path.name}:{getattr(r, 'name', None) or r.model}", r.speed))
    return found


def test_the_time_tables_add_up_to_their_step_in_every_committed_report():
    """Issue #67: the predicted classes left out the host's time (their rows implied another
    speedup than the step's). Each table's rows, the host's or the unprofiled remainder among
    them, add up to the step in both layouts; a ratio is shown only of times that print."""
    speeds = [(name, s) for name, s in _committed_speeds() if s.classes and s.channels_last]
    assert len(speeds) > 100  # the registry's predicted sweep among them
    for name, speed in speeds:
        *parts, step = speed.rows()
        assert step.total and step.channels_last_ms == speed.channels_last.ms, name
        assert step.speedup == speed.speedup, name  # the headline's figure, measured or not
        assert sum(r.channels_last_ms for r in parts) == pytest.approx(step.channels_last_ms)
        assert sum(r.nchw_ms for r in parts) == pytest.approx(step.nchw_ms), name
        assert all(r.speedup is None or min(r.channels_last_ms, r.nchw_ms) >= 0.005 for r in parts)
    predicted = [s for _, s in speeds if s.basis is SpeedBasis.PREDICTED]
    assert any(r.label == "host, not overlapped" for s in predicted for r in s.rows())
    measured = replace(predicted[0], basis=SpeedBasis.MEASURED, speedup=1.5)  # rounds' ratio
    assert measured.rows()[-1].speedup == 1.5  # not the ratio of the two median steps
    control = replace(predicted[0], channels_last=None)  # no step: the classes alone
    assert [r.label for r in control.rows()] == [c.speed_class.value for c in control.classes]
