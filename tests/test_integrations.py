"""Where users already work: the assertion API, the pytest plugin (real pytest in a subprocess),
fastai and Lightning training loops, and the CI recipe's own commands, all for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
import torch
import torchvision
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from cl_audit.report import Phase, Verdict, load_schema
from cl_audit.testing import assert_keeps_channels_last

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"


class Flattening(nn.Module):
    """A convolution, then a flatten: the flatten's copy loses channels_last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.conv(x), 1)


def _no_mode_left() -> bool:
    return not _get_current_dispatch_mode_stack()


# --- assertion API ----------------------------------------------------------------------


def test_assert_passes_on_a_model_that_keeps_the_format_and_returns_the_report():
    report = assert_keeps_channels_last(torchvision.models.resnet18(), torch.randn(2, 3, 32, 32))
    assert report.offenders == () and report.summary.calls_checked > 0


def test_assert_fails_with_the_offender_table():
    with pytest.raises(AssertionError) as failure:
        assert_keeps_channels_last(Flattening(), torch.randn(2, 3, 8, 8), strict=True)
    message = str(failure.value)
    assert message.startswith("Flattening loses channels_last in the forward: 2 sites")
    for expected in ("torch.flatten", "aten.clone", "test_integrations.py:", "(512,1,64,8)"):
        assert expected in message


def test_allow_by_op_and_by_call_site_pattern():
    x = torch.randn(2, 3, 8, 8)
    assert_keeps_channels_last(Flattening(), x, allow=["aten.clone"], strict=True)
    assert_keeps_channels_last(
        Flattening(), x, allow=[("torch.flatten", "*test_integrations.py:*")], strict=True
    )
    with pytest.raises(AssertionError):  # the op matches, the call site does not
        assert_keeps_channels_last(
            Flattening(), x, allow=[("torch.flatten", "*/decoder.py:*")], strict=True
        )


def test_allowing_the_operation_that_loses_the_format_allows_the_costs_it_causes():
    """Issue #67: allowing the losing operations still failed on the convolution cost sites
    their NCHW data caused. ``MixedConcat``'s projection converts data whose order
    ``F.interpolate`` made (its fix site); the cat of both orders is an offender of its own.
    The control: allowing the cat alone leaves the convolution's site, which it did not cause."""
    from toy_models import MixedConcat

    x = torch.randn(2, 3, 16, 16)
    assert_keeps_channels_last(MixedConcat(), x, allow=["F.interpolate", "torch.cat"], strict=True)
    with pytest.raises(AssertionError, match=r"torch\.conv2d"):
        assert_keeps_channels_last(MixedConcat(), x, allow=["torch.cat"], strict=True)


def test_the_assertion_uses_the_gate_a_4_kib_cost_passes_unless_strict():
    report = assert_keeps_channels_last(Flattening(), torch.randn(2, 3, 8, 8))
    assert report.cost.extra_bytes == 2 * 8 * 8 * 8 * 4  # the flatten's copy: under 1 MiB
    with pytest.raises(AssertionError, match="1 site not allowed"):
        assert_keeps_channels_last(Flattening(), torch.randn(2, 3, 8, 8), fail_bytes=0)


def test_the_assertion_judges_at_batch_32_so_shufflenet_fails_at_a_test_sized_input():
    """At batch 2 and 128 px channels_last adds 312 KiB (3.24%), under the 1 MiB floor; at
    batch 32, where the gate judges, 4.9 MiB: the assertion fails. Judged at the example's
    own batch (``gate_batch=None``) the same cost passes."""
    x = torch.randn(2, 3, 128, 128)
    with pytest.raises(AssertionError, match="ShuffleNetV2 loses channels_last"):
        assert_keeps_channels_last(torchvision.models.shufflenet_v2_x0_5(), x)
    report = assert_keeps_channels_last(torchvision.models.shufflenet_v2_x0_5(), x, gate_batch=None)
    assert report.verdict is Verdict.MINOR and report.cost.extra_bytes == 312 * 1024


def test_assert_audits_a_training_step():
    with pytest.raises(AssertionError, match="in a training step") as failure:
        assert_keeps_channels_last(
            torchvision.models.mobilenet_v2(num_classes=10),
            torch.randn(2, 3, 64, 64),
            train=True,
            strict=True,
        )
    assert "aten.hardtanh_backward" in str(failure.value)


