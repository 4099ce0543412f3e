"""``--compile --time``: both layouts compiled and timed in the eager step's alternating rounds,
the compile kept out of the rounds, Dynamo's graphs and graph breaks counted, Inductor's layout
decision per graph and the compiled step by class, both verdicts in the headline, the speed gate
on the compiled verdict (a toy slower compiled in channels_last by construction, and its
control), a fake run's compiled verdict unknown, ``bench --compile`` and the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from compiled_toys import (
    PAUSE_S,
    SLOW_COMPILE_S,
    Broken,
    PausedWhenCompiled,
    fresh,
    without_graph_break,
)
from literal_reports import before_version_16
from test_cli import run_cli
from torch._dynamo.utils import counters

from cl_audit import audit_model
from cl_audit.compat.inductor import compile_problem
from cl_audit.enums import CompiledClass, SpeedVerdict
from cl_audit.execution.settings import CompileOptions
from cl_audit.render.html_model import model_html
from cl_audit.report import ModelReport, load_schema

TOYS = str(Path(__file__).with_name("compiled_toys.py"))
COMPILE_PROBLEM = compile_problem()
pytestmark = pytest.mark.skipif(
    COMPILE_PROBLEM is not None, reason=f"--compile is refused here: {COMPILE_PROBLEM}"
)
EAGER = CompileOptions(backend="eager")  # Dynamo's graphs run as traced: no code generated


def _audit(model: torch.nn.Module, options: CompileOptions = EAGER, **kwargs) -> ModelReport:
    torch.manual_seed(0)
    return audit_model(
        model.eval(), torch.randn(2, 3, 16, 16), time=True, compile=True, verify=False,
        compile_options=options, **kwargs,
    )  # fmt: skip


def test_the_compile_is_timed_apart_and_never_inside_a_round():
    report = _audit(fresh(Broken)(False), CompileOptions(backend="cl_audit_test_slow_compile"))
    compiled = report.speed.compiled
    for layout in (compiled.channels_last, compiled.nchw):
        assert layout.compile_seconds >= SLOW_COMPILE_S  # one graph, compiled once
        assert len(layout.rounds_ms) == 7
        assert max(layout.rounds_ms) < SLOW_COMPILE_S * 1e3 / 10  # a round holds no compile
        assert layout.lowered == ()  # not Inductor: no layout decision to report
    assert compiled.known


def test_graph_breaks_are_counted_per_layout_with_a_control():
    broken = _audit(fresh(Broken)(True)).speed.compiled
    whole = _audit(fresh(Broken)(False)).speed.compiled
    for layout in (broken.channels_last, broken.nchw):
        assert (layout.graphs, layout.graph_breaks, layout.graph_calls) == (2, 1, 0)
    for layout in (whole.channels_last, whole.nchw):
        assert (layout.graphs, layout.graph_breaks) == (1, 0)


def test_inductor_compiled_step_has_its_classes_and_layout_decisions():
    report = _audit(fresh(Broken)(True), CompileOptions())
    compiled = report.speed.compiled
    cl = compiled.channels_last
    assert (cl.graphs, cl.graph_breaks, cl.graph_calls) == (2, 1, 2)
    assert [g.phase for g in cl.lowered] == ["inference", "inference"]
    assert all(g.layout_optimization for g in cl.lowered)  # mkldnn on the CPU: always on
    by_class = {c.compiled_class: c for c in compiled.classes}
    assert set(by_class) == set(CompiledClass)
    assert by_class[CompiledClass.EXTERN].channels_last_ms > 0  # the convolutions
    assert by_class[CompiledClass.FUSED].channels_last_ms > 0  # the relu, Inductor's kernel
    total = sum(c.channels_last_ms for c in compiled.classes)
    assert total == pytest.approx(cl.profiled_ms, rel=1e-3, abs=1e-3)
    headline = report.speed.headline()
    assert headline.startswith("eager: ") and "; compiled: " in headline
    assert f"compiled: {compiled.speedup:.2f}x, {compiled.verdict.value}" in headline


def test_the_compiled_verdict_reads_the_compiled_rounds_with_a_control():
    slower = _audit(fresh(PausedWhenCompiled)(torch.channels_last)).speed
    faster = _audit(fresh(PausedWhenCompiled)(torch.contiguous_format)).speed
    assert slower.compiled.verdict is SpeedVerdict.SLOWER
    assert slower.compiled.channels_last.ms > PAUSE_S * 1e3 > slower.compiled.nchw.ms
    assert slower.gated is SpeedVerdict.SLOWER
    assert faster.compiled.verdict is SpeedVerdict.FASTER
    assert slower.channels_last.ms < PAUSE_S * 1e3  # the eager step never pauses


def test_speed_gate_reads_the_compiled_verdict_through_the_cli_with_a_control(tmp_path):
    args = ("--compile", "--time", "--gate", "speed", "--compile-backend", "eager", "--no-verify")
    slow = run_cli(f"{TOYS}:slower_compiled_channels_last", *args, "--json", str(tmp_path / "s"))
    control = run_cli(f"{TOYS}:slower_compiled_nchw", *args)
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "compiled step is slower" in " ".join(slow.stdout.split())
    assert control.returncode == 0, control.stdout + control.stderr
    data = json.loads((tmp_path / "s").read_text())
    jsonschema.validate(data, load_schema())
    assert data["speed"]["compiled"]["verdict"] == "slower"
    options = data["speed"]["compiled"]["options"]
    assert options == {"mode": None, "backend": "eager", "dynamic": None}


def test_speed_gate_with_compile_without_time_is_refused_up_front():
    result = run_cli(f"{TOYS}:slower_compiled_channels_last", "--compile", "--gate", "speed")
    assert result.returncode == 2
    assert "gates on the compiled step, which only --time measures" in result.stderr


def test_a_fake_run_says_the_compiled_speed_is_not_predicted():
    result = run_cli(f"{TOYS}:without_graph_break", "--compile", "--fake", "--json", "-")
    assert result.returncode == 0, result.stderr
    compiled = json.loads(result.stdout)["speed"]["compiled"]
    assert compiled["verdict"] == "unknown" and compiled["speedup"] is None
    assert "not predicted" in compiled["note"]


def test_an_eager_run_without_time_says_the_compiled_step_is_measured_only():
    model, shape = without_graph_break()
    report = audit_model(model.eval(), torch.randn(2, *shape), compile=True, verify=False)
    compiled = report.speed.compiled
    assert compiled.verdict is SpeedVerdict.UNKNOWN
    assert "measured only, with `time`" in compiled.note
    assert report.speed.headline().split("; compiled: ")[1].startswith("unknown (")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--compile", "--compile-backend", "no_such_backend"), "--compile-backend 'no_such_"),
        (("--compile", "--compile-mode", "fastest"), "--compile-mode 'fastest': torch"),
        (("--compile", "--compile-backend", "eager", "--compile-mode", "max-autotune"),
         "--compile-mode 'max-autotune' is Inductor's"),
        (("--compile-mode", "max-autotune",), "add --compile"),
    ],
)  # fmt: skip
def test_compile_options_torch_cannot_take_are_refused_in_one_line(args, said):
    result = run_cli(f"{TOYS}:without_graph_break", *args)
    assert result.returncode == 2
    assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bench_compile_times_compiled_layouts_apart_from_the_eager_ones(tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli(
        "bench", f"{TOYS}:with_graph_break", "--compile", "--compile-backend", "eager",
        "--rounds", "3", "--no-attribute", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema("bench"))
    compiled = {t["name"]: t for t in data["timings"] if t["compiled"]}
    assert set(compiled) == {"nchw+compiled", "channels-last+compiled"}
    assert all(t["compile_seconds"] > 0 for t in compiled.values())
    assert all(t["compile_seconds"] is None for t in data["timings"] if not t["compiled"])
    comparison = data["compiled_comparison"]
    assert (comparison["configuration"], comparison["baseline"]) == tuple(
        ("channels-last+compiled", "nchw+compiled")
    )
    assert data["comparison"]["configuration"] == "channels-last"
    assert "; compiled: " in data["verdict_text"]
    assert "compile (apart)" in result.stdout


def test_a_version_15_report_is_still_read_and_the_compiled_part_round_trips():
    report = _audit(fresh(Broken)(False))
    data = report.to_dict()
    jsonschema.validate(data, load_schema())
    assert ModelReport.from_dict(json.loads(json.dumps(data))).speed == report.speed
    old = before_version_16(data) | {"version": 15}
    jsonschema.validate(old, load_schema("report", 15))
    read = ModelReport.from_dict(old)
    assert read.speed.compiled is None and read.speed.speedup == report.speed.speedup


def test_a_compiled_sweep_needs_time_and_one_job_and_plots_eager_against_compiled(tmp_path):
    toys = [f"{TOYS}:slower_compiled_channels_last", f"{TOYS}:slower_compiled_nchw"]
    refused = run_cli(*toys, "--compile")
    assert refused.returncode == 2 and "give --time --jobs 1" in refused.stderr
    refused = run_cli(*toys, "--compile", "--time")
    assert refused.returncode == 2 and "give --jobs 1 (not 2)" in refused.stderr
    html, out = tmp_path / "sweep.html", tmp_path / "sweep.json"
    result = run_cli(
        *toys, "--compile", "--time", "--jobs", "1", "--compile-backend", "eager",
        "--html", str(html), "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema("sweep"))
    verdicts = {r["name"].split(":")[-1]: r["speed"]["compiled"]["verdict"] for r in data["models"]}
    assert verdicts == {"slower_compiled_channels_last": "slower", "slower_compiled_nchw": "faster"}
    assert "compiled speed: 1 faster, 1 slower" in " ".join(result.stdout.split()) or (
        "compiled speed: 1 slower, 1 faster" in " ".join(result.stdout.split())
    )
    page = html.read_text()
    assert page.count('<circle class="point"') >= 2
    scatter = page[page.index('id="compiled-scatter"') :]
    assert scatter.count('<circle class="point"') == 2
    assert page.count('<span class="compiled"') == 2  # under each eager speed


def test_a_compiled_training_step_lowers_a_forward_and_a_backward_graph():
    report = _audit(fresh(Broken)(False), CompileOptions(), train=True)
    compiled = report.speed.compiled
    for layout in (compiled.channels_last, compiled.nchw):
        assert [g.phase for g in layout.lowered] == ["forward", "backward"]
        assert layout.lowered[0].layout_optimization  # mkldnn on the CPU
        assert layout.graph_calls == 2  # the forward graph, then the backward graph
    page = model_html(report)
    table = page[page.index('id="compiled-speed"') :]
    assert ("layout optimisation" in table and "on in 1 of 2 (backward off)" in table) or (
        "on in 2 of 2" in table  # a torch whose heuristic counts the backward's convolutions
    )
    assert "compile, apart from the rounds" in table


def test_a_timed_compile_leaves_torch_and_the_users_compiled_model_as_they_were():
    from torch._dynamo import config as dynamo_config
    from torch._inductor import config
    from torch._inductor.graph import GraphLowering

    decide = GraphLowering.__dict__["decide_layout_opt"]
    settings = (config.fx_graph_cache, config.cpp.enable_kernel_profile)
    limit = dynamo_config.recompile_limit
    model, shape = without_graph_break()
    users = torch.compile(model.eval(), backend="eager")
    x = torch.randn(2, *shape)
    with torch.no_grad():
        users(x)
    _audit(fresh(Broken)(False), CompileOptions())
    frames = counters["frames"]["ok"]
    assert GraphLowering.__dict__["decide_layout_opt"] is decide
    assert (config.fx_graph_cache, config.cpp.enable_kernel_profile) == settings
    assert dynamo_config.recompile_limit == limit
    with torch.no_grad():
        users(x)
    assert counters["frames"]["ok"] == frames  # the user's graph ran again, not recompiled
    assert next(model.parameters()).is_contiguous()  # the user's model was not converted


def test_an_equal_model_compiled_again_in_one_process_says_its_graphs_were_reused():
    cls = fresh(Broken)
    first = _audit(cls(False)).speed.compiled
    again = _audit(cls(False)).speed.compiled  # the same code, equal guards: reused
    assert first.channels_last.graphs == 1 and first.note is None
    assert again.channels_last.graphs == 0 and again.nchw.graphs == 0
    assert again.note.startswith("Dynamo compiled no graph for channels_last and NCHW")
    assert again.known  # the rounds ran the compiled graphs all the same
