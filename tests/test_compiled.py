"""``--compile``: Inductor's layout decision per compiled graph, its branch and the convolutions
that decided it, for CUDA (a prediction made without a GPU) and for this CPU; the layout copies
Inductor's lowering inserts, beside the eager audit's losses; and an audit never changes what a
user's compiled function does afterwards."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import jsonschema
import pytest
import torch
from compiled_models import (
    Clip,
    Copied,
    Depthwise,
    Grouped,
    HeldOutGrouped,
    Narrowing,
    Plain,
    Selected,
    Shuffled,
    Small,
    Tokens,
)
from literal_reports import before_version_7
from test_cli import invoke, run_cli
from torch._dynamo.utils import counters
from torch_checks import needs_fake_cuda

from cl_audit import audit_model, compiled_layouts
from cl_audit.compat.inductor import backward_convolutions_decide, compile_problem
from cl_audit.enums import ConvClass, CopyKind, Fate, LayoutBranch, Phase
from cl_audit.report import REPORT_VERSION, ModelReport, load_schema

MODELS = str(Path(__file__).with_name("compiled_models.py"))
COMPILE_PROBLEM = compile_problem()
pytestmark = pytest.mark.skipif(
    COMPILE_PROBLEM is not None, reason=f"--compile is refused here: {COMPILE_PROBLEM}"
)


def _line(cls: type, text: str) -> str:
    """``compiled_models.py:N`` of the line of ``cls.forward`` that holds ``text``."""
    lines, first = inspect.getsourcelines(cls.forward)
    number = next(first + i for i, line in enumerate(lines) if text in line)
    return f"compiled_models.py:{number}"


def _layouts(cls: type, device: str, train: bool, **kwargs):
    torch.manual_seed(0)
    model = cls().to(memory_format=torch.channels_last)
    return compiled_layouts(model, torch.randn(2, 3, 16, 16), device=device, train=train, **kwargs)


def _forward(compiled):
    (graph,) = [g for g in compiled.graphs if g.phase is Phase.FORWARD]
    return graph


@pytest.mark.parametrize(
    ("cls", "branch", "deciding", "call"),
    [
        (Grouped, LayoutBranch.GROUPED, "grouped", "self.grouped(x)"),
        (Narrowing, LayoutBranch.IN_OUT, "narrow", "self.narrow(x)"),
    ],
)
def test_a_vetoing_convolution_turns_the_cuda_training_forward_off_and_is_named(
    cls, branch, deciding, call
):
    compiled = _layouts(cls, "cuda", train=True)
    assert compiled.predicted and compiled.traced_on == "cpu"  # no GPU here: a prediction
    graph = _forward(compiled)
    assert not graph.inference and not graph.layout_optimization
    assert graph.branch is branch
    (conv,) = graph.deciding
    assert conv.module_path == deciding and conv.module_class == "Conv2d"
    assert conv.call_site is not None and conv.call_site.endswith(_line(cls, call))
    assert f"{_line(cls, call)}" in graph.reason


def test_the_grouped_convolution_reports_its_input_channels_per_group():
    conv = _forward(_layouts(Grouped, "cuda", train=True)).deciding[0]
    assert (conv.kind, conv.groups, conv.in_per_group, conv.out_channels, conv.kernel) == (
        ConvClass.GROUPED,
        16,
        8,
        128,
        (3, 3),
    )


@pytest.mark.parametrize("cls", [Plain, Depthwise])
def test_wide_or_depthwise_convolutions_keep_the_cuda_training_forward_on(cls):
    """The positive controls: one input channel per group is not grouped to the heuristic."""
    graph = _forward(_layouts(cls, "cuda", train=True))
    assert graph.layout_optimization and graph.branch is LayoutBranch.NO_VETO
    assert not graph.deciding


def test_all_small_convolutions_turn_the_cuda_training_forward_off():
    graph = _forward(_layouts(Small, "cuda", train=True))
    assert not graph.layout_optimization and graph.branch is LayoutBranch.ALL_SMALL
    assert {c.module_path for c in graph.deciding} == {"first", "second"}


def test_grouped_flops_outvote_channels_last_in_cuda_inference():
    compiled = _layouts(Grouped, "cuda", train=False)
    assert compiled.predicted and compiled.traced_on == "cpu"
    (graph,) = compiled.graphs
    assert graph.inference and not graph.layout_optimization
    # 8/11 of the flops grouped (x 1.358), the stem's default (x 0.823): 1.212 > 1, so off
    assert graph.branch is LayoutBranch.VOTE and "would take 1.212x" in graph.reason
    (conv,) = graph.deciding
    assert conv.module_path == "grouped" and conv.flop_share > 0.5
    assert conv.call_site.endswith(_line(Grouped, "self.grouped(x)"))


@pytest.mark.parametrize("cls", [Plain, Narrowing, Small])
def test_ungrouped_convolutions_win_the_cuda_inference_vote(cls):
    """In inference only grouped convolutions weigh against channels_last."""
    (graph,) = _layouts(cls, "cuda", train=False).graphs
    assert graph.layout_optimization and graph.branch is LayoutBranch.VOTE
    assert not graph.deciding


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no mkldnn in this build")
@pytest.mark.parametrize("cls", [Grouped, Narrowing, Small, Plain])
@pytest.mark.parametrize("train", [False, True])
def test_on_the_cpu_inductor_always_lays_convolutions_out_channels_last(cls, train):
    compiled = _layouts(cls, "cpu", train=train)
    assert not compiled.predicted
    graph = _forward(compiled) if train else compiled.graphs[0]
    assert graph.layout_optimization and graph.branch is LayoutBranch.MKLDNN_CPU


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_training_backward_graph_is_decided_as_this_torch_counts_its_convolutions(device):
    """torch 2.14 does not count ``convolution_backward`` (pytorch/pytorch#189239): the backward
    is lowered without layout optimisation; torch 2.15 counts it (the probe says which)."""
    compiled = _layouts(Plain, device, train=True, force=True)
    (backward,) = [g for g in compiled.graphs if g.phase is Phase.BACKWARD]
    assert len(backward.convolutions) == 2 and all(c.backward for c in backward.convolutions)
    assert compiled.backward_convolutions_counted is backward_convolutions_decide()
    if backward_convolutions_decide():
        assert backward.layout_optimization and backward.branch is not LayoutBranch.NO_CONVOLUTION
    else:
        assert not backward.layout_optimization
        assert backward.branch is LayoutBranch.NO_CONVOLUTION and "189239" in backward.reason
    assert backward.forced is True  # --force-layout-opt: Inductor's switch turns it on


def test_the_explanation_agrees_with_torch_on_every_toy_graph():
    for cls in (Plain, Grouped, Depthwise, Narrowing, Small):
        for device in ("cpu", "cuda"):
            for graph in _layouts(cls, device, train=True).graphs:
                assert graph.branch is not LayoutBranch.UNEXPLAINED, (cls, device, graph.reason)


@pytest.mark.parametrize("train", [False, True])
def test_a_model_whose_shapes_depend_on_its_values_is_traced_on_real_values(train):
    """Fake tensors cannot run the mask's ``nonzero``: the graphs are traced again on real
    tensors holding the model's values, and the report names the operation that needed them.
    Plain, without the selection, is the control traced on fake tensors."""
    selected = _layouts(Selected, "cuda", train=train)
    assert selected.data_dependent is not None and "nonzero" in selected.data_dependent
    assert "with real values (aten.nonzero" in selected.basis
    assert sum(len(g.convolutions) for g in selected.graphs if g.phase is not Phase.BACKWARD) == 2
    assert all(g.branch is not LayoutBranch.UNEXPLAINED for g in selected.graphs)
    plain = _layouts(Plain, "cuda", train=train)
    assert plain.data_dependent is None and "real values" not in plain.basis


def test_the_model_is_not_changed_and_its_mode_restored():
    from torch._inductor import ir

    lowering = {k: ir.ExternKernel.__dict__[k] for k in ("require_strides", "copy_input")}
    model = Grouped().to(memory_format=torch.channels_last).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compiled_layouts(model, torch.randn(2, 3, 16, 16), train=True)
    assert {k: ir.ExternKernel.__dict__[k] for k in lowering} == lowering  # the same objects
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


class _Counting:
    """A torch.compile backend that counts compilations and runs of what it compiled."""

    def __init__(self) -> None:
        self.compiled = self.runs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: object):
        self.compiled += 1

        def run(*args: object):
            self.runs += 1
            return gm.forward(*args)

        return run


def test_a_users_compiled_function_still_runs_compiled_after_audits():
    backend = _Counting()
    model = Plain().to(memory_format=torch.channels_last).eval()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        compiled(x)
    assert (backend.compiled, backend.runs) == (1, 1)
    audit_model(Plain(), torch.randn(2, 3, 16, 16), compile=True)  # capture, and an eager audit
    audit_model(Plain(), torch.randn(2, 3, 16, 16), train=True)
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        compiled(x)
    assert (backend.compiled, backend.runs) == (1, 2)  # the same compiled graph ran again
    assert counters["stats"]["unique_graphs"] == graphs  # Dynamo's own count: no recompile
    later = _Counting()
    with torch.no_grad():
        torch.compile(Small().eval(), backend=later)(x)
    assert (later.compiled, later.runs) == (1, 1)  # and a new one compiles


def test_inductor_still_compiles_the_audited_model_after_the_capture():
    """The capture runs Inductor's front end with its own inner compiler: nothing it made may
    be cached as compiled code for the user's torch.compile of the same model."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = Plain().to(memory_format=torch.channels_last).eval()
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    audit_model(model, x, compile=True, differential=False)
    torch._dynamo.reset()
    with torch.no_grad():
        result, code = run_and_get_code(torch.compile(model), x)
        assert torch.allclose(result, model(x), atol=1e-5)
    assert code and "def call(" in code[0]  # Inductor generated (and ran) its own code


def test_compile_report_round_trips_and_matches_the_schema(tmp_path):
    report = audit_model(Grouped(), torch.randn(2, 3, 16, 16), compile=True, force_layout_opt=True)
    data = report.to_dict()
    assert data["version"] == REPORT_VERSION
    jsonschema.validate(data, load_schema())
    again = ModelReport.from_dict(json.loads(json.dumps(data)))
    assert again.to_dict() == data and again.compiled.graphs[0].deciding == ()
    assert report.compiled.force_layout_opt and report.compiled.graphs[0].forced is True


def test_the_cli_prints_each_graphs_decision_and_writes_it(tmp_path):
    out = tmp_path / "r.json"
    result = invoke(f"{MODELS}:Grouped", "--compile", "--train", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "torch.compile" in result.output and "graph 1 (training backward" in result.output
    graphs = json.loads(out.read_text())["compiled"]["graphs"]
    assert [g["phase"] for g in graphs] == ["forward", "backward"]


def test_compile_options_are_refused_where_they_cannot_take_effect():
    alone = run_cli(f"{MODELS}:Plain", "--force-layout-opt")
    assert alone.returncode == 2 and "--compile" in alone.stderr
    sweep = run_cli(f"{MODELS}:Plain", f"{MODELS}:Small", "--compile")
    assert sweep.returncode == 2 and "one model" in sweep.stderr
    assert "Traceback" not in alone.stderr + sweep.stderr


def test_the_html_report_shows_each_graph_and_its_deciding_convolution():
    from cl_audit.render.html_model import model_html

    model = Grouped().to(memory_format=torch.channels_last)
    report = audit_model(model, torch.randn(2, 3, 16, 16), train=True, compile=True)
    page = model_html(report)
    assert "<h2>torch.compile: Inductor's layout decision per graph</h2>" in page
    assert "graph 1 (training backward" in page and "MKLDNN" not in page
    assert _line(Grouped, "self.grouped(x)") in page  # the convolutions' call sites, listed
    assert "lowering: no layout copy" in page and "Beside the eager audit" in page
    shuffled = model_html(_audited(Shuffled))
    assert 'id="compiled-copies-0"' in shuffled and "aten.clone.default" in shuffled
    assert '<td>kept</td><td><code class="site">' in shuffled


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "vetoed"),
    [("resnet18", False), ("mobilenet_v3_small", False)],
)
def test_torchvision_models_compile_on_the_cpu_and_are_predicted_for_cuda(name, vetoed):
    """The CPU decision is Inductor's own; the CUDA one a prediction: neither has a
    grouped convolution with several input channels per group, or a narrowing one."""
    import torchvision

    model = getattr(torchvision.models, name)(weights=None)
    report = audit_model(model, torch.randn(2, 3, 64, 64), train=True, compile=True)
    graphs = report.compiled.graphs
    assert [g.phase for g in graphs] == [Phase.FORWARD, Phase.BACKWARD]
    assert graphs[0].layout_optimization and graphs[0].branch is LayoutBranch.MKLDNN_CPU
    assert all(g.conversions is not None for g in graphs)  # every graph lowered
    if name == "resnet18":  # plain convolutions: no layout copy in either graph
        assert [g.conversions for g in graphs] == [(), ()]
    if name == "mobilenet_v3_small":  # depthwise weight gradients (pytorch/pytorch#189239)
        copies = graphs[1].conversions
        assert bool(copies) is not backward_convolutions_decide()
        assert all(c.consumer == "aten.convolution_backward.default" for c in copies)
    cuda = compiled_layouts(model, torch.randn(2, 3, 64, 64), device="cuda", train=True)
    forward = _forward(cuda)
    assert forward.layout_optimization and forward.branch is LayoutBranch.NO_VETO
    assert all(g.branch is not LayoutBranch.UNEXPLAINED for g in cuda.graphs)