# --- pytest plugin ----------------------------------------------------------------------


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Real pytest in a subprocess; the plugin comes from cl-audit's pytest11 entry point."""
    env = {**os.environ, "COLUMNS": "120", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_readme_pytest_example_passes_with_the_plugin_from_its_entry_point(tmp_path):
    shutil.copy(EXAMPLES / "pytest" / "test_channels_last.py", tmp_path)
    result = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


FAILING = textwrap.dedent(
    """
    import os
    import pytest
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            if os.environ.get("NEW_OFFENCE"):
                y = y.to(memory_format=torch.contiguous_format)
            return torch.flatten(y, 1)

    def test_checked(cl_audit):
        cl_audit.check(Net(), torch.randn(2, 3, 8, 8))

    @pytest.mark.cl_audit
    def test_marked():
        Net()(torch.randn(2, 3, 8, 8))

    @pytest.mark.cl_audit
    def test_marked_without_a_model():
        assert torch.ones(3).sum() == 3
    """
)


def test_plugin_failures_show_in_pytest_report_with_the_table(tmp_path):
    (tmp_path / "test_models.py").write_text(FAILING)
    result = _pytest(tmp_path, "--cl-audit-strict")  # the flatten's copy is a 4 KiB cost
    assert result.returncode == 1
    out = result.stdout
    assert "3 failed" in out
    assert "Net loses channels_last: 2 sites not allowed" in out  # the fixture
    assert "Net#0 loses channels_last: 2 sites not allowed" in out  # the marker
    assert "torch.flatten" in out and "test_models.py:16" in out
    assert "ran no model on a 4D or 5D input" in out


def test_plugin_baseline_pins_todays_offences_and_fails_on_new_ones(tmp_path, monkeypatch):
    (tmp_path / "test_models.py").write_text(FAILING)
    baseline = tmp_path / "baseline.json"
    only = ["-k", "not without_a_model"]
    only = [*only, "--cl-audit-strict"]
    update = _pytest(tmp_path, *only, "--cl-audit-baseline", str(baseline), "--cl-audit-update")
    assert update.returncode == 0, update.stdout
    data = json.loads(baseline.read_text())
    jsonschema.validate(data, load_schema("sweep"))
    keys = {row["name"] for row in data["models"]}
    assert keys == {"test_models.py::test_checked::Net", "test_models.py::test_marked::Net#0"}
    pinned = _pytest(tmp_path, *only, "--cl-audit-baseline", str(baseline))
    assert pinned.returncode == 0, pinned.stdout  # today's offences are known
    monkeypatch.setenv("NEW_OFFENCE", "1")  # a conversion by another op: aten._to_copy
    shuffled = _pytest(tmp_path, *only, "--cl-audit-baseline", str(baseline))
    assert shuffled.returncode == 1
    assert "(not in the baseline)" in shuffled.stdout and "aten._to_copy" in shuffled.stdout


def test_plugin_refuses_update_without_a_baseline(tmp_path):
    (tmp_path / "test_models.py").write_text(FAILING)
    result = _pytest(tmp_path, "--cl-audit-update")
    assert result.returncode == 4 and "--cl-audit-update needs --cl-audit-baseline" in (
        result.stderr + result.stdout
    )


def test_pytest_help_lists_the_plugin_options(tmp_path):
    """pytest --help formats every option's help with %: a bare "1%" in a help text crashed it
    wherever cl-audit is installed."""
    result = _pytest(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    assert "1% of the bytes written" in result.stdout
    for option in ("--cl-audit-baseline", "--cl-audit-strict", "--cl-audit-update"):
        assert option in result.stdout


# --- fastai -------------------------------------------------------------------------------


def _run_example(name: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "120"},
    )


def test_fastai_example_audits_the_first_batch_with_channelslast_and_mixedprecision(tmp_path):
    pytest.importorskip("fastai", reason="the fastai extra is not installed")
    result = _run_example("fastai_channels_last.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[('torch.flatten', 'forward')]" in result.stdout
    data = json.loads((tmp_path / "cl_audit_fastai.json").read_text())
    jsonschema.validate(data, load_schema())
    assert data["environment"]["train"] is True
    # fastai's MixedPrecision enters autocast("cuda"), which torch disables on a CPU machine:
    # the report says what ran
    assert data["environment"]["autocast"] is None
    phases = {f["phase"] for f in data["offenders"] + data["regains"]}
    assert {"forward", "backward"} <= phases


def test_fastai_callback_leaves_torch_as_it_was_when_the_batch_fails():
    pytest.importorskip("fastai", reason="the fastai extra is not installed")
    from fastai.data.core import DataLoaders
    from fastai.learner import Learner

    from cl_audit.integrations.fastai import ChannelsLastAudit

    class Broken(Flattening):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.conv(x)
            raise ValueError("broken model")

    data = list(zip(torch.randn(4, 3, 8, 8), torch.randint(0, 2, (4,)), strict=True))
    dls = DataLoaders.from_dsets(data, data, bs=2, device="cpu")
    learn = Learner(dls, Broken(), loss_func=nn.CrossEntropyLoss(), cbs=[ChannelsLastAudit()])
    with learn.no_bar(), learn.no_logging(), pytest.raises(ValueError, match="broken model"):
        learn.fit(1)
    assert _no_mode_left() and "_do_one_batch" not in vars(learn)


# --- Lightning ----------------------------------------------------------------------------


def test_lightning_example_saves_the_report_in_the_log_directory(tmp_path):
    pytest.importorskip("lightning", reason="the lightning extra is not installed")
    result = _run_example("lightning_channels_last.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    path = tmp_path / "lightning_logs" / "version_0" / "cl_audit.json"
    data = json.loads(path.read_text())
    jsonschema.validate(data, load_schema())
    assert data["environment"]["autocast"] == "cpu:bfloat16"  # Lightning's bf16-mixed ran
    assert data["environment"]["optimizer"] == "SGD"
    assert [(f["python_op"], f["phase"]) for f in data["offenders"]] == [
        ("torch.flatten", "forward")
    ]


def test_lightning_callback_logs_counts_and_survives_a_failing_step(tmp_path):
    pl = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed")
    from lightning.pytorch.loggers import CSVLogger

    from cl_audit.integrations.lightning import ChannelsLastAudit

    class Module(pl.LightningModule):
        def __init__(self, fail: bool) -> None:
            super().__init__()
            self.net, self.fail = Flattening(), fail

        def training_step(self, batch, batch_idx):
            if self.fail:
                raise ValueError("broken step")
            return self.net(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    batches = list(zip(torch.randn(4, 3, 8, 8), range(4), strict=True))
    loader = torch.utils.data.DataLoader(batches, batch_size=2)
    for fail in (False, True):
        audit = ChannelsLastAudit(to_channels_last=True, show=False)
        trainer = pl.Trainer(
            max_epochs=1,
            accelerator="cpu",
            callbacks=[audit],
            logger=CSVLogger(tmp_path / str(fail)),
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        if fail:
            with pytest.raises(ValueError, match="broken step"):
                trainer.fit(Module(fail), loader)
            assert audit.report is None and _no_mode_left()
            continue
        trainer.fit(Module(fail), loader)
        assert audit.report is not None and audit.report.offenders[0].phase is Phase.FORWARD
        metrics = (Path(trainer.log_dir) / "metrics.csv").read_text()
        assert "cl_audit/losses" in metrics.splitlines()[0]


_LIGHTNING_DDP = """
import os, sys, warnings
import lightning.pytorch as pl
import torch
from cl_audit.execution.convert import to_channels_last
from cl_audit.integrations.lightning import ChannelsLastAudit
sys.path.insert(0, {tests!r})
from ddp_models import SmallConvNet


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = SmallConvNet()

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class AtFitStart(pl.Callback):  # the conversion as the callback made it before
    def on_fit_start(self, trainer, pl_module):
        to_channels_last(pl_module)


if __name__ == "__main__":
    callback = ChannelsLastAudit(to_channels_last=True, show=False)
    if sys.argv[1] == "control":
        callback = AtFitStart()
    loader = torch.utils.data.DataLoader(list(zip(torch.randn(4, 3, 16, 16), range(4))), 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = pl.Trainer(
            max_epochs=1, accelerator="cpu", devices=1, strategy="ddp", callbacks=[callback],
            logger=False, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False,
        )
        trainer.fit(Module(), loader)
    weight = trainer.lightning_module.net.features[0].weight
    print("channels_last", weight.is_contiguous(memory_format=torch.channels_last))
    print("warned", any("bucket view strides" in str(w.message) for w in caught), flush=True)
    # gloo's threads can abort the interpreter's teardown ("terminate called without an active
    # exception", seen on torch 2.15.0 after the fit had finished): the results are out
    os._exit(0)
"""


def test_lightning_callback_converts_before_ddp_wraps_so_its_buckets_match(tmp_path):
    """Lightning wraps the module in DDP before ``on_fit_start``: converted there (the control,
    as this callback did), DDP's buckets keep NCHW strides and it warns; the callback converts
    in ``setup``, before the wrapping, and DDP says nothing. A real DDP (gloo, one process)."""
    pytest.importorskip("lightning", reason="the lightning extra is not installed")
    script = tmp_path / "lightning_ddp.py"
    script.write_text(_LIGHTNING_DDP.format(tests=str(Path(__file__).parent)))
    found = {}
    for variant in ("callback", "control"):
        result = subprocess.run(
            [sys.executable, str(script), variant],
            cwd=tmp_path, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        found[variant] = result.stdout
    assert "channels_last True" in found["callback"] and "warned False" in found["callback"]
    assert "channels_last True" in found["control"] and "warned True" in found["control"]


# --- Documentation and CI recipe ----------------------------------------------------------


@pytest.mark.parametrize(
    ("example", "page"),
    [
        ("pytest/test_channels_last.py", "integrations.md"),
        ("fastai_channels_last.py", "integrations.md"),
        ("lightning_channels_last.py", "integrations.md"),
        ("from_libraries.py", "usage.md"),
    ],
)
def test_docs_show_each_example_verbatim(example, page):
    assert (EXAMPLES / example).read_text().strip() in (DOCS / page).read_text()


def test_ci_recipe_shards_merges_and_gates_for_real(tmp_path):
    script = EXAMPLES / "ci" / "sweep.sh"
    toys = ROOT / "tests" / "toy_models.py"
    env = {
        **os.environ,
        "SELECTION": f"--torchvision resnet18 --torchvision squeezenet1_0 {toys}:channel_shuffle"
        " --fail-share 0 --fail-bytes 0",  # the toy shuffle's cost is 16 KiB
        "OUT": str(tmp_path / "out"),
        "CL_AUDIT": f"{sys.executable} -m cl_audit",
    }

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(script), *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=600,
        )

    cache = str(tmp_path / "cache")
    shards = [  # as CI's parallel jobs run them: at once
        subprocess.Popen(["bash", str(script), "shard", k, "2"], env={**env, "CACHE": cache},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k in ("1", "2")
    ]  # fmt: skip
    for shard in shards:
        _, err = shard.communicate(timeout=600)
        assert shard.returncode == 0, err
    out = tmp_path / "out"
    again = run("shard", "2", "2", CACHE=cache)  # the next CI run, its cache restored
    assert again.returncode == 0, again.stderr
    rows = json.loads((out / "shard-2.json").read_text())["models"]
    assert rows and all(row["cached"] for row in rows)
    written = {p.name for p in out.iterdir()}  # with each shard's checkpoint (.jsonl)
    assert {"shard-1.json", "shard-1.xml", "shard-2.json", "shard-2.xml"} <= written
    merged = run("merge")
    assert merged.returncode == 0, merged.stderr
    sweep = json.loads((out / "sweep.json").read_text())
    jsonschema.validate(sweep, load_schema("sweep"))
    assert sweep["summary"]["models"] == 3 and sweep["summary"]["offending"] == 1
    assert (out / "sweep.html").read_text().startswith("<!DOCTYPE html>")
    baseline = tmp_path / "baseline.json"
    shutil.copy(out / "sweep.json", baseline)
    assert run("merge", BASELINE=str(baseline)).returncode == 0
    for row in sweep["models"]:  # a baseline from before the shuffle offended
        row["offenders"], row["cost"] = [], None
        row["summary"]["verdict"] = "clean"
    baseline.write_text(json.dumps(sweep))
    gated = run("merge", BASELINE=str(baseline))
    assert gated.returncode == 1 and "new offence" in gated.stderr
    yaml = pytest.importorskip("yaml", reason="pyyaml is in the test extra")
    workflow = yaml.safe_load((EXAMPLES / "ci" / "github-actions.yml").read_text())
    steps = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    assert "bash examples/ci/sweep.sh shard ${{ matrix.shard }} 4" in steps
    assert "bash examples/ci/sweep.sh merge" in steps
