"""Torch is left exactly as it was: every attribute, by identity, whatever happened inside."""

from __future__ import annotations

import types
from inspect import getattr_static

import pytest
import torch
import torch.nn.functional as F
import toy_models
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch_checks import needs_fake_cuda

import cl_audit
from cl_audit.intercept.patch import METADATA_METHODS, OPERATOR_DUNDERS, patch_targets

NAMESPACES = {"torch": torch, "torch.Tensor": torch.Tensor, "F": F}


def snapshot() -> dict[str, dict[str, object]]:
    """Every attribute of the three namespaces, from vars() and from dir()/getattr."""
    taken: dict[str, dict[str, object]] = {}
    for label, namespace in NAMESPACES.items():
        taken[f"vars({label})"] = dict(vars(namespace))
        taken[f"dir({label})"] = {n: getattr_static(namespace, n, None) for n in dir(namespace)}
    return taken


def leftover_wrappers(taken: dict[str, dict[str, object]]) -> list[str]:
    """Patch-engine wrappers still installed, whatever the baseline snapshot holds."""
    return [
        f"{key}.{name}"
        for key, attributes in taken.items()
        for name, value in attributes.items()
        if isinstance(value, types.FunctionType) and value.__dict__.get("_cl_audit_wrapper")
    ]


def assert_identical(before, after) -> None:
    assert not leftover_wrappers(after), leftover_wrappers(after)[:10]
    for key in before:
        assert before[key].keys() == after[key].keys(), f"{key}: entries added or removed"
        changed = [n for n, v in before[key].items() if after[key][n] is not v]
        assert not changed, f"{key}: not restored by identity: {changed[:10]}"
    assert _get_current_dispatch_mode_stack() == []
    assert _get_current_function_mode_stack() == []


@pytest.fixture
def warm():
    """Run a forward first so lazily imported torch submodules do not show as changes."""
    model = toy_models.ChannelShuffle()
    cl_audit.audit_model(model, torch.randn(1, 3, 8, 8))
    cl_audit.audit_model(model, torch.randn(1, 3, 8, 8), engine="patch")
    return model


def test_patch_engine_really_patches_while_active(warm):
    original_cat = torch.cat
    with cl_audit.audit("patch"):
        assert torch.cat is not original_cat
        assert "__add__" in vars(torch.Tensor)  # inherited dunder shadowed while active
    assert torch.cat is original_cat


def test_restored_after_a_clean_audit(warm, engine):
    before = snapshot()
    cl_audit.audit_model(warm, torch.randn(2, 3, 8, 8), engine=engine)
    assert_identical(before, snapshot())


def test_restored_after_an_exception_in_forward(warm, engine):
    before = snapshot()
    with pytest.raises(RuntimeError, match="broken on purpose"):
        cl_audit.audit_model(toy_models.Broken(), torch.randn(2, 3, 8, 8), engine=engine)
    assert_identical(before, snapshot())


def test_restored_after_keyboard_interrupt(warm, engine):
    before = snapshot()
    with pytest.raises(KeyboardInterrupt):
        cl_audit.audit_model(toy_models.Interrupting(), torch.randn(2, 3, 8, 8), engine=engine)
    assert_identical(before, snapshot())


def test_nested_audit_is_refused_and_outer_still_restores(warm, engine):
    before = snapshot()
    with cl_audit.audit(engine):
        with pytest.raises(cl_audit.AuditError, match="already active"):
            with cl_audit.audit("dispatch"):
                pass
        with pytest.raises(cl_audit.AuditError, match="already active"):
            with cl_audit.audit("patch"):
                pass
    assert_identical(before, snapshot())
    with cl_audit.audit(engine):  # and a new audit works afterwards
        pass


def test_an_audit_object_is_single_use():
    audit = cl_audit.audit()
    with audit:
        pass
    with pytest.raises(cl_audit.AuditError, match="already used"):
        with audit:
            pass


def test_report_before_running_is_refused():
    with pytest.raises(cl_audit.AuditError, match="nothing audited"):
        cl_audit.audit().report()


def test_unknown_engine_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown engine 'fast'"):
        cl_audit.audit("fast")


def test_patch_targets_leave_metadata_classes_and_typing_alone():
    labels = {t.label for t in patch_targets()}
    assert {"torch.cat", "F.interpolate", "Tensor.contiguous", "Tensor.__add__"} <= labels
    assert not {f"Tensor.{m}" for m in METADATA_METHODS} & labels
    # Every operator dunder that torch.Tensor defines is wrapped, the in-place ones included.
    defined = {d for d in OPERATOR_DUNDERS if hasattr(torch.Tensor, d)}
    assert "__iadd__" in defined
    assert {f"Tensor.{d}" for d in defined} <= labels
    for absent in ("torch.no_grad", "torch.autocast", "torch.Tensor", "F.Optional", "F.Callable"):
        assert absent not in labels
    for target in patch_targets():
        assert not isinstance(getattr(target.owner, target.name), type)


def test_patch_engine_keeps_torch_classes_usable(warm):
    with cl_audit.audit("patch"):
        assert isinstance(torch.no_grad(), torch.no_grad)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pass


def test_a_callable_that_refuses_wrapping_is_listed_not_fatal(monkeypatch):
    from cl_audit.intercept import patch

    real = list(patch.patch_targets())[:3]
    refusing = patch._Target(int, "bit_length", "int.bit_length")  # builtin types refuse setattr
    monkeypatch.setattr(patch, "patch_targets", lambda: iter([*real, refusing]))
    before = {t.label: getattr(t.owner, t.name) for t in real}
    with cl_audit.audit("patch") as audit:
        assert all(getattr(t.owner, t.name) is not before[t.label] for t in real)
    (line,) = audit.report().unwrapped
    assert line.startswith("int.bit_length: ")
    assert all(getattr(t.owner, t.name) is before[t.label] for t in real)


def test_restored_after_a_differential_run_that_fails_and_one_that_runs(warm, engine):
    import differential_models as dm

    before = snapshot()
    failed = cl_audit.audit_model(dm.NCHWOnlyFails(), torch.randn(2, 3, 8, 8), engine=engine)
    assert failed.differential.status.value == "failed"  # the NCHW run raised inside the engine
    assert_identical(before, snapshot())
    compared = cl_audit.audit_model(dm.TalkingHeads(), torch.randn(2, 3, 8, 8), engine=engine)
    assert compared.differential.status.value == "ran"
    assert_identical(before, snapshot())


@needs_fake_cuda
def test_fake_cuda_autocast_state_is_restored():
    from cl_audit.execution.settings import Amp, AuditSettings, TensorMode
    from cl_audit.phases.audit_module import audit_module

    previous = torch.get_autocast_dtype("cuda")
    torch.set_autocast_dtype("cuda", torch.bfloat16)  # not the dtype the audit sets
    try:
        settings = AuditSettings(device="cuda", tensor_mode=TensorMode.FAKE, amp=Amp.FP16)
        audit_module(toy_models.CleanNet(), (torch.randn(2, 3, 16, 16),), settings)
        assert not torch.is_autocast_enabled("cuda")
        assert torch.get_autocast_dtype("cuda") == torch.bfloat16
    finally:
        torch.set_autocast_dtype("cuda", previous)
