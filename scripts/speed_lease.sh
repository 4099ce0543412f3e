#!/usr/bin/env bash
# What one short GPU lease measures for this machine's speed (issue #66), in one call of about
# 10 minutes; every part writes as it goes and stops at its own time limit.
#   1. cl-audit table --device cuda (float16 and float32, TABLE_MINUTES, default 5): this GPU's
#      table, into $OUT/tables (the host's cost per operation, the probes, the grid at batch 64
#      and 128);
#   2. scripts/speed_truth.py: fp16 training steps at batch 64 of reports/speed/models_cuda.txt,
#      both layouts alternated, one profiled step each -> speed-truth-cuda-train.jsonl
#      (TRAIN_S, default 200 s; the models already in the file are skipped: a second call with
#      the same OUT goes on down the list);
#   3. the same models' fp16 inference at batch 128 -> speed-truth-cuda-infer.jsonl (INFER_S,
#      default 130 s).
# Afterwards, here: scripts/validate_speed.py on each truth file with --table $OUT/tables/...
# and --table cuda-nvidia-h200_torch-2.11.0_cudnn-9.19 (the shipped one).
#   bash scripts/speed_lease.sh       # where `python3` has a CUDA build of torch
# Optional: .whl/*.whl (timm 1.0.31, the release the reports use) installed first.
set -u
OUT=${OUT:-/tmp/speed-lease}
mkdir -p "$OUT/tables"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD CL_AUDIT_TABLES=$OUT/tables
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
LOG=$OUT/lease.log
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    python3 -c 'import torch, timm, sys; print(sys.version.split()[0], torch.__version__, timm.__version__, torch.version.cuda, torch.backends.cudnn.version())'
    nproc
} >>"$LOG" 2>&1
start=$(date +%s)
minutes=${TABLE_MINUTES:-5}
timeout $((minutes * 60 + 90)) python3 -m cl_audit table --device cuda --budget "$minutes" \
    --force >>"$LOG" 2>&1
echo "== table: $(($(date +%s) - start)) s" >>"$LOG"
for workload in train infer; do
    if [ "$workload" = train ]; then
        args=(--train --batch 64) budget=${TRAIN_S:-200}
    else
        args=(--batch 128) budget=${INFER_S:-130}
    fi
    timeout $((budget + 40)) python3 scripts/speed_truth.py --device cuda --amp fp16 "${args[@]}" \
        --rounds 5 --steps 2 --budget-s "$budget" --models-file reports/speed/models_cuda.txt \
        --out "$OUT/speed-truth-cuda-$workload.jsonl" >>"$LOG" 2>&1
    echo "== speed_truth $workload: $(($(date +%s) - start)) s" >>"$LOG"
done
tail -n 60 "$LOG"
for f in "$OUT"/*.jsonl "$OUT"/tables/*.jsonl; do gzip -f "$f"; done
ls -la "$OUT" "$OUT/tables"
