#!/usr/bin/env bash
# cl-audit in CI: sweep a registry in N shards, merge them, gate on a baseline, render HTML.
#
#   sweep.sh shard K N   audit shard K of N (fake mode, flagged models confirmed eagerly):
#                        $OUT/shard-K.json and $OUT/shard-K.xml (JUnit)
#   sweep.sh merge       merge $OUT/shard-*.json into $OUT/sweep.json, render $OUT/sweep.html,
#                        and, when $BASELINE names an earlier sweep JSON, exit 1 on new offences
#                        or failures
#
# Settings (environment): SELECTION (default: --timm all), OUT (default: cl-audit-out),
# BASELINE (default: none), CACHE (default: none; a folder the CI restores before a shard and
# saves after it: models whose files, settings and versions are unchanged are not re-audited),
# CL_AUDIT (default: cl-audit). The GitHub Actions workflow beside
# this script runs the shards as a matrix; other CI systems run the same two commands.
set -euo pipefail

SELECTION=${SELECTION:---timm all}
OUT=${OUT:-cl-audit-out}
BASELINE=${BASELINE:-}
CACHE=${CACHE:-}
CL_AUDIT=${CL_AUDIT:-cl-audit}
mkdir -p "$OUT"

case "${1:-}" in
shard)
    k=$2 n=$3
    cache=()
    if [ -n "$CACHE" ]; then
        cache=(--cache "$CACHE")
    fi
    # Exit 1 (offenders) and 3 (a model failed) still wrote the shard's reports: the gate is
    # the merge. Exit 2 (usage) and 130 (interrupted) fail the job.
    # shellcheck disable=SC2086  # SELECTION holds several words on purpose
    $CL_AUDIT $SELECTION --fake --confirm --shard "$k/$n" "${cache[@]}" \
        --json "$OUT/shard-$k.json" --junit "$OUT/shard-$k.xml" || code=$?
    code=${code:-0}
    if [ "$code" -ne 0 ] && [ "$code" -ne 1 ] && [ "$code" -ne 3 ]; then
        exit "$code"
    fi
    ;;
merge)
    gate=()
    if [ -n "$BASELINE" ]; then
        gate=(--baseline "$BASELINE")
    fi
    $CL_AUDIT merge "$OUT"/shard-*.json -o "$OUT/sweep.json" "${gate[@]}" || status=$?
    $CL_AUDIT render "$OUT/sweep.json" --html "$OUT/sweep.html"
    exit "${status:-0}"
    ;;
*)
    echo "usage: $0 shard K N | merge" >&2
    exit 2
    ;;
esac
