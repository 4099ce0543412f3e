"""The wording of every report section, one place for the terminal and the HTML renderers: sizes,
the cost line, remedies and their trials, the gate, timing, the distributed runs' lines and the
sweep's operator examples."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from cl_audit.enums import (
    BucketMatch,
    Evidence,
    GateOn,
    RemedyStatus,
    TableMatch,
    TensorMode,
)
from cl_audit.report import (
    Cost,
    CostGroup,
    CostSite,
    MixedSite,
    ModelReport,
    Remedy,
    SweepReport,
    Timing,
    Trial,
)
from cl_audit.report.compiled_speed import CompiledLayout, CompiledSpeed
from cl_audit.report.distributed_report import DdpRun, FsdpRun
from cl_audit.report.speed_report import Speed


def format_bytes(n: int) -> str:
    if n < 0:
        return "-" + format_bytes(-n)
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


__all__ = [
    "compiled_rows",
    "cost_line",
    "ddp_run_line",
    "format_bytes",
    "fsdp_run_line",
    "gate_batch_text",
    "headline",
    "module_text",
    "operator_examples",
    "plural",
    "predicted_note",
    "remedy_head",
    "remedy_lines",
    "speed_lines",
    "table_warning",
    "timing_line",
    "trial_figures",
    "trial_text",
    "verify_text",
]


def cost_line(cost: Cost, train: bool) -> str:
    """The verdict's figures: "channels_last adds 48 MiB per forward (13%) at 9 sites; saves 0"."""
    unit = "training step" if train else "forward"
    sites = sum(1 for s in cost.sites if s.extra)
    savers = [s for s in cost.sites if s.saved]
    saving = len(savers)
    named = ""  # where: the site that saves most
    if savers:
        top = max(savers, key=lambda s: s.saved)
        named = f" ({'the most: ' if saving > 1 else ''}{top.op} at {top.call_site or '?'})"
    gate = cost.gate
    return (
        f"channels_last adds {format_bytes(cost.extra_bytes)} per {unit} ({cost.share:.2%} of "
        f"{format_bytes(cost.bytes_written)} written) at {plural(sites, 'site')}; "
        f"saves {format_bytes(cost.saved_bytes)}"
        + (f" at {plural(saving, 'site')}{named}" if saving else "")
        + f"; net {format_bytes(cost.net_bytes)}"
        + (" (the gate weighs what channels_last adds: a saving elsewhere removes no copy)"
           if cost.saved_bytes else "")
        + "\n"
        f"gate: {gate.share:.0%} and {format_bytes(gate.bytes)}{gate_batch_text(cost)}; copies "
        "inside kernels "
        + ("measured by the profiler" if cost.kernel_copies is Evidence.MEASURED
           else "predicted from strides and the kernels' copies measured for "
           + (cost.kernel_copy_table or "no release of this device"))
    )  # fmt: skip


def remedy_head(remedy: Remedy) -> str:
    """A remedy's advice in plain text and how far it is proven."""
    reference = f" (the remedy's source: {remedy.reference})"  # not a place in the model
    if remedy.status is RemedyStatus.VERIFIED:
        return f"remedy, verified on this model: {remedy.advice}{reference}"
    if remedy.status is RemedyStatus.REFUTED:
        return f"no tried fix holds for {remedy.pattern}{reference}"
    note = f", {remedy.note}" if remedy.note else ""
    return f"remedy (a lead{note}): {remedy.advice}{reference}"


def remedy_lines(remedy: Remedy, train: bool) -> list[str]:
    """``remedy_head``, then a line per change tried ("  held: ...", "  failed: ...")."""
    tried = (f"  {trial_text(trial, train)}" for trial in remedy.evidence)
    return [remedy_head(remedy), *tried]


def trial_text(trial: Trial, train: bool) -> str:
    """What one change did: "held: drop the .contiguous(): output max |diff| 0 (tolerance
    1e-05); here 2.3 MiB -> 0 B, elsewhere +0 B", or why it failed."""
    if trial.failure is not None:
        return f"failed: {trial.change}: {trial.failure}"
    figures = trial_figures(trial, train)
    return f"{'held' if trial.holds else 'failed'}: {trial.change}: {figures}"


