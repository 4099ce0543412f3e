"""Markdown tables for the registry pages of reports/pages/ from a sweep report (.json or .json.gz).

python scripts/summarise_sweep.py reports/timm_torch-2.14.1_cpu_fake+eager.json.gz --top 15
python scripts/summarise_sweep.py reports/timm_torch-2.14.1_cpu_train_fake+eager.json.gz --phases \
    --compare reports/timm_torch-2.14.1_cpu_fake+eager.json.gz
python scripts/summarise_sweep.py reports/timm_torch-2.14.1_cuda_train_predicted.json.gz --sites \
    --against reports/timm_torch-2.14.1_cpu_train_fake+eager.json.gz
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from cl_audit.report import Status, SweepReport


def phases(report: SweepReport, top: int) -> None:
    """Offending ops by phase: in how many models, and what the root causes were."""
    models: dict[tuple[str, str], set[str]] = {}
    causes: dict[tuple[str, str], Counter[str]] = {}
    for row in report.models:
        if not row.offending:
            continue
        for f in row.offenders:
            key = (f.phase.value, f.op_id)
            models.setdefault(key, set()).add(row.name)
            cause = f.root_cause.python_op or f.root_cause.aten_op if f.root_cause else None
            causes.setdefault(key, Counter())[cause or "(none)"] += 1
    by_phase = Counter(phase for phase, _ in models)
    print(f"offending (phase, op) pairs: {dict(by_phase)}\n")
    print("| phase | op | models | root causes (findings) | for example |")
    print("|---|---|---|---|---|")
    ranked = sorted(models.items(), key=lambda item: (-len(item[1]), item[0]))
    for (phase, op), names in ranked[:top]:
        top_causes = ", ".join(f"`{c}` {n}" for c, n in causes[(phase, op)].most_common(3))
        examples = ", ".join(f"`{n}`" for n in sorted(names)[:3])
        print(f"| {phase} | `{op}` | {len(names)} | {top_causes} | {examples} |")
    print()


def compare(inference: SweepReport, training: SweepReport) -> None:
    """What training adds over inference, model by model."""
    infer = {r.key: r for r in inference.models}
    both = [r for r in training.models if r.key in infer and r.status is Status.OK]
    ok = [r for r in both if infer[r.key].status is Status.OK]
    only_train = [r for r in ok if r.offending and not infer[r.key].offending]
    only_infer = [r for r in ok if infer[r.key].offending and not r.offending]
    both_off = [r for r in ok if r.offending and infer[r.key].offending]
    backward = [r for r in ok if any(f.phase.value != "forward" for f in r.offenders)]
    print(
        f"{len(ok)} models with a verdict in both sweeps: {len(both_off)} offend in both, "
        f"{len(only_train)} only in training, {len(only_infer)} only in inference; "
        f"{len(backward)} have an offender in the backward or optimizer step\n"
    )


def sites(report: SweepReport, top: int) -> None:
    """Verdicts, and the costliest cost sites by (phase, operation): channels_last-only bytes
    summed over the models, in how many models, and in how many offending ones."""
    ok = [r for r in report.models if r.status is Status.OK and r.cost is not None]
    verdicts = Counter(r.verdict.value for r in ok if r.verdict is not None)
    print(f"{len(ok)} models weighed: {dict(sorted(verdicts.items()))}\n")
    extra: Counter[tuple[str, str, str]] = Counter()
    models: dict[tuple[str, str, str], set[str]] = {}
    offending: dict[tuple[str, str, str], set[str]] = {}
    for row in ok:
        for site in row.cost.sites:
            if not site.extra:
                continue
            key = (site.phase.value, site.kind.value, site.op)
            extra[key] += site.extra
            models.setdefault(key, set()).add(row.name)
            if row.offending:
                offending.setdefault(key, set()).add(row.name)
    print("| phase | kind | op | extra, summed | models | offending models | for example |")
    print("|---|---|---|---|---|---|---|")
    for key, total in extra.most_common(top):
        names = sorted(offending.get(key, ()) or models[key])
        examples = ", ".join(f"`{n}`" for n in names[:3])
        print(
            f"| {key[0]} | {key[1]} | `{key[2]}` | {total / 2**20:,.1f} MiB | {len(models[key])} "
            f"| {len(offending.get(key, ()))} | {examples} |"
        )
    print()


def against(cuda: SweepReport, cpu: SweepReport, top: int) -> None:
    """The CUDA prediction against a CPU training sweep of the same models: verdicts, and the
    offending (phase, op) pairs that only the CPU report has (the CPU kernels' own)."""
    on_cpu = {r.key: r for r in cpu.models if r.status is Status.OK}
    both = [r for r in cuda.models if r.status is Status.OK and r.key in on_cpu]
    moved = Counter(
        (on_cpu[r.key].verdict.value if on_cpu[r.key].verdict else "-", r.verdict.value)
        for r in both
        if r.verdict is not None
    )
    print(f"{len(both)} models in both: (CPU verdict, CUDA verdict): {dict(moved.most_common())}\n")
    cpu_only: Counter[tuple[str, str]] = Counter()
    cuda_only: Counter[tuple[str, str]] = Counter()
    for row in both:
        ops_cpu = {(f.phase.value, f.op_id) for f in on_cpu[row.key].offenders}
        ops_cuda = {(f.phase.value, f.op_id) for f in row.offenders}
        cpu_only.update(ops_cpu - ops_cuda)
        cuda_only.update(ops_cuda - ops_cpu)
    for label, counts in (("CPU report only", cpu_only), ("CUDA prediction only", cuda_only)):
        print(f"| {label}: phase | op | models |\n|---|---|---|")
        for (phase, op), n in counts.most_common(top):
            print(f"| {phase} | `{op}` | {n} |")
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--phases", action="store_true", help="training: offenders by phase")
    parser.add_argument("--compare", type=Path, help="an inference sweep of the same models")
    parser.add_argument("--sites", action="store_true", help="verdicts and costliest sites")
    parser.add_argument("--against", type=Path, help="a CPU training sweep of the same models")
    args = parser.parse_args()
    report = SweepReport.from_bytes(args.report.read_bytes())
    if args.sites:
        sites(report, args.top)
    if args.against is not None:
        against(report, SweepReport.from_bytes(args.against.read_bytes()), args.top)
    if args.phases:
        phases(report, args.top)
    if args.compare is not None:
        compare(SweepReport.from_bytes(args.compare.read_bytes()), report)
    s = report.summary
    modes = Counter(r.mode.value for r in report.models)
    print(
        f"{s.models} models: {s.clean} clean, {s.offending} offending, {s.failed} failed, "
        f"{s.skipped} skipped; rows by mode: {dict(sorted(modes.items()))}\n"
    )
    print("| op | Python-level calls | models | events | converted | for example |")
    print("|---|---|---|---|---|---|")
    for cov in report.operators[: args.top]:
        mib = cov.bytes_converted / 2**20
        examples = ", ".join(f"`{e}`" for e in cov.examples[:2])
        python_ops = ", ".join(f"`{p}`" for p in cov.python_ops)
        print(
            f"| `{cov.op}` | {python_ops} | {cov.models} | {cov.events} | {mib:,.1f} MiB "
            f"| {examples} |"
        )
    failed = [r for r in report.models if r.status is not Status.OK]
    if failed:
        print("\n| model | status | stage | message |\n|---|---|---|---|")
        for row in failed:
            message = (row.message or "").replace("|", "/").replace("\n", " ")[:140]
            stage = row.stage.value if row.stage else ""
            print(f"| {row.name} | {row.status.value} | {stage} | {message} |")


if __name__ == "__main__":
    main()
