#!/usr/bin/env bash
# What one short GPU lease measures for the speed verdict (#58), in one call of about 9 minutes
# on an H200 machine; every part writes as it goes and stops at its own time limit.
#   1. scripts/op_times.py --device cuda, float16: the probes (profiled) and the convolution
#      grid -> table-fp16.json (+ .jsonl);
#   2. scripts/speed_truth.py: fp16 training steps at batch 64 of reports/speed/models_cuda.txt,
#      both layouts alternated, one profiled step each -> speed-truth-cuda.jsonl;
#   3. scripts/op_times.py, bfloat16 and float32: probes and every fourth grid configuration
#      -> table-more.json (+ .jsonl).
# Afterwards, here: scripts/op_times.py --compact table-fp16.json table-more.json --out
# cl_audit/predict/tables/ makes the table cl-audit reads; validate_speed.py --calibrate its host.
#   bash scripts/speed_lease.sh       # where `python3` has a CUDA build of torch
# Optional: .whl/*.whl (timm 1.0.31, the release the reports use) installed first.
set -u
OUT=${OUT:-/tmp/speed-lease}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
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
timeout 175 python3 scripts/op_times.py --device cuda --dtypes float16 --probe-budget-s 20 \
    --budget-s 125 --out "$OUT/table-fp16.json" >>"$LOG" 2>&1
echo "== op_times fp16: $(($(date +%s) - start)) s" >>"$LOG"
timeout 320 python3 scripts/speed_truth.py --device cuda --train --amp fp16 --batch 64 \
    --rounds 5 --steps 2 --budget-s 285 --models-file reports/speed/models_cuda.txt \
    --out "$OUT/speed-truth-cuda.jsonl" >>"$LOG" 2>&1
echo "== speed_truth: $(($(date +%s) - start)) s" >>"$LOG"
left=$((520 - ($(date +%s) - start)))
if [ "$left" -gt 30 ]; then
    timeout "$left" python3 scripts/op_times.py --device cuda --dtypes bfloat16,float32 --every 4 \
        --probe-budget-s 10 --budget-s $((left - 25)) --out "$OUT/table-more.json" >>"$LOG" 2>&1
fi
echo "== all: $(($(date +%s) - start)) s" >>"$LOG"
tail -n 60 "$LOG"
for f in "$OUT"/*.jsonl; do gzip "$f"; done
ls -la "$OUT"
