"""A training step predicted on fake tensors by tracing it once and replaying the trace, so that
the autograd engine, which needs a real device for its backward (CUDA's device threads), runs
only on fake CPU tensors. This is how ``--train --fake`` audits, on any device.

1. The forward and loss are traced on fake tensors of the target device, under its autocast: its
   casts and its operators' layouts, with no backward, so no device is needed.
2. That graph runs again on fake CPU tensors that require grad, followed by the backward and the
   optimizer step, and the whole step is traced: the casts' backward is in it, as on the device.
   The optimizer's state is made first, by a step on zero gradients (``Step.prime``), so the
   step traced is a steady-state one.
3. The step's graph is replayed on fake tensors of the target device, under the audit.

Every node carries where it belongs (``Traced``): a forward node where the forward trace's stack
placed it, a backward node at the forward module and line whose autograd node it runs (as eager
training audits attribute them), optimizer nodes in the optimizer phase.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import fx, nn
from torch.autograd.function import BackwardCFunction
from torch.func import functional_call

from cl_audit.attribution import ModuleNames, Traced
from cl_audit.audit import Audit
from cl_audit.compat import fake_tensor, new_fake_mode
from cl_audit.compat.tracing import (
    building_graph,
    graph_on_device,
    new_nodes,
    node_note,
    note_node,
    trace_graph,
)
from cl_audit.convert import apply_strategy, input_to_nchw, strategy_input
from cl_audit.divergences import divergence_table
from cl_audit.enums import Phase, Stage, Strategy, TensorMode
from cl_audit.errors import UsageError, mark_failure
from cl_audit.fake import KernelSourceMode, fake_state
from cl_audit.inputs import Example
from cl_audit.intercept.dispatch import DispatchEngine
from cl_audit.intercept.naming import aten_op_name, python_op_name
from cl_audit.intercept.recorder import Recorder
from cl_audit.report import AppliedOverride, GradientLayout
from cl_audit.tensors import FakeTensors, Forward, TensorRun
from cl_audit.training import Step, StepPlan, gradient_layouts

__all__ = ["ReplayedTensors"]

_CPU = torch.device("cpu")


class _Annotator:
    """The trace's observer: places every operation as a training audit's recorder would
    (its Python-level call or autograd node, module, call site and phase) and leaves that on
    the graph nodes the operation added."""

    def __init__(self, names: ModuleNames) -> None:
        self.places = Recorder(names, training=True)  # its attribution alone, no rule
        self._graph: fx.Graph | None = None
        self._last: fx.Node | None = None

    def enter_phase(self, phase: Phase) -> None:
        self.places.phase = phase

    def observe(self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any):
        places = self.places
        name = places.python_op(python_op)
        traced = Traced(
            None if name is None else python_op_name(name), places.locate(), places.phase
        )
        if self._graph is None:
            self._graph = building_graph()
        nodes = list(new_nodes(self._graph, self._last))
        if nodes:
            self._last = nodes[0]
        for node in nodes:
            if node.op == "call_function":
                note_node(node, traced)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        engine = DispatchEngine(self, on_python_result=self.places.python_result)
        engine.install()
        try:
            yield
        finally:
            engine.uninstall()


class _Interpreter(fx.Interpreter):
    """Runs a traced graph node by node, telling ``places`` (an audit's or an annotator's
    recorder) where each node belongs; ``devices`` rewrites the devices its nodes name."""

    def __init__(self, graph: fx.GraphModule, places: Callable[[Traced | None], None]) -> None:
        super().__init__(graph)
        self._places = places

    def run_node(self, n: fx.Node) -> Any:
        note = node_note(n)
        self._places(note)
        try:
            return super().run_node(n)
        except Exception as e:  # the stack is the replay's: the node names where it failed
            site = note.location.call_site if isinstance(note, Traced) else None
            mark_failure(e, aten_op_name(n.target), site)
            raise
        finally:
            self._places(None)


def _custom_functions(loss: torch.Tensor) -> list[str]:
    """The custom autograd Functions (their backward nodes' names) behind ``loss``."""
    found, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, BackwardCFunction):
            found.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def _like(mode: Any, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
    return fake_tensor(mode, meta, device)


class _ReplayedStep:
    """The step the phases run: tracing on the warm-up call, replaying under the audit."""

    def __init__(
        self,
        run: _ReplayRun,
        plan: StepPlan,
        fmt: torch.memory_format | None,
        example: Example,
        loss: Callable[[Any], torch.Tensor] | None,
    ) -> None:
        self._run, self._plan, self._fmt, self._example, self._loss = run, plan, fmt, example, loss
        self.stage = Stage.FORWARD
        self.layouts: tuple[GradientLayout, ...] = ()
        self._graph: fx.GraphModule | None = None
        self._inputs: list[torch.Tensor] = []
        self._trainable: dict[str, torch.Tensor] = {}

    def timed(self, device: torch.device) -> tuple[float, ...]:
        raise NotImplementedError("a replay runs no kernel to time")  # refused by the settings

    def run(self, active: Audit | None) -> None:
        if active is None:
            self._trace()
        else:
            self._replay(active)

    def _trace(self) -> None:
        """Steps 1 and 2 of the module docstring; the target's inputs made for step 3."""
        run, plan, device = self._run, self._plan, self._plan.device
        model, names = run.model, ModuleNames(run.model)
        cpu = new_fake_mode()
        state = fake_state(cpu, model, _CPU, self._fmt)
        parameter_names = {name for name, _ in model.named_parameters()}
        trainable = {n: t.requires_grad_(True) for n, t in state.items() if n in parameter_names}
        example = self._example.map(
            lambda x: fake_tensor(cpu, x, _CPU) if isinstance(x, torch.Tensor) else x
        )
        inputs = [*state.values(), *example.tensors()]
        joint = _Annotator(names)
        cpu_plan = replace(plan, device=_CPU)  # the scaler's tensors where the backward runs
        foreach = device.type == "cuda" or None  # the target's optimizer (CUDA: foreach)
        if plan.settings.amp is not None and device.type != "cpu":
            forward_graph = self._forward_on_target()
            cpu_step = Step(cpu_plan, trainable, lambda loss: loss, autocast=False, foreach=foreach)

            def forward() -> object:
                return _Interpreter(forward_graph, joint.places.replaying).run(*inputs)

        else:  # the model itself, under the CPU's autocast if any (the target's own policy)
            cpu_step = Step(cpu_plan, trainable, self._loss, foreach=foreach)

            def forward() -> object:
                return functional_call(model, state, example.args, dict(example.kwargs))

        def one_step(*_: torch.Tensor) -> list[torch.Tensor | None]:
            with joint.watching():  # above the trace's own mode: it sees each node made
                cpu_step.run(forward, joint)
            return [t.grad for t in trainable.values()]

        with cpu:
            self.stage = Stage.FORWARD
            cpu_step.prime()  # the optimizer's state exists: a steady-state step is traced
            state_tensors = cpu_step.state_tensors()
            self._graph = graph_on_device(trace_graph(one_step, inputs + state_tensors), device)
        replay = new_fake_mode()
        self._inputs = [_like(replay, t, device) for t in (*inputs, *state_tensors)]
        # state's order: the parameters (the trainable ones) first, then the buffers
        self._trainable = dict(zip(trainable, self._inputs, strict=False))
        run.parameters = tuple(self._inputs[: len(state)])
        run.replay_mode = replay

    def _forward_on_target(self) -> fx.GraphModule:
        """Step 1: the forward and loss traced on the target's fake tensors under its autocast,
        its devices then moved to the CPU for step 2. A custom autograd Function's own backward
        cannot follow: refused with its name."""
        run, plan, device = self._run, self._plan, self._plan.device
        target = new_fake_mode()
        state = fake_state(target, run.model, device, self._fmt)
        example = self._example.map(
            lambda x: fake_tensor(target, x, device) if isinstance(x, torch.Tensor) else x
        )
        step = Step(plan, {}, self._loss)
        custom: list[str] = []
        annotator = _Annotator(ModuleNames(run.model))

        def forward_and_loss(*_: torch.Tensor) -> torch.Tensor:
            with annotator.watching(), plan.autocast():
                output = functional_call(run.model, state, example.args, dict(example.kwargs))
                loss = step.loss(output)
            custom.extend(_custom_functions(loss))
            return loss

        for name, _ in run.model.named_parameters():
            state[name].requires_grad_(True)
        with target:
            graph = trace_graph(forward_and_loss, [*state.values(), *example.tensors()])
        if custom:
            raise UsageError(
                f"--train --fake --amp on {device.type}: {', '.join(sorted(set(custom)))} "
                "belongs to a custom autograd Function, whose own backward a replay under "
                f"{device.type}'s autocast cannot keep; without --amp it is kept"
            )
        return graph_on_device(graph, _CPU)

    def _replay(self, active: Audit) -> None:
        if self._graph is None:
            raise RuntimeError("a replayed step is traced by its warm-up run first")
        self.stage = Stage.BACKWARD  # one graph: a failure is placed by the node's phase
        grads = _Interpreter(self._graph, active.replaying).run(*self._inputs)
        for parameter, grad in zip(self._trainable.values(), grads, strict=False):
            parameter.grad = grad
        self.layouts = gradient_layouts(self._trainable)
        self.stage = Stage.STEP


class _ReplayRun(TensorRun):
    """One model and its example, audited through a traced and replayed step."""

    def __init__(
        self,
        model: nn.Module,
        example: Example,
        device: torch.device,
        strategy: Strategy,
    ) -> None:
        self.model, self.example, self._device, self.strategy = model, example, device, strategy
        self.device = str(device)
        self.kernels = KernelSourceMode.for_device(device)
        self.replay_mode: Any = None  # the traced step's fake mode, made by its trace

    def trainable(self) -> dict[str, torch.Tensor]:
        return {}

    @contextlib.contextmanager
    def tensor_mode(self) -> Iterator[None]:
        """Once a step is traced: the replay's fake mode, with the CUDA kernel-source overrides
        above it (below the audit, as for any fake run)."""
        if self.replay_mode is None:
            yield
            return
        with self.replay_mode, self.kernels:
            yield

    def converted(self) -> Forward:
        self.model.train(True)
        apply_strategy(self.model, self.strategy)
        example = self.example.map(lambda x: strategy_input(x, self.strategy))
        return lambda: (None, example)

    def nchw(self) -> Forward:
        return lambda: (torch.contiguous_format, self.example.map(input_to_nchw))

    def stepper(
        self, plan: StepPlan, forward: Forward, loss: Callable[[Any], torch.Tensor] | None
    ) -> _ReplayedStep:
        fmt, example = forward()  # type: ignore[misc]
        self.replay_mode = None  # a new step traces anew
        return _ReplayedStep(self, plan, fmt, example, loss)

    def overrides(self) -> tuple[str | None, tuple[AppliedOverride, ...]]:
        return divergence_table(self._device.type).name, self.kernels.applied_overrides()


class ReplayedTensors(FakeTensors):
    """Fake tensors for a training step, through a trace and its replay (module docstring);
    models are placed as for any fake run."""

    mode: ClassVar[TensorMode] = TensorMode.REPLAYED

    def bind(self, model: nn.Module, example: Example, plan: StepPlan) -> TensorRun:
        return _ReplayRun(model, example, plan.device, plan.settings.strategy)