def test_a_model_with_no_graph_to_capture_fails_at_the_compile_stage():
    """An identity forward has no operation to compile: no graph, said so, never an empty
    report that would read as 'nothing to decide'."""
    from cl_audit.enums import Stage
    from cl_audit.errors import ModelFailedError

    with pytest.raises(ModelFailedError, match="captured no graph") as failed:
        audit_model(torch.nn.Identity(), torch.randn(2, 3, 8, 8), compile=True)
    assert failed.value.stage is Stage.COMPILE


def test_an_on_decision_for_3d_convolutions_says_the_lowering_leaves_them_alone():
    """decide_layout_opt counts Conv3d, but the lowering converts only 2-D convolutions."""
    model = Clip().to(memory_format=torch.channels_last_3d)
    (graph,) = compiled_layouts(model, torch.randn(2, 3, 4, 8, 8), device="cuda").graphs
    assert graph.layout_optimization and "only 2-D convolutions" in graph.reason
    (plain,) = _layouts(Plain, "cuda", train=False).graphs
    assert "only 2-D" not in plain.reason


def _audited(cls: type, **kwargs):
    torch.manual_seed(0)
    return audit_model(cls(), torch.randn(2, 3, 16, 16), compile=True, **kwargs)


def _site(report, fate: Fate):
    (site,) = [s for s in report.compiled.sites if s.fate is fate]
    return site


