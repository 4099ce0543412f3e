#!/usr/bin/env bash
# The GPU half of issue #69's proof, for a lent GPU (not yet run: no session has had one since
# the compiled timing was built), in one call of about 10 minutes, writing as it goes to $OUT:
#   the first 20 timm models of reports/speed/models_cuda.txt, fp16 training steps at batch 64,
#   model by model: the independent measurement (scripts/speed_truth.py --compile: both layouts
#   torch.compile'd apart, then alternating rounds) -> truth-0.jsonl, then
#   `cl-audit --timm MODEL --train --amp fp16 --device cuda --compile --time --json` ->
#   audits/MODEL.json; each command stops at STEP_S (default 120 s), the whole at BUDGET_S
#   (default 540 s: no model starts after it).
# Afterwards, here: python scripts/summarise_compiled.py $OUT (the same comparison as the CPU's).
#   bash scripts/compiled_lease.sh       # where `python3` has a CUDA build of torch
set -u
OUT=${OUT:-/tmp/compiled-lease}
mkdir -p "$OUT/audits"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
start=$(date +%s)
grep -v '^#' reports/speed/models_cuda.txt | sed 's/ *#.*//' | head -n 20 | while read -r name; do
    [ -n "$name" ] || continue
    [ $(( $(date +%s) - start )) -lt "${BUDGET_S:-540}" ] || { echo "budget spent at $name"; break; }
    timeout "${STEP_S:-120}" python3 scripts/speed_truth.py --device cuda --train --amp fp16 \
        --batch 64 --compile --rounds 7 --steps 3 --no-profile --models "$name" \
        --out "$OUT/truth-0.jsonl" >> "$OUT/truth.log" 2>&1 || continue
    timeout "${STEP_S:-120}" python3 -m cl_audit --timm "$name" --train --amp fp16 --device cuda \
        --batch-size 64 --compile --time --no-verify --json "$OUT/audits/$name.json" \
        > "$OUT/audits/$name.log" 2>&1
    echo "$name: exit $?" >> "$OUT/audit.log"
done
