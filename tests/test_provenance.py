"""Provenance, round trips per converted tensor and regain sources, on tests/rule_models.py."""

from __future__ import annotations

import pytest
import rule_models
import torch
from conftest import channels_last

import cl_audit
from cl_audit.report import Provenance, RegainSource


def audit_factory(factory, engine: str) -> cl_audit.ModelReport:
    model, shape = factory()
    return cl_audit.audit_model(model, torch.randn(2, *shape), engine=engine, differential=False)


def losses(report: cl_audit.ModelReport):
    return report.offenders + report.parameter_conversions


def test_weight_standardisation_is_a_parameter_loss_beside_a_batch_one(engine):
    report = audit_factory(rule_models.weight_standardization, engine)
    (weight,) = report.parameter_conversions
    assert weight.provenance is Provenance.PARAMETER
    assert weight.python_op == "Tensor.reshape" and weight.inputs[0].shape == (8, 3, 3, 3)
    assert weight.round_trips == 1  # the convolution converts the standardised weight back
    (activation,) = report.offenders  # the control: the softmax over channels, same model
    assert activation.python_op == "F.softmax" and activation.provenance is Provenance.BATCH
    (regain,) = report.regains
    assert regain.provenance is Provenance.PARAMETER
    assert regain.regain_source is RegainSource.LOSS
    assert regain.root_cause.python_op == "Tensor.reshape"
    # the regain from the standardised weight is a parameter matter: not in the summary's
    # count of activation regains, nor in its bytes (the softmax's alone)
    assert report.summary.regains == 0
    assert report.summary.bytes_converted == activation.bytes_converted


def test_weight_standardisation_without_a_model_argument_learns_the_parameters(engine):
    model, shape = rule_models.weight_standardization()
    model = model.to(memory_format=torch.channels_last).eval()
    x = torch.randn(2, *shape).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), cl_audit.audit(engine) as audit:
        model(x)
    report = audit.report()
    assert [f.python_op for f in report.parameter_conversions] == ["Tensor.reshape"]
    assert [f.python_op for f in report.offenders] == ["F.softmax"]


@pytest.mark.parametrize(
    "factory, op",
    [
        (rule_models.pos_embed, "add"),  # volo: the only channels_last input is the parameter
        (rule_models.relative_bias, "add"),  # gathered from a table by an index buffer
        (rule_models.coord_grid, "torch.flatten"),  # a coordinate-grid buffer
    ],
    ids=["pos_embed", "relative_bias", "coord_grid"],
)
def test_conversions_of_parameter_data_have_parameter_provenance(factory, op, engine):
    report = audit_factory(factory, engine)
    assert report.offenders == ()
    (finding,) = report.parameter_conversions
    assert finding.provenance is Provenance.PARAMETER
    assert op in finding.op


def test_parameter_provenance_splits_identical_events(engine):
    """The same call site converting a parameter and an activation gives two findings."""
    param = torch.nn.Parameter(channels_last(2, 8, 6, 6))
    module = torch.nn.Module()
    module.param = param

    def flatten(t):
        return torch.flatten(t, 1)

    activation = channels_last(2, 8, 6, 6)  # made outside: a constant if made inside
    with torch.no_grad(), cl_audit.audit(engine, model=module) as audit:
        for t in (param, activation):
            flatten(t)
    report = audit.report()
    assert [f.provenance for f in report.offenders] == [Provenance.BATCH]
    assert [f.provenance for f in report.parameter_conversions] == [Provenance.PARAMETER]


