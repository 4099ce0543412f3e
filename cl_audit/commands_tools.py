"""What the commands beside the audit do once their options are settings: ``bench``, ``ops``
and ``ops diff``, ``render`` and ``table``."""

from __future__ import annotations

import fnmatch
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from cl_audit.commands import models_print_to_stderr, wrote
from cl_audit.enums import DType, OpBehaviour
from cl_audit.errors import UsageError
from cl_audit.execution.plan import plan_run
from cl_audit.files import check_writable, read_ops, read_report, read_sweep, write_json, write_text
from cl_audit.report import SweepReport
from cl_audit.sources import load_model
from cl_audit.sweep.selection import select

if TYPE_CHECKING:
    from cl_audit.features.bench import BenchSettings
    from cl_audit.features.table.measure import TableRequest
    from cl_audit.report.ops_report import OpsIndex

__all__ = ["OpsOutputs", "OpsSources", "bench", "ops", "ops_diff", "render", "table"]


def bench(
    model: str | None,
    timm_model: str | None,
    settings: BenchSettings,
    json_path: Path | None,
    dashboard_json: Path | None,
    console: Console,
) -> None:
    """Bench one model and write its outputs."""
    from cl_audit.features.bench import bench_module
    from cl_audit.render.bench_table import render_bench
    from cl_audit.report.bench_report import dashboard_records
    from cl_audit.sources.source_audit import prepare

    specs = [spec for spec in (model, timm_model) if spec]
    if len(specs) != 1:
        raise UsageError("bench one model: a torchvision name, module:factory, or --timm NAME")
    refs = select([model] if model else [], [timm_model] if timm_model else [], [], [])
    if len(refs) != 1:
        raise UsageError(f"bench one model: {specs[0]!r} selects {len(refs)}")
    for path, option in ((json_path, "--json"), (dashboard_json, "--dashboard-json")):
        check_writable(path, option)
    (ref,) = refs
    plan = plan_run(settings.audit)
    with models_print_to_stderr():
        loaded = load_model(ref)
        module, example = prepare(loaded, plan)
        report = bench_module(
            module,
            example,
            settings,
            name=loaded.name,
            source=ref.source.value,
            loss=loaded.loss,
            plan=plan,
        )
    render_bench(report, console)
    if json_path is not None:
        write_json(json_path, report, "--json")
        wrote((json_path,))
    if dashboard_json is not None:
        records = dashboard_records(report, ref.source.value)
        write_text(dashboard_json, json.dumps(records, indent=2) + "\n", "--dashboard-json")
        wrote((dashboard_json,))


@dataclass(frozen=True)
class OpsSources:
    """Where ``cl-audit ops`` reads from besides torch: a saved index to use instead of
    running one, and sweep reports whose losses it ranks."""

    index: Path | None = None
    sweeps: tuple[Path, ...] = ()


@dataclass(frozen=True)
class OpsOutputs:
    """Where ``cl-audit ops`` writes the index besides the terminal: JSON ('-': stdout), HTML."""

    json: Path | None = None
    html: Path | None = None


def ops(
    patterns: tuple[str, ...],
    loses: bool,
    device: str,
    dtype: DType,
    outputs: OpsOutputs,
    sources: OpsSources,
    console: Console,
) -> None:
    """The operator coverage index of the installed torch on ``device`` (predicted on fake
    tensors for a CUDA device this machine lacks), or the one saved at ``sources.index``,
    printed (the rows matching ``patterns``; with ``loses`` those that lose channels_last or
    refuse it) and written whole to ``outputs`` (the operators ``patterns`` chose); with
    ``sources.sweeps``, the operations their losses cost most, beside the index's rows."""
    from cl_audit.features.ops_index.probe import select
    from cl_audit.features.ops_index.ranking import rank_costs
    from cl_audit.render.ops_table import render_op_costs, render_ops, render_unjudged

    json_path = outputs.json
    if json_path is not None and str(json_path) != "-":
        check_writable(json_path, "--json")
    if outputs.html is not None:
        check_writable(outputs.html, "--html")
    sweeps = [read_sweep(path) for path in sources.sweeps]
    if sources.index is not None:
        if device != "cpu" or dtype is not DType.FLOAT32:
            raise UsageError("--index reads a saved index: --device and --dtype do not apply")
        index = read_ops(sources.index)
    else:
        index = _run_index(patterns, device, dtype, console)
    wanted = (OpBehaviour.LOSES, OpBehaviour.REFUSES) if loses else ()
    rows = select(index, patterns, wanted)
    unjudged = any(fnmatch.fnmatchcase(u.op, p) for u in index.unjudged for p in patterns)
    if not select(index, patterns) and not unjudged:
        raise UsageError(f"no operator of the index matches {', '.join(patterns)}")
    if sweeps:
        render_op_costs(index, rank_costs(index, sweeps), console)
    else:
        render_ops(index, rows, console)
        render_unjudged(index, patterns, console)
    if json_path is not None:
        write_json(json_path, index, "--json")
        wrote((json_path,))
    if outputs.html is not None:
        from cl_audit.render.html_ops import ops_html

        write_text(outputs.html, ops_html(index), "--html")
        wrote((outputs.html,))