def test_the_lowering_copies_an_eager_loss_back_for_the_next_convolution_and_keeps_it():
    report = _audited(Shuffled)
    ((copy,),) = [g.conversions for g in report.compiled.graphs]
    assert copy.call_site.endswith(_line(Shuffled, "# the loss"))  # where the data was made
    assert copy.producer == "aten.clone.default" and copy.kind is CopyKind.TO_CHANNELS_LAST
    assert copy.consumer == "aten.convolution.default"
    assert copy.consumer_site.endswith(_line(Shuffled, "self.body("))
    assert copy.bytes == 2 * 128 * 16 * 16 * 4 and copy.shape == (2, 128, 16, 16)
    kept = _site(report, Fate.KEPT)
    assert kept.call_site == report.offenders[0].call_site and kept.compiled_copies == 1
    assert kept.eager_bytes == report.offenders[0].bytes_converted
    assert [s.fate for s in report.compiled.sites] == [Fate.KEPT]


def test_a_contiguous_copy_between_convolutions_is_removed_by_the_lowering():
    """The control of the test above: the same loss in eager, no copy once compiled."""
    report = _audited(Copied)
    assert [g.conversions for g in report.compiled.graphs] == [()]
    removed = _site(report, Fate.REMOVED)
    assert removed.call_site.endswith(_line(Copied, "# the loss"))
    assert (removed.compiled_copies, removed.eager_losses) == (0, 1)


