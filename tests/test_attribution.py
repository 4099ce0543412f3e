"""Module path, call site and root cause on toy models with known answers."""

from __future__ import annotations

import inspect

import torch
import toy_models

import cl_audit


def line_of(obj: object, text: str) -> str:
    """'tests/toy_models.py:N' for the line of ``obj``'s source holding ``text``."""
    lines, start = inspect.getsourcelines(obj)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"toy_models.py:{start + offset}"


def audit_toy(model: torch.nn.Module, engine: str, size: int = 16) -> cl_audit.ModelReport:
    return cl_audit.audit_model(model, torch.randn(2, 3, size, size), engine=engine)


def test_channel_shuffle_copy_is_a_round_trip_at_its_line(engine):
    report = audit_toy(toy_models.ChannelShuffle(), engine)
    (finding,) = report.offenders
    assert finding.python_op == "Tensor.contiguous"
    assert (finding.module_path, finding.module_class) == ("", "ChannelShuffle")
    assert finding.call_site.endswith(line_of(toy_models.ChannelShuffle.forward, ".contiguous()"))
    assert finding.inputs[0].shape == (2, 4, 2, 16, 16)  # the transposed 5D view
    assert (finding.round_trips, finding.terminal) == (1, 0)
    assert report.summary.regains == 1
    assert report.regains[0].module_path == "after"


def test_flatten_before_classifier_is_terminal(engine):
    report = audit_toy(toy_models.FlattenHead(), engine)
    (finding,) = report.offenders
    assert finding.python_op == "torch.flatten"
    assert finding.call_site.endswith(line_of(toy_models.FlattenHead.forward, "torch.flatten"))
    assert (finding.round_trips, finding.terminal) == (0, 1)


def test_mixed_concat_names_the_producer_of_the_contiguous_input(engine):
    report = audit_toy(toy_models.MixedConcat(), engine)
    (finding,) = report.offenders
    assert finding.python_op == "torch.cat" and finding.mixed_formats
    root = finding.root_cause
    assert root is not None
    assert root.python_op == "F.interpolate"
    assert (root.module_path, root.module_class) == ("pool", "PooledBranch")
    assert root.call_site.endswith(line_of(toy_models.PooledBranch.forward, "F.interpolate"))
    assert finding.round_trips == 1  # the 1x1 projection converts the cat back


def test_clean_model_has_no_offenders(engine):
    report = audit_toy(toy_models.CleanNet(), engine)
    assert report.offenders == ()
    assert report.summary.calls_checked > 10


def test_module_paths_are_learned_without_a_model_argument():
    model = toy_models.MixedConcat().to(memory_format=torch.channels_last).eval()
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), cl_audit.audit() as audit:
        model(x)
    (finding,) = audit.report().offenders
    assert finding.module_path == "" and finding.root_cause.module_path == "pool"


def test_both_engines_find_the_same_offender_sites():
    for factory in (toy_models.ChannelShuffle, toy_models.FlattenHead, toy_models.MixedConcat):
        sites = {
            engine: {(f.module_path, f.call_site) for f in audit_toy(factory(), engine).offenders}
            for engine in ("dispatch", "patch")
        }
        assert sites["dispatch"] == sites["patch"] != set()


def test_5d_input_uses_channels_last_3d(engine):
    model = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Softmax(dim=1))
    report = cl_audit.audit_model(model, torch.randn(2, 3, 4, 8, 8), engine=engine)
    (finding,) = report.offenders
    assert finding.module_path == "1" and finding.module_class == "Softmax"
    assert finding.inputs[0].layout is cl_audit.MemoryLayout.CHANNELS_LAST


def test_conversion_matches_module_to_and_handles_mixed_ranks():
    from cl_audit.execution.convert import to_channels_last as convert_to_channels_last

    pointwise = torch.nn.Conv2d(4, 8, 1)
    reference = torch.nn.Conv2d(4, 8, 1).to(memory_format=torch.channels_last)
    convert_to_channels_last(pointwise)
    assert pointwise.weight.stride() == reference.weight.stride() == (4, 1, 4, 4)
    mixed = torch.nn.ModuleDict({"a": torch.nn.Conv2d(3, 4, 3), "b": torch.nn.Conv3d(3, 4, 3)})
    convert_to_channels_last(mixed)
    assert mixed["a"].weight.is_contiguous(memory_format=torch.channels_last)
    assert mixed["b"].weight.is_contiguous(memory_format=torch.channels_last_3d)
