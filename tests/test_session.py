"""The sweep session with a stubbed runner: passes, confirmation policy, resume, interrupt."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from literal_reports import finding, row
from torch_checks import needs_node_by_node

import cl_audit.sweep.session as session
from cl_audit.execution.settings import AuditSettings
from cl_audit.report import Mode, ModelRow, ModelSource, Status, TensorMode, load_schema
from cl_audit.sources import ModelRef
from cl_audit.sweep.runner import Checkpoint
from cl_audit.sweep.worker import Job, SweepSettings

FAKE = SweepSettings(audit=AuditSettings(tensor_mode=TensorMode.FAKE), confirm=True)


class Display:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []

    def start(self, ref: ModelRef) -> None:
        self.started.append(ref.name)

    def finish(self, row: ModelRow) -> None:
        self.finished.append(row.name)


def run(monkeypatch, refs, settings, outcomes, tmp_path: Path, resume=False, interrupt_at=None):
    """Run a sweep whose runner returns ``outcomes[name](job)`` for each job."""
    calls: list[Job] = []
    displays: list[Display] = []

    def fake_runner(jobs, parallel, checkpoint, on_start, on_finish, footprint=False):
        assert not footprint  # no cache here: no worker reads its source files
        for job in jobs:
            if job.ref.name == interrupt_at:
                raise KeyboardInterrupt
            calls.append(job)
            on_start(job)
            result = outcomes[job.ref.name](job)
            checkpoint.append(result)
            on_finish(result, frozenset())

    @contextlib.contextmanager
    def progress(total, done, cached):
        displays.append(Display())
        yield displays[-1]

    monkeypatch.setattr(session, "run_jobs", fake_runner)
    monkeypatch.setattr(session, "_warm_imports", lambda refs: None)
    outcome = session.run_sweep(
        refs, settings, {}, tmp_path / "c.jsonl", resume, progress, lambda message: None
    )
    return outcome, calls, displays


def ref(name: str) -> ModelRef:
    return ModelRef(ModelSource.TIMM, name)


def as_mode(r: ModelRow, job: Job) -> ModelRow:
    from dataclasses import replace

    return replace(r, mode=job.mode, parameters=r.parameters)


def test_confirm_reruns_flagged_and_failed_fake_rows_eagerly(monkeypatch, tmp_path):
    big = row("big", (finding(),))
    from dataclasses import replace

    big = replace(big, parameters=300_000_000)
    outcomes = {
        "clean": lambda job: as_mode(row("clean"), job),
        "off": lambda job: as_mode(row("off", (finding(),) if not job.confirming else ()), job),
        "big": lambda job: as_mode(big, job),
        "crash": lambda job: as_mode(row("crash", status=Status.ERROR, message="x"), job),
    }
    refs = [ref(n) for n in outcomes]
    outcome, calls, displays = run(monkeypatch, refs, FAKE, outcomes, tmp_path)
    first, confirming = calls[:4], calls[4:]
    assert all(j.mode is Mode.FAKE for j in first)
    assert {j.ref.name for j in confirming} == {"off", "big", "crash"}
    assert all(j.confirming and j.mode is Mode.CONFIRMED for j in confirming)
    sides = {j.ref.name: j.settings.max_input_size for j in confirming}
    assert sides == {"off": 256, "big": session.CONFIRM_LARGE_SIDE, "crash": 256}
    verdicts = {j.ref.name: j.fake_verdict for j in confirming}
    assert verdicts == {
        "off": "fake mode had flagged: torch.cat",
        "big": "fake mode had flagged: torch.cat",
        "crash": None,
    }
    modes = {r.name: r.mode for r in outcome.report.models}
    assert modes == {
        "big": Mode.CONFIRMED,
        "clean": Mode.FAKE,
        "crash": Mode.CONFIRMED,
        "off": Mode.CONFIRMED,
    }
    assert outcome.report.summary.offending == 1  # "off" was clean in eager mode
    assert len(displays) == 2 and not outcome.interrupted


def test_a_failed_confirmation_keeps_the_fake_verdict_in_its_message():
    from cl_audit.sweep.worker import failed_row

    job = Job(ref("m"), FAKE, confirming=True, fake_verdict="fake mode had flagged: aten.cat")
    failed = failed_row(job, Status.OUT_OF_MEMORY, "used 5000 MB", None)
    assert failed.message == "used 5000 MB; fake mode had flagged: aten.cat"
    assert failed.mode is Mode.CONFIRMED and not failed.predicted


def test_resume_skips_checkpointed_rows_and_interrupt_keeps_finished(monkeypatch, tmp_path):
    eager = SweepSettings()
    outcomes = {n: (lambda job, n=n: as_mode(row(n), job)) for n in ("a", "b", "c")}
    refs = [ref(n) for n in outcomes]
    outcome, calls, _ = run(monkeypatch, refs, eager, outcomes, tmp_path, interrupt_at="c")
    assert outcome.interrupted and [r.name for r in outcome.report.models] == ["a", "b"]
    assert set(Checkpoint(tmp_path / "c.jsonl").read()) == {"timm:a", "timm:b"}
    outcome, calls, _ = run(monkeypatch, refs, eager, outcomes, tmp_path, resume=True)
    assert [j.ref.name for j in calls] == ["c"]
    assert [r.name for r in outcome.report.models] == ["a", "b", "c"]


def test_default_checkpoint_follows_json_path_else_settings_hash():
    assert session.default_checkpoint(Path("out/r.json"), {}, FAKE) == Path("out/r.json.jsonl")
    one = session.default_checkpoint(None, {"timm": ["a"]}, FAKE)
    assert one.parent == Path(".cl-audit") and one.name.startswith("sweep-")
    assert one != session.default_checkpoint(None, {"timm": ["b"]}, FAKE)


@pytest.mark.parametrize("tensor_mode", [TensorMode.EAGER, TensorMode.FAKE])
def test_settings_record_fake_as_before(tensor_mode):
    recorded = SweepSettings(audit=AuditSettings(tensor_mode=tensor_mode)).to_dict()
    assert recorded["fake"] is (tensor_mode is TensorMode.FAKE)
    assert "tensor_mode" not in recorded and recorded["differential"] is True


def test_the_sweep_environment_states_a_training_step(monkeypatch, tmp_path):
    from cl_audit.execution.settings import Optimizer

    training = SweepSettings(audit=AuditSettings(train=True, optimizer=Optimizer.ADAMW))
    outcomes = {"a": lambda job: as_mode(row("a"), job)}
    outcome, _, _ = run(monkeypatch, [ref("a")], training, outcomes, tmp_path)
    env = outcome.report.environment
    assert (env.train, env.optimizer) == (True, "adamw")
    assert outcome.report.settings["train"] is True and env.mode is TensorMode.EAGER


@needs_node_by_node
def test_a_fake_training_sweep_says_how_its_steps_ran(monkeypatch, tmp_path):
    """How a predicted training sweep was made is in its environment, within the sweep schema:
    fake steps, their backward run node by node; a fake inference sweep says fake (the
    control)."""
    outcomes = {"a": lambda job: as_mode(row("a"), job)}
    for train, mode in ((True, TensorMode.FAKE_STEP), (False, TensorMode.FAKE)):
        settings = replace(FAKE, audit=replace(FAKE.audit, train=train), confirm=False)
        outcome, _, _ = run(monkeypatch, [ref("a")], settings, outcomes, tmp_path / str(train))
        assert outcome.report.environment.mode is mode
        jsonschema.validate(json.loads(outcome.report.to_json()), load_schema("sweep"))


def test_confirm_reruns_clean_fake_rows_whose_findings_include_a_divergent_op(monkeypatch):
    """A clean fake verdict with a regain at an op of the divergence table (in its phase) is
    confirmed; one with an ordinary regain, or the same op in another phase, is not."""
    from dataclasses import replace

    from cl_audit.predict.divergences import DivergenceTable
    from cl_audit.report import Conversion, Phase

    table = DivergenceTable("literal", {("aten.hardtanh_backward", "backward"): "measured"})
    monkeypatch.setattr(session, "divergence_table", lambda device_type: table)

    def with_regain(name: str, aten_op: str, phase: Phase = Phase.BACKWARD) -> ModelRow:
        regain = replace(finding("", aten_op), kind=Conversion.REGAIN, phase=phase)
        return replace(row(name), mode=Mode.FAKE, regains=(regain,))

    rows = {
        "suspect": with_regain("suspect", "aten.hardtanh_backward"),
        "plain": with_regain("plain", "aten.convolution_backward"),
        "other phase": with_regain("other phase", "aten.hardtanh_backward", Phase.FORWARD),
    }
    (job,) = session.confirm_jobs(rows, FAKE)
    assert job.ref.name == "suspect" and job.confirming
    assert job.fake_verdict == (
        "fake mode was clean, with ops it is known to get wrong: aten.hardtanh_backward"
    )


def test_a_cpu_training_sweep_confirms_clean_fake_rows_whose_kernels_copy_unseen():
    """On the CPU the convolution backward copies inside whatever its strides (measured), which
    fake tensors cannot show: every fake training verdict there is confirmed; inference not."""
    from dataclasses import replace

    rows = {"clean": replace(row("clean"), mode=Mode.FAKE)}
    train = replace(FAKE, audit=replace(FAKE.audit, train=True))
    (job,) = session.confirm_jobs(rows, train)
    assert job.fake_verdict == (
        "fake mode was clean, with ops it is known to get wrong: aten.convolution_backward"
    )
    assert session.confirm_jobs(rows, FAKE) == []


def test_a_cpu_training_sweep_runs_each_model_once_eagerly(monkeypatch, tmp_path):
    """Confirmed, a CPU training sweep would re-run every fake row eagerly, so it runs each
    model once, eagerly: large models (by the shipped parameter counts) at the confirmation's
    side; an inference sweep keeps its fake pass."""
    from dataclasses import replace

    train = replace(FAKE, audit=replace(FAKE.audit, train=True))
    big = "aimv2_1b_patch14_224"  # over LARGE_MODEL_PARAMETERS in cl_audit/sweep/parameters.json
    outcomes = {n: lambda job, n=n: as_mode(row(n, (finding(),)), job) for n in ("small", big)}
    outcome, calls, displays = run(monkeypatch, [ref("small"), ref(big)], train, outcomes, tmp_path)
    assert [c.mode for c in calls] == [Mode.EAGER, Mode.EAGER] and len(displays) == 1
    sides = {c.ref.name: c.settings.max_input_size for c in calls}
    assert sides == {"small": 256, big: session.CONFIRM_LARGE_SIDE}
    assert outcome.report.environment.mode is TensorMode.EAGER
    assert {r.mode for r in outcome.report.models} == {Mode.EAGER}
    assert session.eager_only(train) and not session.eager_only(FAKE)
    inference = replace(train, audit=replace(train.audit, train=False))
    assert not session.eager_only(inference) and not session.eager_only(
        replace(train, confirm=False)
    )
    _, calls, _ = run(monkeypatch, [ref("small")], FAKE, outcomes, tmp_path)
    assert [c.mode for c in calls] == [Mode.FAKE, Mode.CONFIRMED]