def test_a_copy_the_compiled_graph_adds_is_named_where_its_data_was_made():
    report = _audited(Tokens)
    assert report.offenders == ()
    added = _site(report, Fate.ADDED)
    assert added.call_site.endswith(_line(Tokens, "# the data"))
    assert (added.eager_losses, added.compiled_copies) == (0, 1)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_training_backward_without_layout_optimisation_copies_and_forcing_removes_them(
    device,
):
    """pytorch/pytorch#189239 on this machine: where torch lowers the backward graph without
    layout optimisation, the depthwise convolution's weight gradient wants its input and
    gradient in another order than the channels_last forward saved, and each is copied;
    ``--force-layout-opt`` lowers them as they come. The plain stack is the control."""
    compiled = _layouts(Depthwise, device, train=True, force=True)
    (backward,) = [g for g in compiled.graphs if g.phase is Phase.BACKWARD]
    assert backward.forced is True and backward.forced_conversions == ()
    if backward_convolutions_decide():  # torch 2.15 lowers the backward channels_last
        assert backward.layout_optimization and backward.conversions == ()
    else:
        assert not backward.layout_optimization and backward.conversions
        depthwise = _line(Depthwise, "self.depthwise(x)")
        assert all(c.consumer == "aten.convolution_backward.default" for c in backward.conversions)
        assert all(c.consumer_site.endswith(depthwise) for c in backward.conversions)
        assert all(c.bytes == 2 * 128 * 16 * 16 * 4 for c in backward.conversions)
    control = _layouts(Plain, device, train=True).graphs
    assert [g.conversions for g in control if g.phase is Phase.BACKWARD] == [()]