def _run_index(patterns: tuple[str, ...], device: str, dtype: DType, console: Console) -> OpsIndex:
    from cl_audit.compat.opinfo import module_entries, operator_entries, opinfo_problem
    from cl_audit.features.ops_index.probe import build_index
    from cl_audit.features.ops_index.target import target_for

    problem = opinfo_problem()
    if problem is not None:
        raise UsageError(problem)
    target = target_for(device)
    entries = itertools.chain(
        operator_entries("cpu", dtype.torch_dtype), module_entries("cpu", dtype.torch_dtype)
    )
    if patterns:  # only the operators asked for are run
        entries = (e for e in entries if any(fnmatch.fnmatchcase(e.name, p) for p in patterns))
    with console.status("running every operator's samples"):
        return build_index(entries, target, dtype.torch_dtype)


def ops_diff(old: Path, new: Path, console: Console) -> None:
    """The operators whose behaviour differs between two saved indexes, printed."""
    from cl_audit.features.ops_index.diff import diff
    from cl_audit.render.ops_table import render_ops_diff

    before, after = read_ops(old), read_ops(new)
    render_ops_diff(before, after, diff(before, after), console)


def render(report_path: Path, html: Path, ops_index: Path | None = None) -> None:
    """A saved report (any version, model or sweep) as one self-contained HTML file; a model's
    linked to the rows of the operator index saved at ``ops_index``."""
    from cl_audit.render.outputs import write_outputs

    check_writable(html, "--html")
    report = read_report(report_path)
    index = None if ops_index is None else read_ops(ops_index)
    if index is not None and isinstance(report, SweepReport):
        raise UsageError(
            "--ops-index links one model's report; for a sweep: "
            "cl-audit ops --index FILE --from-sweep REPORT"
        )
    wrote(write_outputs(report, html=html, index=index))


def table(request: TableRequest, list_only: bool, console: Console) -> bool:
    """Measure this machine's speed table (or, ``list_only``, print the tables known here);
    whether Ctrl-C cut the measuring short (what was measured is kept either way)."""
    from cl_audit.features.table.measure import make_table
    from cl_audit.predict.table_store import store, user_folder
    from cl_audit.render.progress import TableProgress
    from cl_audit.render.table_view import tables_text

    if list_only:
        console.print(tables_text(store()), soft_wrap=True)
        console.print(f"this user's tables: {user_folder()} (CL_AUDIT_TABLES sets another)")
        return False
    with models_print_to_stderr(), TableProgress(console) as progress:
        result = make_table(request, progress, lambda path, text: write_text(path, text, "--out"))
    held = ", ".join(f"{d}: {c} convolutions, {o} probes" for d, (c, o) in result.counts.items())
    state = "complete" if result.complete else "cut short by the budget (--resume adds more)"
    if result.interrupted:
        state = "interrupted: what was measured is kept (--resume goes on)"
    console.print(f"table {result.name}: {held or 'nothing measured'}; {result.seconds:.0f} s "
                  f"measuring; {state}", highlight=False)  # fmt: skip
    if result.counts:
        wrote((result.path,))
    return result.interrupted