def trial_figures(trial: Trial, train: bool) -> str:
    """A change's figures: what was held (a forward's output; a training step's loss and
    gradients, the one nearest its tolerance), its difference and the bytes at its sites and
    elsewhere."""
    moved = trial.moved_bytes or 0
    held = "loss and gradients" if train else "output"
    return (
        f"{held} max |diff| {trial.max_abs_diff or 0:.3g} (tolerance {trial.tolerance or 0:.3g});"
        f" here {format_bytes(trial.site_bytes_before)} -> "
        f"{format_bytes(trial.site_bytes_after or 0)}, elsewhere "
        f"{'+' if moved >= 0 else '-'}{format_bytes(abs(moved))}"
    )


def mixed_line(mixed: tuple[MixedSite, ...], top: int = 3) -> str:
    """The elementwise operations that read both orders, the most read ones named: "2
    elementwise operations read both orders (96.0 KiB read strided; no copy, not counted in the
    cost): aten.add at net.py:14 (64.0 KiB), aten.mul at net.py:15 (32.0 KiB)"."""
    reads = sum(m.bytes_read for m in mixed)
    named = sorted(mixed, key=lambda m: -m.bytes_read)[:top]
    sites = ", ".join(
        f"{m.op} at {m.call_site or module_text(m.module_path, None)}"
        f"{f' x{m.count}' if m.count > 1 else ''} ({format_bytes(m.bytes_read)})"
        for m in named
    )
    more = f", {len(mixed) - top} more (the HTML report lists them)" if len(mixed) > top else ""
    return (
        f"{plural(len(mixed), 'elementwise operation')} read both orders ({format_bytes(reads)} "
        f"read strided; no copy, not counted in the cost): {sites}{more}"
    )


def verify_text(cost: Cost) -> str | None:
    """ "remedies tried in what-if runs (4.9 s): 1 verified, 2 refuted", or None when none
    ran."""
    if cost.verify_seconds is None:
        return None
    counts = Counter(
        s.remedy.status for s in cost.sites if s.remedy is not None and s.remedy.evidence
    )
    found = ", ".join(f"{status.value} at {plural(n, 'site')}" for status, n in counts.items())
    return f"remedies tried in what-if runs ({cost.verify_seconds:.1f} s): {found or 'none'}"


def gate_batch_text(cost: Cost) -> str:
    """Where the gate judged: " at batch 32 (projected from batch 2: 4.9 MiB of 151 MiB,
    3.24%)", or at the audited batch."""
    at = cost.at_gate
    if not at.projected:
        return "" if at.batch is None else f" at the audited batch {at.batch}"
    return (
        f" at batch {at.batch} (projected from batch {cost.batch}: adds "
        f"{format_bytes(at.extra_bytes)} of {format_bytes(at.bytes_written)}, {at.share:.2%})"
    )


_PREDICTED = {
    TensorMode.FAKE: ", fake tensors (predicted)",
    TensorMode.FAKE_STEP: ", predicted for {device}: fake tensors, the backward run node by node",
    TensorMode.REPLAYED: ", predicted for {device} from a traced step (replayed on fake tensors)",
}


def predicted_note(report: ModelReport) -> str:
    """How a predicted report was made (empty for an eager one)."""
    env = report.environment
    return _PREDICTED.get(env.mode, "").format(device=env.device)


def timing_line(timing: Timing) -> str:
    """``--time``: the step and what the flagged operations take of it."""
    rounds = len(timing.rounds_ms)
    return (
        f"step {timing.step_ms:.1f} ms (median of {rounds} rounds, {timing.threads} threads); "
        f"losses {timing.losses_ms:.2f} ms = {timing.share:.1%} of it (offenders "
        f"{timing.offenders_ms:.2f}, parameter {timing.parameter_ms:.2f}); regaining operations, "
        f"whole, {timing.regains_ms:.2f} ms = {timing.regain_share:.1%} ({timing.clock} profiler)"
    )