def test_the_cli_shows_the_copies_beside_the_eager_losses(tmp_path):
    out = tmp_path / "r.json"
    result = invoke(f"{MODELS}:Shuffled", "--compile", "--json", str(out))
    assert result.exit_code == 1, result.output  # the eager cost gate decides: offending
    text = " ".join(result.output.split())
    assert "cl-audit: offending" in text
    assert "lowering: 1 layout copy" in text and "for convolution at" in text
    assert f"of clone at {_line(Shuffled, '# the loss')}" in text
    assert "0 eager loss site(s) removed, 1 kept, 0 added" in text
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema())
    assert [s["fate"] for s in data["compiled"]["sites"]] == ["kept"]
    assert data["compiled"]["graphs"][0]["conversions"][0]["kind"] == "to_channels_last"


def test_a_version_4_compile_report_is_still_read():
    data = before_version_7(_audited(Shuffled).to_dict())
    data["version"] = 4
    del data["compiled"]["sites"]
    for graph in data["compiled"]["graphs"]:
        for key in ("conversions", "forced_conversions", "lowering_error"):
            del graph[key]
    jsonschema.validate(data, load_schema(version=4))
    compiled = ModelReport.from_dict(data).compiled
    assert compiled.sites is None and compiled.graphs[0].conversions is None


@needs_fake_cuda
def test_a_held_out_grouped_toys_compiled_cuda_training_forward_is_vetoed_by_its_line():
    """--compile --train --fake --device cuda without a GPU: the fake step predicted for CUDA,
    and beside it the compiled graphs, the forward's decision vetoed by the named line."""
    result = run_cli(
        f"{MODELS}:HeldOutGrouped", "--compile", "--train", "--fake", "--device", "cuda",
        "--input-size", "3x64x64", "--json", "-",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["environment"]["mode"] == "fake-step" and data["environment"]["device"] == "cuda"
    forward = next(g for g in data["compiled"]["graphs"] if g["phase"] == "forward")
    assert forward["layout_optimization"] is False
    (deciding,) = [c for c in forward["convolutions"] if c["deciding"]]
    assert deciding["call_site"] == _line(HeldOutGrouped, "self.mix(")
