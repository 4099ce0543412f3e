"""Work a model does once is done before the audited runs (an unaudited forward or step in each
layout), so it is not charged to channels_last, which runs first; work done on every forward in
channels_last only is still its cost."""

from __future__ import annotations

import inspect

import one_time_models as om
import pytest
import torch
from torch_checks import needs_node_by_node

from cl_audit import audit_model
from cl_audit.execution.settings import AuditSettings, TensorMode
from cl_audit.phases.audit_module import audit_module
from cl_audit.report import ModelReport
from cl_audit.report.verdict import Gate

ANY = {"fail_share": 0.0, "fail_bytes": 0}


def _input() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def _costing(report: ModelReport) -> dict[str, int]:
    """The channels_last-only bytes by call site (file and line)."""
    found: dict[str, int] = {}
    for site in report.cost.sites:
        if site.extra and site.call_site is not None:
            where = site.call_site.rsplit("/", 1)[-1]
            found[where] = found.get(where, 0) + site.extra
    return found


def _copy_line() -> str:
    lines, start = inspect.getsourcelines(om.CachesStatistics.forward)
    (number,) = [start + i for i, line in enumerate(lines) if "# the copy" in line]
    return f"one_time_models.py:{number}"


def _fake(model: torch.nn.Module, **kwargs) -> ModelReport:
    settings = AuditSettings(tensor_mode=TensorMode.FAKE, gate=Gate.of(0.0, 0, None), **kwargs)
    return audit_module(model, (_input(),), settings)


AUDITS = [
    pytest.param(lambda m: audit_model(m, _input(), **ANY), id="eager inference"),
    pytest.param(lambda m: audit_model(m, _input(), train=True, **ANY), id="eager training"),
    pytest.param(_fake, id="fake inference"),
    pytest.param(lambda m: _fake(m, train=True), id="fake training", marks=needs_node_by_node),
]


@pytest.mark.parametrize("audit", AUDITS)
def test_a_library_imported_inside_the_forward_is_not_charged_to_channels_last(audit):
    costing = _costing(audit(om.ImportsLazily()))
    assert not any(where.startswith(om.HELPER) for where in costing)


@pytest.mark.parametrize("audit", AUDITS)
def test_a_lazily_cached_copy_is_not_charged_and_one_made_every_forward_is(audit):
    assert _copy_line() not in _costing(audit(om.CachesStatistics()))
    every = _costing(audit(om.CachesStatistics(cached=False)))
    assert every[_copy_line()] == _input().numel() * 4  # the input's NCHW copy, each forward


def test_a_model_that_fails_only_in_the_warm_up_still_fails_the_audit_saying_where():
    from cl_audit.errors import ModelFailedError

    model = om.FailsOnce()
    with pytest.raises(ModelFailedError) as failed:
        audit_model(model, _input(), **ANY)
    assert model.calls == 2  # the warm-up failed; the audited run then ran
    message = str(failed.value)
    assert "not initialised yet" in message and "forward" in message
    assert "unaudited run before the audited one" in message