class MakesAGrid(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = torch.ones(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
        return torch.flatten(grid, 1) + x.mean()


def test_constants_the_model_makes_count_as_parameters(engine):
    model = MakesAGrid()
    with torch.no_grad(), cl_audit.audit(engine, model=model) as audit:
        model(torch.randn(2))
    report = audit.report()
    assert report.offenders == ()
    assert [f.provenance for f in report.parameter_conversions] == [Provenance.PARAMETER]


def test_an_input_made_inside_the_audit_block_is_batch_data(engine):
    """The control: the same tensor made by the caller, outside any module, is the batch."""
    with torch.no_grad(), cl_audit.audit(engine) as audit:
        grid = torch.ones(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
        torch.flatten(grid, 1)
    report = audit.report()
    assert [f.provenance for f in report.offenders] == [Provenance.BATCH]
    assert report.parameter_conversions == ()


def test_reused_storage_of_parameter_data_is_forgotten(engine):
    """A parameter-derived temporary is freed; activations later made do not inherit its
    provenance even when their storage takes its address."""
    weight = torch.nn.Parameter(torch.randn(8, 8))
    module = torch.nn.Module()
    module.weight = weight
    x = channels_last(2, 8, 6, 6)
    with torch.no_grad(), cl_audit.audit(engine, model=module) as audit:
        for _ in range(20):
            (weight * 2).sum()  # parameter-derived temporaries, freed at once
            torch.flatten(x * 1, 1)
    report = audit.report()
    assert report.parameter_conversions == ()
    assert sum(f.count for f in report.offenders) == 20


def test_each_of_three_identical_copies_is_a_round_trip(engine):
    report = audit_factory(rule_models.qkv_copies, engine)
    (copies,) = report.offenders  # q, k and v, one call site: merged
    assert copies.count == 3
    assert copies.round_trips == 3 and copies.terminal == 0
    (regain,) = report.regains
    assert regain.regain_source is RegainSource.LOSS
    assert regain.root_cause.python_op == "Tensor.contiguous"


def test_regain_of_tokens_viewed_back_to_nchw_names_the_view(engine):
    report = audit_factory(rule_models.tokens_to_map, engine)
    assert report.offenders == ()
    (regain,) = report.regains
    assert regain.regain_source is RegainSource.PRODUCER
    assert regain.root_cause.python_op == "Tensor.view"
    assert regain.root_cause.module_path == ""
    if engine == "dispatch":
        assert regain.root_cause.aten_op == "aten.view"


def test_regain_of_an_nchw_input_comes_from_outside(engine):
    conv = torch.nn.Conv2d(8, 8, 1).to(memory_format=torch.channels_last)
    x = torch.randn(2, 8, 6, 6)  # made before the audit
    with torch.no_grad(), cl_audit.audit(engine, model=conv) as audit:
        conv(x)
        conv(torch.relu(x))  # derived from the input: still from outside
    report = audit.report()
    assert report.summary.regains == 2
    assert {f.regain_source for f in report.regains} == {RegainSource.OUTSIDE}
    assert all(f.root_cause is None for f in report.regains)


def test_regain_of_data_made_in_the_audit_names_its_producer(engine):
    conv = torch.nn.Conv2d(8, 8, 1).to(memory_format=torch.channels_last)
    with torch.no_grad(), cl_audit.audit(engine, model=conv) as audit:
        conv(torch.zeros(2, 8, 6, 6))
    (regain,) = audit.report().regains
    assert regain.regain_source is RegainSource.PRODUCER
    assert regain.root_cause.python_op == "torch.zeros"


def test_regain_of_a_permuted_map_is_not_silent(engine):
    """Channels_last data viewed as contiguous NHWC, normalised, then fed to a convolution as
    if NCHW: the layer norm wrote that contiguous 4D data; the permute, a view of the
    channels_last map, moved nothing and is never the root cause."""
    conv = torch.nn.Conv2d(6, 6, 1).to(memory_format=torch.channels_last)
    x = channels_last(2, 6, 6, 6)
    with torch.no_grad(), cl_audit.audit(engine, model=conv) as audit:
        conv(torch.nn.functional.layer_norm(x.permute(0, 2, 3, 1), (6,)))
    (regain,) = audit.report().regains
    assert regain.regain_source is RegainSource.PRODUCER
    assert regain.root_cause.python_op == "F.layer_norm"


@pytest.mark.parametrize(
    "factory",
    [
        rule_models.resnest_split,
        rule_models.sk_stack,
        rule_models.qkv_copies,
        rule_models.weight_standardization,
        rule_models.tokens_to_map,
    ],
)
def test_every_regain_has_a_source(factory, engine):
    report = audit_factory(factory, engine)
    assert report.regains
    for regain in report.regains:
        assert regain.regain_source is not None
        assert (regain.root_cause is None) == (regain.regain_source is RegainSource.OUTSIDE)
