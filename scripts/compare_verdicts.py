"""What a rule change moved: an earlier sweep report against a later one, as Markdown.

    python scripts/compare_verdicts.py OLD.json.gz NEW.json.gz --details reports/x.md

Prints the summary tables for reports/pages/timm-rule-v2.md: offending models before and after,
where each earlier offender finding went (still an offender, a parameter conversion,
format-neutral, or no longer a loss), the top format-neutral and parameter patterns with their
call sites, offenders found only now, and regains without a loss. ``--details`` writes the list
of models whose verdict changed, with the reason, to a file.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from cl_audit.report import Finding, ModelRow, Provenance, Status, SweepReport

Key = tuple[str, str, str | None, str | None]  # op, call site, module path, model key


def _key(row: ModelRow, finding: Finding) -> Key:
    return (finding.op_id, finding.call_site or "?", finding.module_path, row.key)


def _place(finding: Finding) -> str:
    return f"`{finding.op}` ({finding.op_id}) at `{finding.call_site}`"


def _lists(row: ModelRow) -> dict[str, tuple[Finding, ...]]:
    return {
        "offender": row.offenders,
        "parameter": row.parameter_conversions,
        "neutral": row.format_neutral,
    }


def _where_now(new: dict[str, ModelRow]) -> dict[Key, str]:
    placed: dict[Key, str] = {}
    for row in new.values():
        for kind, findings in _lists(row).items():
            for finding in findings:
                placed.setdefault(_key(row, finding), kind)
    return placed


def _patterns(rows: list[ModelRow], kind: str, top: int) -> list[str]:
    tallies: dict[tuple[str, str, str], list] = defaultdict(lambda: [set(), 0, 0])
    for row in rows:
        for finding in _lists(row)[kind]:
            tally = tallies[(finding.op, finding.call_site or "?", finding.module_class or "?")]
            tally[0].add(row.name)
            tally[1] += finding.count
            tally[2] += finding.bytes_converted
    lines = ["| op | call site | module class | models | events | bytes per forward |"]
    lines.append("|---|---|---|---|---|---|")
    ordered = sorted(tallies.items(), key=lambda kv: (-len(kv[1][0]), -kv[1][1]))
    for (op, site, cls), (models, events, size) in ordered[:top]:
        lines.append(
            f"| `{op}` | `{site}` | {cls} | {len(models)} | {events} | {size / 2**20:,.1f} MiB |"
        )
    return lines


def _top_site(row: ModelRow) -> str:
    """The costliest site of a row weighed by a cost, as Markdown."""
    if row.cost is None:
        return ""
    sites = [s for s in row.cost.sites if s.extra]
    if not sites:
        return ""
    site = max(sites, key=lambda s: s.extra)
    return f"`{site.op}` ({site.kind.value}) at `{site.call_site}`"


def _transitions(old: dict[str, ModelRow], new: dict[str, ModelRow], keys: list[str]) -> str:
    """Verdict before (its own, or offending-when-offenders for a version 1/2 row) against
    after, with the models' count and a few examples with the new costliest site."""
    moves: dict[tuple[str, str], list[str]] = defaultdict(list)
    for key in keys:
        before, after = old[key].verdict, new[key].verdict
        moves[(before.value if before else "?", after.value if after else "?")].append(key)
    lines = [
        "| before | after | models | for example (after: costliest site) |",
        "|---|---|---|---|",
    ]
    for (before, after), models in sorted(moves.items(), key=lambda m: -len(m[1])):
        examples = "; ".join(
            f"{k.split(':', 1)[1]} {_top_site(new[k])}".strip() for k in sorted(models)[:3]
        )
        lines.append(f"| {before} | {after} | {len(models)} | {examples} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--details", type=Path)
    args = parser.parse_args()
    old_report = SweepReport.from_bytes(args.old.read_bytes())
    new_report = SweepReport.from_bytes(args.new.read_bytes())
    old = {r.key: r for r in old_report.models}
    new = {r.key: r for r in new_report.models}
    ok_both = [k for k in new if k in old and old[k].status is Status.OK is new[k].status]
    print(
        f"Models with a verdict in both: {len(ok_both)}. Offending before: "
        f"{sum(old[k].offending for k in ok_both)}; after: {sum(new[k].offending for k in ok_both)}"
        f" ({new_report.summary.offending} of {new_report.summary.models} in the new report).\n"
    )
    print(_transitions(old, new, ok_both))

    placed = _where_now(new)
    moved: Counter[str] = Counter()
    moved_events: Counter[str] = Counter()
    gone: Counter[str] = Counter()
    for key in ok_both:
        for finding in old[key].offenders:
            kind = placed.get(_key(old[key], finding), "no longer a loss")
            moved[kind] += 1
            moved_events[kind] += finding.count
            if kind == "no longer a loss":
                gone[_place(finding)] += finding.count
    print("| earlier offender findings went to | findings | events |\n|---|---|---|")
    for kind in ("offender", "parameter", "neutral", "no longer a loss"):
        print(f"| {kind} | {moved[kind]} | {moved_events[kind]} |")
    print("\nNo longer a loss (the rule corrections), most events first:\n")
    print("| op and call site | events |\n|---|---|")
    for place, events in gone.most_common(args.top):
        print(f"| {place} | {events} |")

    print("\nTop format-neutral patterns:\n")
    print("\n".join(_patterns(list(new.values()), "neutral", args.top)))
    print("\nTop parameter patterns:\n")
    print("\n".join(_patterns(list(new.values()), "parameter", args.top)))

    earlier = {_key(old[k], f) for k in ok_both for f in old[k].offenders}
    found: dict[str, set[str]] = defaultdict(set)
    for key in ok_both:
        for finding in new[key].offenders:
            if _key(new[key], finding) not in earlier:
                found[_place(finding)].add(new[key].name)
    print("\nOffenders found only now (call sites unflagged before), most models first:\n")
    print("| op and call site | models |\n|---|---|")
    for place, models in sorted(found.items(), key=lambda kv: -len(kv[1]))[: args.top]:
        print(f"| {place} | {len(models)} |")

    sources: Counter[str] = Counter()
    for row in new.values():
        for regain in row.regains:
            source = regain.regain_source.value if regain.regain_source else "NONE"
            sources[f"{source}, {regain.provenance.value}"] += regain.count
    unexplained = [r.name for r in new.values() if any(f.regain_source is None for f in r.regains)]
    print("\nRegains by source and provenance:", dict(sources.most_common()))
    print(f"Models with a regain of no source: {len(unexplained)} {unexplained[:5]}")
    quiet: dict[str, set[str]] = defaultdict(set)
    for row in new.values():
        if row.status is Status.OK and not row.offenders and row.summary and row.summary.regains:
            for regain in row.regains:
                if regain.provenance is Provenance.BATCH:
                    cause = regain.root_cause
                    name = "(outside the audit)"
                    if cause is not None:
                        name = f"`{cause.python_op or cause.aten_op}` at `{cause.call_site}`"
                    quiet[f"{regain.regain_source.value}: {name}"].add(row.name)
    print("\nClean models with activation regains, by the source their regains name:\n")
    print("| source | models |\n|---|---|")
    for place, models in sorted(quiet.items(), key=lambda kv: -len(kv[1]))[: args.top]:
        print(f"| {place} | {len(models)} |")

    if args.details:
        lines = ["| model | before | after | why |", "|---|---|---|---|"]
        for key in sorted(ok_both):
            before, after = old[key].verdict, new[key].verdict
            if before == after:
                continue
            cost = new[key].cost
            if cost is not None:
                why = (
                    f"channels_last-only {cost.extra_bytes / 2**20:.2f} MiB, {cost.share:.2%} of "
                    f"the bytes written; costliest: {_top_site(new[key]) or 'none'}"
                )
            elif old[key].offending:
                kinds = Counter(
                    placed.get(_key(old[key], f), "no longer a loss") for f in old[key].offenders
                )
                why = "earlier findings now: " + ", ".join(f"{k} {n}" for k, n in kinds.items())
            else:
                why = "; ".join(sorted({_place(f) for f in new[key].offenders}))
            lines.append(f"| {new[key].name} | {before.value} | {after.value} | {why} |")
        args.details.write_text(
            f"# Verdicts changed from {args.old.name} to {args.new.name}\n\n"
            "Written by `scripts/compare_verdicts.py --details`.\n\n" + "\n".join(lines) + "\n"
        )
        print(f"\n{len(lines) - 2} verdicts changed; listed in {args.details}.")


if __name__ == "__main__":
    main()