def ddp_run_line(run: DdpRun) -> str:
    """One DDP configuration in a line: its parameters against the buckets, and DDP's word."""
    counts = (
        ", ".join(f"{run.count(m)} {m.value}" for m in BucketMatch if run.count(m))
        or "no 4-D or 5-D parameter"
    )
    said = f"; DDP warns: {run.warning[:60]}" if run.warning else "; no warning"
    return (
        f"converted {run.order.value} wrapping, gradient_as_bucket_view={run.bucket_view}: "
        f"{counts}; {format_bytes(run.copied)} copied in the step{said}"
    )


def fsdp_run_line(run: FsdpRun, top: int = 4) -> str:
    """One FSDP wrapping in a line: what FSDP2 refused, or what FSDP1 handed back."""
    if run.api == "fsdp2":
        head = "FSDP2 (fully_shard)"
        if run.error:
            return f"{head}: {run.error}"
        if not run.refused:
            return f"{head}: takes every parameter"
        names = ", ".join(run.refused[:top]) + (" ..." if len(run.refused) > top else "")
        return (
            f"{head}: refuses {len(run.refused)} of {len(run.parameters)} 4-D/5-D parameters "
            f"({names}): {run.message}; wraps once they are made contiguous"
        )
    head = f"FSDP1 (use_orig_params={run.use_orig_params})"
    if run.error:
        return f"{head}: {run.error}"
    lost = [p.name for p in run.parameters if p.kept is False]
    kept = sum(p.kept is True for p in run.parameters)
    text = f"{head}: {kept} of {len(run.parameters)} parameters come back channels_last"
    if lost:
        text += f"; {len(lost)} come back in another order ({', '.join(lost[:top])})"
    return text + " after unflattening"


def operator_examples(report: SweepReport, per_op: int = 5) -> dict[str, tuple[str, ...]]:
    """Places ("model:module.path") for each operator of the coverage: its offender examples,
    then its cost sites (a training sweep's kernel copies are cost sites with no offender)."""
    places = {cov.op: list(cov.examples) for cov in report.operators}
    for row in report.models:
        costliest: dict[str, CostSite] = {}  # one place per model: its costliest site at the op
        for site in row.cost.sites if row.cost is not None and row.offending else ():
            op = site.aten_op or site.op
            if site.extra > (costliest[op].extra if op in costliest else 0):
                costliest[op] = site
        for op, site in costliest.items():
            known = places.setdefault(op, [])
            if len(known) < per_op and not any(p.startswith(f"{row.name}:") for p in known):
                known.append(f"{row.name}:{site.module_path}")
    return {op: tuple(found) for op, found in places.items()}


def module_text(module_path: str | None, module_class: str | None) -> str:
    """A module as reports name it: its path and class."""
    if module_path is None:
        return module_class or "?"
    return f"{module_path or '(root)'} ({module_class})"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 site``, ``2 sites`` (``many``: the plural where it is not ``word`` + s)."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


def headline(report: ModelReport) -> str:
    """Both verdicts in a line: "offending: 4.10% of the bytes at 5 sites; channels_last 1.32x
    faster (measured); fixing the sites: about 1.36x"."""
    cost = report.cost
    if cost is None:
        text = report.verdict.value
    else:
        sites = sum(1 for s in cost.sites if s.extra)
        text = f"{report.verdict.value}: {cost.share:.2%} of the bytes at {plural(sites, 'site')}"
    speed = report.speed
    return text if speed is None else f"{text}; {speed.headline()}"


def headline_lines(report: ModelReport) -> list[str]:
    """The terminal's and the page's first lines: both verdicts, whose table when another
    machine's, and which verdict the exit code follows (none before a cost or a speed)."""
    if report.cost is None and report.speed is None:
        return []
    lines = [headline(report), table_warning(report.speed), exit_rule(report)]
    return [line for line in lines if line]


def remedies_given_above(
    groups: Sequence[CostGroup], sites: tuple[CostSite, ...]
) -> list[str | None]:
    """Per group (in the order shown), where its remedy was given in full at an earlier group
    (that group's call site), or None: given here, or no remedy; each remedy once."""
    given: dict[Remedy, str] = {}
    above = []
    for group in groups:
        first = sites[group.sites[0]]
        remedy = first.remedy
        above.append(None if remedy is None else given.get(remedy))
        if remedy is not None:
            given.setdefault(remedy, first.where)
    return above


