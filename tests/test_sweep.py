"""Sweeps: selection, sharding, isolated workers, checkpoint and resume, merge, baseline, JUnit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from torch_checks import fake_group_norm_loses_what_eager_keeps, needs_fake_cuda

from cl_audit.errors import UsageError
from cl_audit.predict.divergences import divergence_table
from cl_audit.report import ModelSource, SweepReport, Verdict, compare, load_schema, merge
from cl_audit.sources import ModelRef
from cl_audit.sweep.selection import estimated_cost, parse_shard, select, shard

TESTS = Path(__file__).parent
FAULTS = str(TESTS / "fault_models.py")
CLI = str(Path(sys.executable).with_name("cl-audit"))


def cl_audit(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):
    return subprocess.run(
        [CLI, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "150", **(env or {})},
        timeout=timeout,
        check=False,
    )


# --- selection and sharding -----------------------------------------------------------------


def test_select_globs_comma_lists_exclusion_and_duplicates():
    refs = select(["resnet18", "resnet1*"], ["resnet10t,convnext_atto*"], [], ["*152*"])
    keys = [r.key for r in refs]
    assert keys[:2] == ["torchvision:resnet18", "torchvision:resnet101"]
    assert "torchvision:resnet152" not in keys and keys.count("torchvision:resnet18") == 1
    assert {"timm:resnet10t", "timm:convnext_atto", "timm:convnext_atto_ols"} <= set(keys)


def test_select_all_torchvision_and_user_specs():
    import torchvision

    refs = select([], [], ["all"], [])
    assert len(refs) == len(torchvision.models.list_models())
    assert select([f"{FAULTS}:fine"], [], [], []) == [ModelRef(ModelSource.USER, f"{FAULTS}:fine")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((["resnet5"], [], [], []), "did you mean: resnet50"),
        (([], ["nonexistent*"], [], []), "matches no timm model"),
        (([], ["convnext_tiniest"], [], []), "unknown timm model"),
    ],
)
def test_select_refuses_unknown_names(args, message):
    with pytest.raises(UsageError, match=message):
        select(*args)


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_every_model_lands_in_exactly_one_shard(count):
    refs = select([], ["all"], ["all"], [])
    shards = [shard(refs, k, count) for k in range(1, count + 1)]
    flat = [r for s in shards for r in s]
    assert sorted(flat) == sorted(refs)
    assert len(set(flat)) == len(flat)
    costs = [sum(estimated_cost(r) for r in s) for s in shards]
    largest = max(estimated_cost(r) for r in refs)  # one model cannot be split
    assert max(costs) <= max(1.05 * sum(costs) / count, largest) + 1e-6  # balanced by cost
    assert shards == [shard(refs, k, count) for k in range(1, count + 1)]  # deterministic


def test_cost_prefers_known_parameter_counts_then_size_words():
    small, large = (
        ModelRef(ModelSource.TIMM, "vit_tiny_patch16_224"),
        ModelRef(ModelSource.TIMM, "vit_large_patch16_224"),
    )
    assert estimated_cost(large, {}) > estimated_cost(small, {})
    assert estimated_cost(small, {small.key: 10**9}) > estimated_cost(small, {})


@pytest.mark.parametrize("text", ["0/2", "3/2", "a/b", "2"])
def test_bad_shard_specs_are_refused(text):
    with pytest.raises(UsageError, match="expected K/N"):
        parse_shard(text)


def test_list_prints_the_shard_without_running(tmp_path):
    result = cl_audit("--timm", "resnet1*", "--shard", "2/3", "--list", cwd=tmp_path)
    assert result.returncode == 0
    listed = result.stdout.split()
    refs = select([], ["resnet1*"], [], [])
    assert listed == [r.key for r in shard(refs, 2, 3)]
    assert not list(tmp_path.iterdir())  # nothing ran, no checkpoint


# --- isolation: every bad model becomes a row, the others finish ------------------------------


def test_segfault_timeout_and_memory_blowup_become_rows(tmp_path):
    result = cl_audit(
        f"{FAULTS}:segfaults", f"{FAULTS}:sleeps", f"{FAULTS}:hogs", f"{FAULTS}:fine",
        "--timm", "resnet10t", "--timeout", "5", "--max-memory", "600MB",
        "--json", "sweep.json", "--junit", "sweep.xml",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr  # failures, no offender
    assert "Traceback" not in result.stderr
    data = json.loads((tmp_path / "sweep.json").read_text())
    jsonschema.validate(data, load_schema("sweep"))
    rows = {r["name"].rsplit(":", 1)[-1]: r for r in data["models"]}
    assert rows["segfaults"]["status"] == "error"
    assert "SIGSEGV" in rows["segfaults"]["message"] and rows["segfaults"]["stage"] == "forward"
    assert rows["sleeps"]["status"] == "timeout" and rows["sleeps"]["stage"] == "forward"
    assert rows["hogs"]["status"] == "out-of-memory" and rows["hogs"]["peak_memory_mb"] > 600
    assert rows["fine"]["status"] == "ok" and rows["resnet10t"]["status"] == "ok"
    assert data["summary"]["failed"] == 3 and data["summary"]["clean"] == 2
    suite = ET.parse(tmp_path / "sweep.xml").getroot()
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("5", "3", "0")
    errors = {
        c.get("name"): c.find("error").get("type") for c in suite if c.find("error") is not None
    }
    assert errors == {
        f"{FAULTS}:segfaults": "error",
        f"{FAULTS}:sleeps": "timeout",
        f"{FAULTS}:hogs": "out-of-memory",
    }


def _interruptible() -> None:
    """The CLI starts as from a terminal: SIGINT at its default and unblocked, whatever an
    earlier test left in this process (a child inherits ignored and blocked signals, and Python
    then raises no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def test_interrupt_writes_partial_report_and_resume_loses_nothing(tmp_path):
    args = [f"{FAULTS}:fine", f"{FAULTS}:sleeps", "--timm", "resnet10t,resnet14t", "--jobs", "2"]
    args += ["--json", "sweep.json", "--timeout", "120"]
    process = subprocess.Popen(
        [CLI, *args],
        cwd=tmp_path,
        env={**os.environ, "CL_AUDIT_TEST_SLEEP": "100"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
    )
    checkpoint = tmp_path / "sweep.json.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # 3 rows are in while the sleeper still sleeps
        if checkpoint.exists() and len(checkpoint.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    partial = json.loads((tmp_path / "sweep.json").read_text())
    finished = {r["name"] for r in partial["models"]}
    assert len(finished) == 3 and f"{FAULTS}:sleeps" not in finished

    resumed = cl_audit(*args, "--resume", cwd=tmp_path, env={"CL_AUDIT_TEST_SLEEP": "0"})
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads((tmp_path / "sweep.json").read_text())
    assert {r["name"] for r in final["models"]} == finished | {f"{FAULTS}:sleeps"}
    lines = [json.loads(line) for line in checkpoint.read_text().splitlines()]
    assert len(lines) == 4  # the first three were not run again
    assert "[1/4]" not in resumed.stderr and "[4/4]" in resumed.stderr


def test_fake_sweep_with_confirm_is_eager_true(tmp_path):
    result = cl_audit(
        "shufflenet_v2_x0_5", "--timm", "resnet10t,poolformer_s12", "--fake", "--confirm",
        "--json", "s.json", "--fail-bytes", "0", cwd=tmp_path,
    )  # fmt: skip
    rows = {r["name"]: r for r in json.loads((tmp_path / "s.json").read_text())["models"]}
    assert rows["resnet10t"]["mode"] == "fake" and rows["resnet10t"]["predicted"]
    # a real offence (the channel shuffle's .contiguous(), 955 KiB: under the default 1 MiB
    # gate, hence --fail-bytes 0) is confirmed and stays one
    shuffle = rows["shufflenet_v2_x0_5"]
    assert shuffle["mode"] == "fake+eager" and not shuffle["predicted"] and shuffle["offenders"]
    assert result.returncode == 1, result.stderr
    # poolformer's group norm: fake flags it only on a torch whose fake group_norm returns NCHW
    # where eager keeps channels_last; the eager confirmation then clears it
    diverges = fake_group_norm_loses_what_eager_keeps()
    assert rows["poolformer_s12"]["mode"] == ("fake+eager" if diverges else "fake")
    assert rows["poolformer_s12"]["offenders"] == []
    assert f"confirming {1 + diverges} models" in result.stderr


def test_a_confirmed_cpu_training_sweep_runs_each_model_once_eagerly(tmp_path):
    result = cl_audit(
        "squeezenet1_0", "--timm", "resnet10t", "--fake", "--confirm", "--train",
        "--json", "t.json", cwd=tmp_path,
    )  # fmt: skip
    report = json.loads((tmp_path / "t.json").read_text())
    verdicts = {(r.get("summary") or {}).get("verdict") for r in report["models"]}
    offending = "offending" in verdicts
    assert result.returncode == (1 if offending else 0), result.stderr  # exit as the rows say
    assert {r["mode"] for r in report["models"]} == {"eager"}
    assert report["environment"]["mode"] == "eager"
    assert {r["cost"]["kernel_copies"] for r in report["models"]} == {"measured"}
    assert "the fake pass is skipped" in result.stderr and "confirming" not in result.stderr


def test_single_model_fake_mode(tmp_path):
    fake = cl_audit("shufflenet_v2_x0_5", "--fake", "--json", "-", cwd=tmp_path)
    assert fake.returncode == 1
    data = json.loads(fake.stdout)
    assert data["environment"]["mode"] == "fake"
    assert {f["aten_op"] for f in data["offenders"]} == {"aten.cat", "aten.clone"}
    assert data["environment"]["fake_divergences"].startswith(("torch ", "union of torch "))


@needs_fake_cuda
def test_single_model_predicted_cuda_names_its_divergence_table(tmp_path):
    cuda = cl_audit("resnet18", "--fake", "--device", "cuda", "--json", "-", cwd=tmp_path)
    assert cuda.returncode == 0, cuda.stderr
    environment = json.loads(cuda.stdout)["environment"]
    assert environment["device"] == "cuda"
    assert environment["fake_divergences"] == divergence_table("cuda").name
    assert "2.11 cuda" in environment["fake_divergences"]  # measured on an H200


# --- merge and baseline -------------------------------------------------------------------


def load(path: Path) -> SweepReport:
    return SweepReport.from_bytes(path.read_bytes())


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    directory = tmp_path_factory.mktemp("shards")
    paths = []
    for k in (1, 2):
        path = directory / f"shard-{k}.json{'.gz' if k == 2 else ''}"  # .gz: compressed
        result = cl_audit(
            "shufflenet_v2_x0_5", "squeezenet1_1", "--timm", "resnet10t", "--fake",
            "--shard", f"{k}/2", "--json", str(path), cwd=directory,
        )  # fmt: skip
        offending = any(row.offending for row in load(path).models)
        assert result.returncode == int(offending), result.stderr  # the byte gate's exit
        paths.append(path)
    return paths


def test_merge_combines_shards(shards, tmp_path):
    result = subprocess.run(
        [CLI, "merge", *map(str, shards), "-o", str(tmp_path / "all.json")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    merged = json.loads((tmp_path / "all.json").read_text())
    jsonschema.validate(merged, load_schema("sweep"))
    names = sorted(r["name"] for r in merged["models"])
    assert names == ["resnet10t", "shufflenet_v2_x0_5", "squeezenet1_1"]
    assert merged["settings"]["merged_from"] == 2 and "shard" not in merged["settings"]
    (op,) = [o for o in merged["operators"] if o["op"] == "aten.clone"]
    assert op["models"] == 1 and op["examples"][0].startswith("shufflenet_v2_x0_5:")


def test_merge_refuses_mixed_versions_and_duplicates_unless_forced(shards):
    reports = [load(p) for p in shards]
    other = replace(reports[1], environment=replace(reports[1].environment, torch="9.9"))
    with pytest.raises(UsageError, match="different versions"):
        merge([reports[0], other])
    assert merge([reports[0], other], force=True).summary.models == 3
    with pytest.raises(UsageError, match="is in two reports"):
        merge([reports[0], reports[0]])


def clean_row(row):
    """``row`` as a clean model: no offender, no cost, the verdict clean."""
    return replace(
        row, offenders=(), cost=None, summary=replace(row.summary, verdict=Verdict.CLEAN)
    )


def test_baseline_gates_only_new_offences_and_failures(shards, tmp_path):
    current = merge([load(p) for p in shards])
    assert not compare(current, current).regressed
    shuffle = next(r for r in current.models if r.name == "shufflenet_v2_x0_5")
    clean_before = SweepReport.build(
        current.environment,
        current.settings,
        [clean_row(r) if r is shuffle else r for r in current.models],
    )
    comparison = compare(clean_before, current)
    assert comparison.regressed
    assert {key for key, _ in comparison.new_offences} == {"torchvision:shufflenet_v2_x0_5"}
    assert ("torchvision:shufflenet_v2_x0_5", "aten.convolution") in comparison.new_offences
    assert compare(current, clean_before).fixed_offences == comparison.new_offences

    (tmp_path / "base.json").write_text(clean_before.to_json())
    (tmp_path / "same.json").write_text(current.to_json())
    args = ["shufflenet_v2_x0_5", "squeezenet1_1", "--timm", "resnet10t", "--fake"]
    regressed = cl_audit(*args, "--baseline", "base.json", cwd=tmp_path)
    assert regressed.returncode == 1 and "new offence" in regressed.stdout
    unchanged = cl_audit(*args, "--baseline", "same.json", cwd=tmp_path)
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr


def test_bad_baseline_is_a_usage_error(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"format": "cl-audit.report", "version": 1}))
    result = cl_audit("resnet18", "resnet34", "--baseline", "report.json", cwd=tmp_path)
    assert result.returncode == 2 and "unknown format 'cl-audit.report'" in result.stderr


# --- zero-filled init for eager sweep builds -----------------------------------------------


def test_zero_filled_build_is_restored_by_identity_and_keeps_verdicts():
    import torch

    from cl_audit.execution.settings import AuditSettings
    from cl_audit.sources import BuildOptions, load_model
    from cl_audit.sources.refs import building
    from cl_audit.sources.source_audit import audit_loaded

    shufflenet = ModelRef(ModelSource.TORCHVISION, "shufflenet_v2_x0_5")

    before = {n: getattr(torch.Tensor, n) for n in ("uniform_", "normal_")}
    own_entries = set(vars(torch.Tensor))
    fast = load_model(shufflenet, BuildOptions(skip_random_init=True))
    assert not fast.module.conv1[0].weight.any()  # zero-filled, so the fill really applied
    assert {n: getattr(torch.Tensor, n) for n in before} == before
    assert set(vars(torch.Tensor)) == own_entries
    with pytest.raises(ValueError), building(BuildOptions(skip_random_init=True)):
        raise ValueError
    assert all(getattr(torch.Tensor, n) is f for n, f in before.items())
    assert set(vars(torch.Tensor)) == own_entries

    settings = AuditSettings(input_size=(3, 128, 128))
    normal = audit_loaded(load_model(shufflenet), settings)
    zeroed = audit_loaded(fast, settings)
    assert {(f.op, f.call_site) for f in zeroed.offenders} == {
        (f.op, f.call_site) for f in normal.offenders
    }
    assert zeroed.summary == normal.summary
