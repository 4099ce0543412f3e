"""Training audits: forward, backward and optimizer step, with phases and attribution."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
import training_models as tm
from typer.testing import CliRunner

from cl_audit.cli import app
from cl_audit.errors import ModelFailedError, Stage, UsageError
from cl_audit.report import Phase, RegainSource
from cl_audit.run import audit_module
from cl_audit.settings import Amp, AuditSettings, Engine, Optimizer, Strategy, TensorMode

SPEC = f"{Path(__file__).with_name('training_models.py')}:activation_before_pool"


def train(model: torch.nn.Module, **settings: object):
    return audit_module(model, (torch.randn(2, 3, 16, 16),), AuditSettings(train=True, **settings))


def line_of(text: str) -> str:
    lines, first = inspect.getsourcelines(tm.ActivationBeforePool.forward)
    return f"training_models.py:{first + next(i for i, t in enumerate(lines) if text in t)}"


@pytest.mark.parametrize("optimizer", list(Optimizer))
def test_activation_before_a_pool_loses_the_format_in_backward_caused_by_the_pool(optimizer):
    report = train(tm.ActivationBeforePool(), optimizer=optimizer)
    (loss,) = report.offenders
    assert loss.phase is Phase.BACKWARD
    assert (loss.python_op, loss.aten_op) == ("HardtanhBackward0", "aten.hardtanh_backward")
    assert (loss.module_path, loss.module_class) == ("act", "Hardtanh")
    assert loss.call_site.endswith(line_of("self.fc(")) and loss.round_trips == 1
    root = loss.root_cause
    assert (root.python_op, root.module_path) == ("MeanBackward1", "pool")
    (regain,) = [f for f in report.regains if f.phase is Phase.BACKWARD]
    assert regain.aten_op == "aten.convolution_backward" and regain.module_path == "conv"
    assert regain.regain_source is RegainSource.LOSS
    env = report.environment
    assert (env.train, env.optimizer) == (True, optimizer.value)


def test_the_same_model_keeps_channels_last_in_inference():
    """The control: forward only, nothing is lost."""
    report = audit_module(tm.ActivationBeforePool(), (torch.randn(2, 3, 16, 16),), AuditSettings())
    assert report.offenders == () and not report.environment.train


def test_a_gradient_laid_out_unlike_its_parameter_is_listed():
    report = train(tm.NonDenseWeight(), strategy=Strategy.AS_GIVEN)
    (mismatch,) = report.gradient_layouts
    assert mismatch.parameter == "weight" and mismatch.shape == (8, 3, 3, 3)
    assert mismatch.parameter_strides == (54, 18, 3, 1)
    assert mismatch.gradient_strides == (27, 9, 3, 1)
    assert train(tm.ActivationBeforePool()).gradient_layouts == ()  # the control


def test_bf16_autocast_is_reported_and_fp16_uses_a_scaler_eagerly():
    assert train(tm.ActivationBeforePool(), amp=Amp.BF16).environment.autocast == "cpu:bfloat16"
    fp16 = train(tm.ActivationBeforePool(), amp=Amp.FP16)
    assert fp16.environment.autocast == "cpu:float16"


def test_fake_training_runs_and_its_known_divergence_is_listed():
    from cl_audit.fake import FAKE_DIVERGENCES

    report = train(tm.ActivationBeforePool(), tensor_mode=TensorMode.FAKE)
    assert report.predicted and report.environment.train
    # fake hardtanh_backward keeps channels_last where eager CPU returns NCHW (measured)
    assert "aten.hardtanh_backward" in FAKE_DIVERGENCES
    (regain,) = [f for f in report.regains if f.aten_op == "aten.hardtanh_backward"]
    assert regain.root_cause.python_op == "MeanBackward1"


def test_training_refuses_what_it_cannot_do():
    with pytest.raises(UsageError, match="dispatch engine"):
        train(tm.ActivationBeforePool(), engine=Engine.PATCH)
    with pytest.raises(UsageError, match="fake tensors do not have"):
        train(tm.ActivationBeforePool(), tensor_mode=TensorMode.FAKE, amp=Amp.FP16)


def test_a_batch_of_one_with_batch_norm_fails_in_forward_with_a_hint():
    pool = torch.nn.AdaptiveAvgPool2d(1)  # then one value per channel: train-mode BN refuses
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), pool, torch.nn.BatchNorm2d(4))
    with pytest.raises(ModelFailedError, match="batch of at least 2") as failed:
        audit_module(model, (torch.randn(1, 3, 8, 8),), AuditSettings(train=True))
    assert failed.value.stage is Stage.FORWARD


def test_cli_train_reports_the_backward_loss():
    result = CliRunner().invoke(app, [SPEC, "--train", "--json", "-"], env={"COLUMNS": "120"})
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert [f["phase"] for f in data["offenders"]] == ["backward"]
    assert data["environment"]["train"] is True and data["environment"]["optimizer"] == "sgd"