def remedy_reference(where: str) -> str:
    """What stands for a remedy given in full above, at ``where``."""
    return f"the remedy given above, for {where}"


def exit_rule(report: ModelReport) -> str | None:
    """Which verdict the exit code follows (None: no cost weighed, the offenders decide)."""
    cost = report.cost
    if cost is None:
        return None
    if cost.gate.on is GateOn.SPEED:
        compiled = report.speed is not None and report.speed.compiled is not None
        step = "compiled step" if compiled else "step"
        return (
            f"exit 1 when channels_last's {step} is slower beyond {cost.gate.slowdown:.0%} "
            "(--gate speed); exit 2 when the speed is unknown"
        )
    return f"exit 1 when the byte verdict is offending (--gate bytes); now {report.verdict.value}"


def table_warning(speed: Speed | None) -> str | None:
    """What to do when a prediction used another machine's table (None: this machine's, or
    none used); the headline names the table already."""
    use = None if speed is None else speed.table
    if use is None or use.identity is None or use.match is TableMatch.THIS_MACHINE:
        return None
    device = use.identity.device
    if use.this_machine is None:
        return (
            f"the speed is {use.identity.model}'s, not a machine at hand: to predict for your "
            f"{device.upper()} machine, make its table there (cl-audit table --device {device} "
            "--out FILE) and pass --table FILE"
        )
    return (
        f"the speed is predicted for another machine ({use.identity.short()}): make this "
        f"machine's table with cl-audit table --device {device}"
    )


def speed_lines(speed: Speed) -> list[str]:
    """What stands under a speed section's table: how it was had, and what is missing."""
    lines = []
    if speed.known and speed.conversion_share is not None:
        lines.append(f"conversions: {speed.conversion_share:.1%} of the channels_last step")
    if speed.settings:
        lines.append("; ".join(f"{k} {v}" for k, v in speed.settings))
    if speed.stand_ins:
        names = ", ".join(speed.stand_ins[:6]) + (" and more" if len(speed.stand_ins) > 6 else "")
        lines.append(f"not in the table, priced as an elementwise addition: {names}")
    if speed.note:
        lines.append(speed.note)
    lines.append(
        f"band: within {speed.band:.0%} of even is no difference (--fail-slowdown); "
        "--gate speed makes exit 1 mean a slower step"
    )
    return lines


def compiled_rows(compiled: CompiledSpeed) -> list[tuple[str, str, str]]:
    """The compiled part's rows as printed (label, channels_last, NCHW): one profiled step's
    milliseconds by class, the profiled step they add up to, the rounds' step with the
    verdict's speedup, the compile's seconds, the graphs and breaks, the layout decisions."""
    cl, nchw = compiled.channels_last, compiled.nchw
    if cl is None or nchw is None:
        return []
    rows = [(c.compiled_class.value, f"{c.channels_last_ms:.2f} ms", f"{c.nchw_ms:.2f} ms")
            for c in compiled.classes]  # fmt: skip
    ratio = "" if compiled.speedup is None else f", {compiled.speedup:.2f}x"
    return [
        *rows,
        ("profiled step", f"{cl.profiled_ms:.2f} ms", f"{nchw.profiled_ms:.2f} ms"),
        (f"step (rounds' median{ratio})", f"{cl.ms:.2f} ms", f"{nchw.ms:.2f} ms"),
        ("compile, apart from the rounds", f"{cl.compile_seconds:.1f} s",
         f"{nchw.compile_seconds:.1f} s"),
        ("graphs, graph breaks", f"{cl.graphs}, {cl.graph_breaks}",
         f"{nchw.graphs}, {nchw.graph_breaks}"),
        ("Inductor's layout optimisation", _lowered(cl), _lowered(nchw)),
    ]  # fmt: skip


def _lowered(layout: CompiledLayout) -> str:
    """``on in 2 of 3 graphs (backward off)``."""
    graphs = layout.lowered
    if not graphs:
        return "no graph lowered by Inductor"
    on = sum(g.layout_optimization for g in graphs)
    off = sorted({g.phase for g in graphs if not g.layout_optimization})
    return f"on in {on} of {len(graphs)}" + (f" ({', '.join(off)} off)" if off else "")
