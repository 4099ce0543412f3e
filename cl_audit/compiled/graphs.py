"""Inductor's layout decision for a compiled model (``--compile``).

``torch.compile`` lays convolutions out channels_last or not per graph, by a heuristic
(``GraphLowering.decide_layout_opt``). This module captures the graphs Inductor would be given
(the inference graph; a training step's forward and backward graphs) with Dynamo and
AOTAutograd on fake tensors, asks torch's own heuristic for each decision, and explains it: the
branch that decided and the convolutions that decided it, with their model source lines. The
explanation is cl-audit's reading of the heuristic, checked against torch's answer on every
graph: where the two disagree, the graph says so (``LayoutBranch.UNEXPLAINED``).

On the CPU, with mkldnn, Inductor always uses channels_last for convolutions; for CUDA without
a GPU the decision is a prediction: the graphs are traced on fake CPU tensors (autograd's
engine needs a CUDA device for a CUDA backward, and Dynamo reaches the CUDA driver for some
models' fake CUDA tensors) and decided as a GPU would decide them, without mkldnn's CPU branch.
The heuristic reads only the graph's convolutions (weights, groups, output shapes) and its
node count, which agree between fake CUDA and CPU traces (measured in reports/pages/compiled.md).
A model whose shapes depend on its values (a detection model's ``nonzero`` keeps the boxes that
score) cannot run on fake tensors: its graphs are traced on real tensors holding a copy of its
values instead, and the result names the operation that needed them.

Each graph is then lowered by Inductor (``GraphLowering``, no code generated) under its decision,
and the copies the lowering inserts to change a buffer's layout are reported with the source
lines that made the data; for CUDA without a GPU that lowering is the CPU's under the CUDA
decision, a prediction. ``beside_eager`` sets them beside an eager audit's losses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn
from torch.func import functional_call

from cl_audit.compat.cuda import cuda_present
from cl_audit.compat.failures import data_dependent_op
from cl_audit.compat.inductor import (
    CapturedGraph,
    GraphCopy,
    backward_convolutions_decide,
    capture_graphs,
    compile_problem,
    graph_convolutions,
    graph_nodes,
    layout_decision,
    lowered_copies,
)
from cl_audit.compiled.heuristic import (
    compiled_conv,
    conv_flops,
    explain,
    module_path_of,
    on_off,
)
from cl_audit.enums import Amp, CopyKind, Fate, LayoutBranch, Phase, Strategy
from cl_audit.errors import UsageError
from cl_audit.execution.autocast import autocast_for
from cl_audit.execution.convert import strategy_input
from cl_audit.execution.inputs import Example, example_of
from cl_audit.execution.training import training_loss
from cl_audit.fake.kernels import fake_state
from cl_audit.fake.mode import fake_tensor, new_fake_mode
from cl_audit.report.compiled_report import (
    Compiled,
    CompiledCopy,
    CompiledGraph,
    CompiledSite,
)
from cl_audit.report.model_report import Finding
from cl_audit.rule.attribution import frames_call_site
from cl_audit.rule.layout import MemoryLayout, classify

__all__ = ["beside_eager", "compiled_layouts"]


def compiled_layouts(
    model: nn.Module,
    example_input: object,
    *,
    device: torch.device | str = "cpu",
    train: bool = False,
    amp: Amp | None = None,
    strategy: Strategy = Strategy.CHANNELS_LAST,
    seed: int = 0,
    force: bool = False,
) -> Compiled:
    """Inductor's layout decision for each graph of ``model`` on ``example_input`` (as
    ``audit_model`` takes it): the inference graph, or with ``train`` a training step's forward
    and backward graphs (the loss of ``training_loss``), on ``device`` (a CUDA device need not
    exist: then a prediction), under ``amp``'s autocast (``Amp.BF16``/``Amp.FP16``), the inputs
    converted as ``strategy`` says; with ``force`` also the decision under Inductor's force
    switch. Each graph is lowered under its decision to find the layout copies Inductor inserts.
    Convert the model as the strategy says first
    (``model.to(memory_format=torch.channels_last)``); it is not changed (fake copies of its
    parameters are traced; real copies where the model's shapes depend on its values, which
    ``Compiled.data_dependent`` names), and the inputs are converted here."""
    problem = compile_problem()
    if problem is not None:
        raise UsageError(problem)
    example = example_of(example_input)
    target = torch.device(device)
    predicted = target.type == "cuda" and not cuda_present()
    traced_on = torch.device("cpu") if predicted else target
    names = {name for name, _ in model.named_parameters()}
    was_training = model.training
    model.train(train)
    start = time.perf_counter()
    data_dependent = None
    try:
        mode = new_fake_mode()
        fake = (fake_state(mode, model, traced_on), lambda x: fake_tensor(mode, x, traced_on))
        try:
            graphs = _capture(model, example, fake, traced_on, names, train, amp, strategy, seed)
        except Exception as e:  # re-raised unless fake tensors lacked the values it reads
            data_dependent = data_dependent_op(e)
            if data_dependent is None:
                raise
            real = (
                {n: t.detach().clone().to(traced_on) for n, t in _state(model)},
                lambda x: x.clone().to(traced_on),
            )
            graphs = _capture(model, example, real, traced_on, names, train, amp, strategy, seed)
    finally:
        model.train(was_training)
    generic = target.type != "cpu"
    decided = tuple(_graph(i, g, generic, force) for i, g in enumerate(graphs))
    seconds = time.perf_counter() - start
    return Compiled(
        device=str(target),
        traced_on=str(traced_on),
        predicted=predicted,
        torch=torch.__version__,
        backward_convolutions_counted=backward_convolutions_decide(),
        force_layout_opt=force,
        seconds=seconds,
        graphs=decided,
        data_dependent=data_dependent,
    )


def _state(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def _capture(
    model: nn.Module,
    example: Example,
    tensors: tuple[dict[str, torch.Tensor], Callable[[torch.Tensor], torch.Tensor]],
    device: torch.device,
    names: set[str],
    train: bool,
    amp: Amp | None,
    strategy: Strategy,
    seed: int,
) -> list[CapturedGraph]:
    """The graphs of one forward (and with ``train`` its loss's backward) of ``model`` on
    ``tensors`` on ``device``: its state by name and how an input tensor is made."""
    state, make = tensors
    for name, tensor in state.items():
        tensor.requires_grad_(train and name in names)
    inputs = example.map(
        lambda x: make(strategy_input(x, strategy)) if isinstance(x, torch.Tensor) else x
    )

    def forward() -> object:
        with autocast_for(device, amp, fake=True):
            return functional_call(model, state, inputs.args, dict(inputs.kwargs))

    def backward(output: object) -> None:
        training_loss(output, seed).backward()

    with torch.set_grad_enabled(train):
        graphs = capture_graphs(forward, backward if train else None)
    if not graphs:
        raise RuntimeError(
            "Dynamo captured no graph: the model ran eagerly (a graph break at every operation, "
            "or Dynamo's errors suppressed by its suppress_errors setting)"
        )
    return graphs


def _graph(index: int, graph: CapturedGraph, generic: bool, force: bool) -> CompiledGraph:
    """One captured graph: torch's decision, cl-audit's explanation of it, and the copies its
    lowering inserts under it (and under the forced decision, when asked)."""
    gm, inference = graph.gm, graph.phase == "inference"
    decided = layout_decision(gm, inference=inference, generic=generic)
    found = graph_convolutions(gm)
    flops = [conv_flops(c) for c in found]
    total = sum(flops) or 1
    convs = [compiled_conv(c, f / total) for c, f in zip(found, flops, strict=True)]
    backward_counted = backward_convolutions_decide()
    counted = [i for i, c in enumerate(convs) if backward_counted or not c.backward]
    nodes = graph_nodes(gm)
    reading = explain(convs, counted, flops, nodes, inference, generic)
    branch, reason, deciding = reading.branch, reading.reason, reading.deciding
    other = sum(len(convs[i].kernel) != 2 for i in counted)
    if decided and other:
        reason += (
            f"; only 2-D convolutions are laid out channels_last: Inductor's lowering leaves "
            f"this graph's {other} other convolution(s) (3-D or 1-D) as they come"
        )
    if reading.decision != decided:
        branch, deciding = LayoutBranch.UNEXPLAINED, set()
        reason = (
            f"torch {torch.__version__} decided {on_off(decided)}, where cl-audit's reading of its "
            f"heuristic says {on_off(reading.decision)} ({reading.reason})"
        )
    forced = (
        layout_decision(gm, inference=inference, generic=generic, force=True) if force else None
    )
    try:
        conversions = _lowered(graph, decided)
        forced_conversions = None
        if forced is not None:
            forced_conversions = conversions if forced == decided else _lowered(graph, forced)
    except Exception as e:  # reported: the graph's decision stands without its copies
        conversions = forced_conversions = None
        lowering_error = f"Inductor could not lower it: {type(e).__name__}: {_first_line(e)}"
    else:
        lowering_error = None
    return CompiledGraph(
        index=index,
        phase=Phase.BACKWARD if graph.phase == "backward" else Phase.FORWARD,
        inference=inference,
        layout_optimization=decided,
        branch=branch,
        reason=reason,
        nodes=nodes,
        convolutions=tuple(replace(c, deciding=i in deciding) for i, c in enumerate(convs)),
        forced=forced,
        conversions=conversions,
        forced_conversions=forced_conversions,
        lowering_error=lowering_error,
    )


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:300] if lines else "(no message)"


_KINDS = {
    MemoryLayout.CHANNELS_LAST: CopyKind.TO_CHANNELS_LAST,
    MemoryLayout.CONTIGUOUS: CopyKind.TO_CONTIGUOUS,
}


def _lowered(graph: CapturedGraph, layout_opt: bool) -> tuple[CompiledCopy, ...]:
    """The layout copies of ``graph`` lowered under ``layout_opt``, largest first."""
    copies = [_copy(c) for c in lowered_copies(graph, layout_opt)]
    return tuple(sorted(copies, key=lambda c: -c.bytes))


def _copy(c: GraphCopy) -> CompiledCopy:
    """The report's copy: attributed to where its data was made (a graph input: its consumer)."""
    made_at = frames_call_site(c.producer_frames)
    module = c.producer_module if made_at is not None else c.consumer_module
    return CompiledCopy(
        call_site=made_at or frames_call_site(c.consumer_frames),
        module_path=None if module is None else module_path_of(module[0]),
        producer=c.producer,
        consumer=c.consumer,
        consumer_site=frames_call_site(c.consumer_frames),
        kind=_KINDS.get(classify(c.shape, c.strides), CopyKind.OTHER),
        shape=c.shape,
        source_strides=c.source_strides,
        strides=c.strides,
        bytes=c.bytes,
    )


def beside_eager(compiled: Compiled, losses: tuple[Finding, ...]) -> Compiled:
    """``compiled`` with its copies set beside the eager audit's ``losses`` (its offenders), per
    call site: an eager loss is kept where a compiled copy's data was made or consumed at its
    site, removed where none was; a copy at a site with no eager loss is added. Without the
    copies of every graph (a lowering failed) there is nothing to set beside: unchanged."""
    if any(g.conversions is None for g in compiled.graphs):
        return compiled
    copies = [c for g in compiled.graphs for c in g.conversions or ()]
    eager: dict[str | None, list[Finding]] = {}
    for finding in losses:
        eager.setdefault(finding.call_site, []).append(finding)
    sites = []
    matched: set[int] = set()
    for site, findings in eager.items():
        there = [i for i, c in enumerate(copies) if site in (c.call_site, c.consumer_site)]
        matched.update(there)
        sites.append(
            CompiledSite(
                call_site=site,
                module_path=findings[0].module_path,
                fate=Fate.KEPT if there else Fate.REMOVED,
                eager_losses=sum(f.count for f in findings),
                eager_bytes=sum(f.bytes_converted for f in findings),
                compiled_copies=len(there),
                compiled_bytes=sum(copies[i].bytes for i in there),
            )
        )
    added: dict[str | None, list[CompiledCopy]] = {}
    for i, c in enumerate(copies):
        if i not in matched:
            added.setdefault(c.call_site, []).append(c)
    for site, extra in added.items():
        sites.append(
            CompiledSite(
                call_site=site,
                module_path=extra[0].module_path,
                fate=Fate.ADDED,
                eager_losses=0,
                eager_bytes=0,
                compiled_copies=len(extra),
                compiled_bytes=sum(c.bytes for c in extra),
            )
        )
    order = {Fate.ADDED: 0, Fate.KEPT: 1, Fate.REMOVED: 2}
    sites.sort(key=lambda s: (order[s.fate], -(s.compiled_bytes + s.eager_bytes)))
    return replace(compiled, sites=tuple(sites))
