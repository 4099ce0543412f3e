"""The sweep worker and runner directly: one model to one row, and forked workers with limits."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch_checks import needs_node_by_node

from cl_audit.errors import Stage
from cl_audit.execution.settings import AuditSettings
from cl_audit.report import Mode, ModelRow, ModelSource, Status, TensorMode
from cl_audit.sources import ModelRef
from cl_audit.sweep.runner import Checkpoint, run_jobs
from cl_audit.sweep.worker import Job, SweepSettings, audit_job, parse_memory

TESTS = Path(__file__).parent
TOYS, FAULTS = TESTS / "toy_models.py", TESTS / "fault_models.py"


def job(spec: str, **audit: object) -> Job:
    return Job(ModelRef(ModelSource.USER, spec), SweepSettings(audit=AuditSettings(**audit)))


def test_a_row_carries_the_whole_verdict():
    row = audit_job(job(f"{TOYS}:channel_shuffle", input_size=(3, 128, 128)))
    assert row.status is Status.OK and row.mode is Mode.EAGER and not row.predicted
    assert [f.python_op for f in row.offenders] == ["Tensor.contiguous"]
    assert row.summary.round_trips == 1 and row.regains and row.parameters > 0
    assert row.input_shape == (2, 3, 128, 128) and row.stage is None and row.seconds > 0


@needs_node_by_node
def test_a_replayed_step_that_fails_is_a_row_naming_the_operation_line_and_remedy():
    """A sweep of --train --fake: data-dependent control flow is an error row whose message
    names the operation and the model's line and says what to do; the control is a verdict."""
    import inspect

    import training_models as tm

    spec = f"{TESTS / 'training_models.py'}"
    settings = {"train": True, "tensor_mode": TensorMode.FAKE, "device": "cpu"}
    row = audit_job(job(f"{spec}:branches_on_value", **settings))
    lines, first = inspect.getsourcelines(tm.BranchesOnValue.forward)
    branch = first + next(i for i, t in enumerate(lines) if "if y.mean()" in t)
    assert row.status is Status.ERROR and row.stage is Stage.FORWARD
    assert row.message.startswith(
        f"in aten._local_scalar_dense at training_models.py:{branch}: DataDependentOutput"
    )
    assert "(hint: the model reads a tensor's values" in row.message
    assert audit_job(job(f"{spec}:keeps_format", **settings)).status is Status.OK


def test_fake_rows_are_predicted():
    row = audit_job(job(f"{TOYS}:clean_net", input_size=(3, 128, 128), tensor_mode=TensorMode.FAKE))
    assert row.status is Status.OK and row.mode is Mode.FAKE and row.predicted


def test_a_video_model_is_audited_at_its_own_small_size():
    """torchvision documents 112 px clips: audited so (1x1 maps are ambiguous, neither a loss
    nor a keep), not skipped."""
    fake = SweepSettings(AuditSettings(tensor_mode=TensorMode.FAKE))
    row = audit_job(Job(ModelRef(ModelSource.TORCHVISION, "r3d_18"), fake))
    assert row.status is Status.OK and row.cost is not None and row.cost.verdict is not None
    assert row.input_shape == (2, 3, 16, 112, 112)


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("raft_small", TensorMode.FAKE),  # a pair of frames
        ("ssdlite320_mobilenet_v3_large", TensorMode.EAGER),  # a list of images (its
        # post-processing reads values: fake tensors cannot run it)
    ],
)
def test_models_taking_more_than_one_batch_are_audited_with_the_arguments_they_take(name, mode):
    settings = SweepSettings(AuditSettings(tensor_mode=mode))
    row = audit_job(Job(ModelRef(ModelSource.TORCHVISION, name), settings))
    assert row.status is Status.OK, row.message
    assert row.cost is not None and row.input_shape[0] == 2


def test_a_user_factory_is_audited_at_its_declared_size():
    row = audit_job(job(f"{TOYS}:clean_net"))  # the factory declares 16x16
    assert row.status is Status.OK and row.input_shape == (2, 3, 16, 16)


@pytest.mark.parametrize(
    ("spec", "stage", "text"),
    [
        (f"{TOYS}:broken", Stage.FORWARD, "RuntimeError"),
        (f"{TOYS}:failing_factory", Stage.BUILD, ""),
    ],
)
def test_failures_become_rows_naming_their_stage(spec, stage, text):
    row = audit_job(job(spec, input_size=(3, 128, 128)))
    assert row.status is Status.ERROR and row.stage is stage and text in row.message


