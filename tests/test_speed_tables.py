"""This machine's speed: the queue model on sequences whose answer is known by construction, the
host's cost measured (a slow operation shows as slow), tables found in the order this machine,
its device model, another device, with the labels a headline gives them, an exact
configuration looked up rather than interpolated, and old reports' table names still read."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import torch

from cl_audit.enums import TableMatch
from cl_audit.errors import UsageError
from cl_audit.features.table.clock import Clock
from cl_audit.features.table.host import measure_host
from cl_audit.predict import table_store
from cl_audit.predict.queue import Issued, replay
from cl_audit.predict.speed_table import ConvCall, SpeedTable
from cl_audit.report import ModelReport
from cl_audit.report.machine import MachineIdentity, TableUse, release

# --- the queue model -------------------------------------------------------------------------


def test_a_host_bound_step_takes_the_hosts_time_and_the_last_kernel():
    ops = [Issued(10.0, 2.0)] * 5  # the host issues every 10 us, each kernel runs 2 us
    timeline = replay(ops, asynchronous=True)
    assert timeline.end_us == pytest.approx(5 * 10 + 2)
    assert timeline.host_us == 50 and timeline.device_us == 10


def test_a_device_bound_step_takes_the_first_launch_and_every_kernel():
    ops = [Issued(2.0, 10.0)] * 5  # kernels queue up behind each other
    assert replay(ops, asynchronous=True).end_us == pytest.approx(2 + 5 * 10)


def test_a_synchronous_device_adds_every_hosts_and_kernels_time():
    """The control of both: on the CPU (no queue) nothing overlaps."""
    ops = [Issued(10.0, 2.0)] * 5
    assert replay(ops, asynchronous=False).end_us == pytest.approx(5 * 12)
    assert replay([Issued(2.0, 10.0)] * 5, asynchronous=False).end_us == pytest.approx(60)


def test_a_synchronisation_makes_the_host_wait_for_the_queue():
    queued = [Issued(1.0, 10.0)] * 3 + [Issued(1.0, 0.0), Issued(1.0, 10.0)]
    waiting = [Issued(1.0, 10.0)] * 3 + [Issued(1.0, 0.0, sync=True), Issued(1.0, 10.0)]
    # without the read back the fifth kernel queues behind the third at 31 us: 41 us
    assert replay(queued, asynchronous=True).end_us == pytest.approx(41)
    # with it the host waits until 31 us, then spends 1 us: the last kernel 32-42 us
    synced = replay(waiting, asynchronous=True)
    assert synced.end_us == pytest.approx(42) and synced.host_waits_us == pytest.approx(27)


# --- the host's cost, measured ---------------------------------------------------------------


def _slow(x: torch.Tensor) -> torch.Tensor:
    began = time.perf_counter()
    while time.perf_counter() - began < 100e-6:  # 100 us of host work, no kernel
        pass
    return torch.relu(x)


def test_the_host_measurement_sees_an_operations_own_host_time():
    clock = Clock("cpu")
    plain = measure_host(clock, "cpu", depth=16, repeats=3)
    slow = measure_host(clock, "cpu", op=_slow, depth=16, repeats=3)
    assert slow["forward"] - plain["forward"] > 80  # the 100 us per module, less noise
    assert slow["forward_grad"] - plain["forward_grad"] > 80
    # the control: views and the optimizer run no such operation
    assert abs(slow["view"] - plain["view"]) < 20 and slow["view"] < 50
    assert set(plain) == {"forward", "forward_grad", "backward", "optimizer", "view",
                          "view_grad", "sync"}  # fmt: skip
    assert all(v > 0 for v in plain.values())


# --- whose table -----------------------------------------------------------------------------

CPU = MachineIdentity("cpu", "Test CPU", 2, 2, torch="2.14.1", backend="onednn-3.12.0")
GPU = MachineIdentity("cuda", "Test GPU", memory_gib=80.0, multiprocessors=100,
                      host="Host CPU (8 cores)", torch="2.11.0", backend="cudnn-9.19")  # fmt: skip


def _document(identity: MachineIdentity, name: str, us: float = 10.0) -> dict:
    """A small table of the current version: one operation and one convolution, both layouts."""
    from cl_audit.report.codec import encode

    conv = {"dtype": "float32", "batch": 2, "cin": 64, "height": 28, "width": 28, "cout": 64,
            "groups": 1, "kernel": 3, "stride": 1, "out_height": 28, "out_width": 28,
            "source": "grid", "channels_last": {"forward": 1.0, "input_grad": 1.0,
            "weight_grad": 1.0}, "nchw": {"forward": 2.0, "input_grad": 2.0,
            "weight_grad": 2.0}}  # fmt: skip
    tiny = dict(
        conv,
        cin=8,
        cout=8,
        height=7,
        width=7,
        out_height=7,
        out_width=7,
        channels_last={p: 0.01 for p in conv["nchw"]},
        nchw={p: 0.01 for p in conv["nchw"]},
    )
    ops = [{"op": "aten::add", "layout": lay, "dtype": "float32", "elements": 1000,
            "channels": 64, "us": us} for lay in ("channels_last", "nchw")]  # fmt: skip
    host = {k: 1.0 for k in ("forward", "forward_grad", "backward", "optimizer", "view",
                             "view_grad", "sync")}  # fmt: skip
    return {"format": "cl-audit.speed-table", "version": 2, "name": name,
            "identity": encode(identity), "host": host, "ops": ops,
            "convolutions": [conv, tiny]}  # fmt: skip


def _write(folder: Path, identity: MachineIdentity, name: str) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(_document(identity, name)))
    return path


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """An empty user folder of tables, the shipped ones out of sight."""
    monkeypatch.setenv(table_store.TABLES_ENV, str(tmp_path))
    monkeypatch.setattr(table_store, "_shipped", lambda: ())
    return tmp_path


def test_this_machines_own_table_comes_before_its_device_models_and_another_devices(tables):
    other = MachineIdentity("cpu", "Other CPU", 64, 64, torch="2.14.1", backend="onednn-3.12.0")
    older = MachineIdentity("cpu", "Test CPU", 2, 2, torch="2.9.1", backend="onednn-3.9.0")
    _write(tables, other, "other")
    _write(tables, older, "older")
    assert table_store.choose("cpu", "float32", here=CPU).use.match is TableMatch.SAME_DEVICE
    assert table_store.choose("cpu", "float32", here=CPU).table.name == "older"
    _write(tables, CPU, "mine")
    mine = table_store.choose("cpu", "float32", here=CPU)
    assert mine.table.name == "mine" and mine.use.match is TableMatch.THIS_MACHINE
    assert mine.use.label == "this machine's table"
    elsewhere = MachineIdentity("cpu", "Third CPU", 4, 4, torch="2.14.1", backend="x")
    assert table_store.choose("cpu", "float32", here=elsewhere).use.match is (
        TableMatch.OTHER_DEVICE
    )
    # the control: a GPU audit never takes a CPU table
    assert table_store.choose("cuda", "float16", here=GPU) is None


def test_releases_are_ordered_as_versions_not_as_text(tables):
    for r in ("2.9.1", "2.14.1", "2.10.0"):
        _write(tables, MachineIdentity("cpu", "Test CPU", 2, 2, torch=r, backend="b"), f"t{r}")
    here = MachineIdentity("cpu", "Test CPU", 2, 2, torch="2.15.0", backend="c")
    assert table_store.choose("cpu", "float32", here=here).table.name == "t2.14.1"
    assert release("2.14.1+cu130") > release("2.9.1") and release("2.10.0a0") == (2, 10, 0)


def test_another_thread_count_is_another_machines_table_and_says_which(tables):
    _write(tables, CPU, "two-threads")
    one = MachineIdentity("cpu", "Test CPU", 2, 1, torch="2.14.1", backend="onednn-3.12.0")
    use = table_store.choose("cpu", "float32", here=one).use
    assert use.match is TableMatch.SAME_DEVICE
    assert use.label == (
        "another machine's table: Test CPU, 2 threads, torch 2.14.1; threads 1 here"
    )


def test_a_gpu_table_predicting_for_a_machine_without_a_gpu_names_its_gpu(tables):
    _write(tables, GPU, "gpu")
    use = table_store.choose("cuda", "float32", here=None).use
    assert use.match is TableMatch.OTHER_DEVICE and use.this_machine is None
    assert (
        use.label == "another machine's table: Test GPU, torch 2.11.0; this machine: no CUDA device"
    )


def test_the_table_option_chooses_by_name_or_file_and_refuses_what_cannot_be(tables):
    _write(tables, CPU, "mine")
    elsewhere = tables / "elsewhere"
    elsewhere.mkdir()
    path = _write(elsewhere, GPU, "their-gpu")
    by_file = table_store.choose("cuda", "float16", str(path), here=None)
    assert by_file.table.name == "their-gpu" and by_file.use.chosen
    assert "chosen" in by_file.use.label
    assert table_store.choose("cpu", "float32", "mine", here=CPU).use.chosen
    with pytest.raises(UsageError, match="no table of that name"):
        table_store.choose("cpu", "float32", "nobody", here=CPU)
    with pytest.raises(UsageError, match="describes cuda"):
        table_store.choose("cpu", "float32", str(path), here=CPU)


def test_an_unreadable_table_in_the_folder_is_listed_and_never_chosen(tables):
    (tables / "broken.json").write_text('{"format": "cl-audit.speed-table", "version": 2}')
    _write(tables, CPU, "mine")
    known = table_store.store()
    assert [t.name for t in known.tables] == ["mine"]
    assert [p.name for p, _ in known.unreadable] == ["broken.json"]


# --- lookups ---------------------------------------------------------------------------------


def test_a_convolution_measured_exactly_is_read_and_any_other_interpolated():
    table = SpeedTable(_document(CPU, "t"))
    exact = ConvCall(2, 64, 28, 28, 64, 1, 3, 1, 28, 28)
    assert table.conv_ms(exact, "float32", "channels_last", "forward") == 1.0
    assert table.conv_ms(exact, "float32", "nchw", "weight_grad") == 2.0
    # the control: twice the work, not measured, is interpolated (above the measured one)
    twice = ConvCall(4, 64, 28, 28, 64, 1, 3, 1, 28, 28)
    assert table.conv_ms(twice, "float32", "channels_last", "forward") > 1.0


def test_a_table_without_a_pass_has_no_price_for_it():
    doc = _document(CPU, "t")
    for conv in doc["convolutions"]:
        for layout in ("channels_last", "nchw"):
            del conv[layout]["weight_grad"]
    table = SpeedTable(doc)
    call = ConvCall(4, 64, 28, 28, 64, 1, 3, 1, 28, 28)
    assert table.conv_ms(call, "float32", "nchw", "weight_grad") is None
    assert table.conv_ms(call, "float32", "nchw", "forward") is not None


# --- reports ---------------------------------------------------------------------------------


def test_a_version_13_report_naming_its_table_alone_is_read_as_a_table_of_unknown_machine():
    import jsonschema
    import speed_models as sm
    from literal_reports import before_version_15

    from cl_audit import audit_model
    from cl_audit.report import load_schema

    report = audit_model(sm.Convolutions(), torch.randn(2, 3, 16, 16), verify=False)
    assert report.speed.table.match is not None  # the control: version 14 says how it matched
    data = before_version_15(report.to_dict())
    data["version"] = 13
    data["speed"]["table"] = report.speed.table.name  # as version 13 wrote it
    jsonschema.validate(data, load_schema(version=13))
    old = ModelReport.from_dict(data)
    assert old.speed.table == TableUse(name=report.speed.table.name)
    assert old.speed.table.label == f"table {report.speed.table.name}"
    assert ModelReport.from_dict(copy.deepcopy(old.to_dict())).speed.table == old.speed.table


# --- the host's cost by phase ----------------------------------------------------------------


def test_each_operation_pays_the_host_cost_of_its_phase():
    from cl_audit.enums import Phase
    from cl_audit.predict.speed_model import OpTimes, predict

    doc = _document(CPU, "t")
    doc["host"] = {"forward": 1.0, "forward_grad": 10.0, "backward": 100.0, "optimizer": 1000.0,
                   "view": 0.5, "view_grad": 0.5, "sync": 0.5}  # fmt: skip
    table = SpeedTable(doc)
    x = torch.ones(2, 64, 4, 4)
    add = torch.ops.aten.add.Tensor
    times = OpTimes()
    for phase, calls in ((Phase.FORWARD, 2), (Phase.BACKWARD, 3), (Phase.OPTIMIZER, 1)):
        for _ in range(calls):
            times.observe(add, [x, x], [x], phase)
    assert predict(times, table, "float32", train=True).host_ms == pytest.approx(
        (2 * 10 + 3 * 100 + 1000) / 1e3
    )
    # the control: a forward under no gradient pays the forward's cost whatever it is told
    assert predict(times, table, "float32", train=False).host_ms == pytest.approx(6 / 1e3)


def test_a_training_audit_hands_the_speed_model_its_phases():
    import speed_models as sm

    from cl_audit.enums import Phase
    from cl_audit.execution.settings import AuditSettings
    from cl_audit.phases.audit_module import operations

    settings = AuditSettings(train=True, verify=False)  # eager: every release trains so
    cl, nchw = operations(sm.Convolutions(), (torch.randn(2, 3, 16, 16),), settings)
    for ledger in (cl, nchw):
        assert [p for _, p in ledger.times.phases] == [
            Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER
        ]  # fmt: skip
    inference = AuditSettings(verify=False)
    forward, _ = operations(sm.Convolutions(), (torch.randn(2, 3, 16, 16),), inference)
    assert [p for _, p in forward.times.phases] == [Phase.FORWARD]  # the control


def test_a_run_of_no_operation_has_no_events_and_its_step_no_time():
    from cl_audit.predict.speed_model import OpTimes, predict

    empty = OpTimes()
    assert list(empty.events) == [] and predict(empty, SpeedTable(_document(CPU, "t")),
                                                "float32", train=False).ms == 0  # fmt: skip