def test_run_jobs_forks_checkpoints_and_turns_a_crash_into_a_row(tmp_path):
    checkpoint = Checkpoint(tmp_path / "rows.jsonl")
    checkpoint.start(keep=False)
    jobs = [job(f"{FAULTS}:fine"), job(f"{FAULTS}:segfaults")]
    started: list[str] = []
    finished: list[ModelRow] = []
    files: dict[str, frozenset[str]] = {}

    def on_finish(row: ModelRow, ran_through: frozenset[str]) -> None:
        finished.append(row)
        files[row.name.rsplit(":", 1)[1]] = ran_through

    run_jobs(jobs, 2, checkpoint, lambda j: started.append(j.ref.name), on_finish, footprint=True)
    rows = {r.name.rsplit(":", 1)[1]: r for r in finished}
    assert rows["fine"].status is Status.OK
    assert rows["segfaults"].status is Status.ERROR and "SIGSEGV" in rows["segfaults"].message
    assert rows["segfaults"].stage is Stage.FORWARD
    # Each worker named the files its audit ran through; the crashed one before it crashed.
    assert files["fine"] == files["segfaults"] == {str(FAULTS)}
    assert sorted(started) == sorted(j.ref.name for j in jobs)
    assert set(checkpoint.read()) == {r.key for r in finished}


def test_workers_collect_garbage_without_walking_the_parents_objects(tmp_path):
    """A full garbage collection in a worker walked every object the parent had (torch's and
    timm's: about 400,000, half a second each time, 7% of a training audit): the parent freezes
    them before it forks, so the worker's collector leaves them out."""
    import gc

    checkpoint = Checkpoint(tmp_path / "rows.jsonl")
    checkpoint.start(keep=False)
    heard: list[ModelRow] = []
    parent = len(gc.get_objects())
    run_jobs([job(f"{FAULTS}:says_frozen")], 1, checkpoint, lambda j: None,
             lambda row, files: heard.append(row))  # fmt: skip
    message = heard[0].message
    assert heard[0].status is Status.ERROR and "frozen objects: " in message
    # Nearly all of them: a few temporaries the parent counted are freed before it freezes.
    assert int(message.rsplit(": ", 1)[1].split()[0]) >= 0.95 * parent


def test_a_fake_audits_worker_leaves_garbage_to_its_exit_and_an_eager_one_collects(tmp_path):
    """A fake audit's garbage is metadata, freed when its worker exits: its worker turns the
    automatic collection off (2% of a fake training audit); the control, an eager audit's
    worker, whose cycles can hold tensors' data, keeps collecting."""
    import gc

    checkpoint = Checkpoint(tmp_path / "rows.jsonl")
    checkpoint.start(keep=False)
    heard: dict[Mode, str] = {}
    modes = (TensorMode.FAKE, TensorMode.EAGER)
    jobs = [job(f"{FAULTS}:says_collecting", tensor_mode=mode) for mode in modes]

    def on_finish(row: ModelRow, files: frozenset[str]) -> None:
        heard[row.mode] = row.message.rsplit(": ", 1)[1]

    run_jobs(jobs, 1, checkpoint, lambda j: None, on_finish)
    assert heard == {Mode.FAKE: "False", Mode.EAGER: "True"}
    assert gc.isenabled()  # the parent's collector as it was


def test_workers_read_no_source_files_unless_asked(tmp_path, monkeypatch):
    """The files an audit ran through serve a sweep's cache alone, and reading them costs a
    worker about half a second: without ``footprint`` no worker reads them (reading raises
    here, in the forked workers too), and every row is whole."""
    from cl_audit.sweep import worker

    def unread(*args: object) -> set[str]:
        raise AssertionError("a worker read its source files unasked")

    for name in ("factory_files", "module_files", "call_site_files"):
        monkeypatch.setattr(worker, name, unread)
    checkpoint = Checkpoint(tmp_path / "rows.jsonl")
    checkpoint.start(keep=False)
    heard: list[tuple[ModelRow, frozenset[str]]] = []
    jobs = [job(f"{TOYS}:channel_shuffle", input_size=(3, 64, 64)), job(f"{FAULTS}:fine")]
    run_jobs(jobs, 2, checkpoint, lambda j: None, lambda row, files: heard.append((row, files)))
    assert [row.status for row, _ in heard] == [Status.OK, Status.OK]
    assert [files for _, files in heard] == [frozenset(), frozenset()]
    shuffle = next(row for row, _ in heard if row.name.endswith("channel_shuffle"))
    assert [f.python_op for f in shuffle.offenders] == ["Tensor.contiguous"]


@pytest.mark.parametrize(("text", "megabytes"), [("2GB", 2048), ("512MB", 512), ("1.5G", 1536)])
def test_memory_sizes_parse(text, megabytes):
    assert parse_memory(text) == megabytes


def test_a_peak_over_the_memory_cap_never_reads_as_at_it():
    """Peaks are kept to 0.1 MB rounded up: 600.04 MB over a 600 MB cap is 600.1 (rounded, it
    read 600.0 and a memory-blowup row looked under its cap); exact tenths stay as they are."""
    from cl_audit.sweep.runner import _peak

    assert _peak(600.04) == 600.1 and _peak(600.04) > 600
    assert (_peak(12.3), _peak(600.0), _peak(0.0)) == (12.3, 600.0, None)
