#!/usr/bin/env bash
# What one short GPU lease measures, in one call (about 8.5 minutes on a 16-core H200 machine).
# The first lease (2026-11-27, torch 2.11) measured fp16 gpu_truth, shards 1-2 of 6 and the
# inference bench; this second plan measures what that one did not reach:
#   1. beside each other: scripts/gpu_truth.py in bf16 (four processes, merged);
#      scripts/kernel_copies.py --device cuda (the copies CUDA kernels make inside strided
#      inputs); scripts/sdpa_backends.py (which fused attention kernel runs, and its strides);
#      a two-model eager CUDA sweep WITHOUT PYTORCH_NVML_BASED_CUDA_CHECK, the check of
#      cl_audit.compat.cuda_present (forked workers free to use CUDA), then an eager CUDA training
#      sweep of a timm shard (SHARD, default 3/6), fp16 autocast, the settings of
#      reports/timm_torch-*_cuda_train_predicted.json.gz without --fake, six workers (the
#      NVML variable is set for it only if the two-model check failed);
#   2. then alone on the GPU, scripts/bench_torchvision.py: inference at batch 32, fp16, of the
#      five models the first lease's time limit cut, and training steps (10 a round) of four.
# Compare the sweep's rows with the prediction: scripts/compare_cuda_truth.py.
# Every part writes as it goes and stops at its own time limit, so a cut-off run keeps what it
# measured. Results land in $OUT (default /tmp/gpu-lease); reports/pages/h200-leases.md says what was kept.
#   bash scripts/gpu_lease.sh            # where `python3` has a CUDA build of torch
# Optional: .whl/*.whl (the timm release the reports used, typer and what it needs) installed
# first.
set -u
OUT=${OUT:-/tmp/gpu-lease}
mkdir -p "$OUT" "$OUT/logs"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD YOLO_OFFLINE=1 HF_HUB_OFFLINE=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, torchvision, timm, sys; print(sys.version.split()[0], torch.__version__, torchvision.__version__, timm.__version__, torch.version.cuda, torch.backends.cudnn.version())'
    nproc
} >"$OUT/logs/environment.txt" 2>&1
cat "$OUT/logs/environment.txt"

start=$(date +%s)
for k in 1 2 3 4; do
    OMP_NUM_THREADS=2 timeout 240 python3 scripts/gpu_truth.py --amp bf16 --shard "$k/4" \
        --out "$OUT/logs/truth-$k.json" >"$OUT/logs/truth-$k.log" 2>&1 &
done
cp cl_audit/predict/kernel_copies.json "$OUT/kernel_copies.json"
timeout 150 python3 scripts/kernel_copies.py --device cuda --out "$OUT/kernel_copies.json" \
    >"$OUT/logs/kernel-copies.log" 2>&1 &
timeout 150 python3 scripts/sdpa_backends.py --device cuda --out "$OUT/sdpa-backends.json" \
    >"$OUT/logs/sdpa.log" 2>&1 &
timeout -s INT 90 python3 -m cl_audit --timm resnet18,mobilenetv3_small_050 --train \
    --device cuda --amp fp16 --jobs 2 --json "$OUT/logs/fork.json" >"$OUT/logs/fork.log" 2>&1
nvml=""
if ! python3 - "$OUT/logs/fork.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["models"]
errors = [r["name"] for r in rows if r.get("status") == "error"]
print("fork check:", len(rows), "rows, errors:", errors)
sys.exit(1 if errors or len(rows) != 2 else 0)
PY
then
    nvml=1
    echo "fork check failed: the sweep runs with PYTORCH_NVML_BASED_CUDA_CHECK=1"
fi
echo "fork check done: $(($(date +%s) - start)) s"
PYTORCH_NVML_BASED_CUDA_CHECK=$nvml OMP_NUM_THREADS=1 timeout -s INT 230 \
    python3 -m cl_audit --timm all --shard "${SHARD:-3/6}" --train --device cuda --amp fp16 \
    --jobs 6 --max-memory 16GB --timeout 120 \
    --checkpoint "$OUT/timm-cuda-train-eager.jsonl" >"$OUT/logs/timm.log" 2>&1 &
wait
echo "phase 1: $(($(date +%s) - start)) s"
python3 scripts/gpu_truth.py --out "$OUT/gpu-truth-cuda-bf16.json" \
    --merge "$OUT"/logs/truth-*.json >"$OUT/logs/merge.log" 2>&1
head -c 2000 "$OUT/logs/merge.log"
tail -n 3 "$OUT/logs/sdpa.log" "$OUT/logs/kernel-copies.log"

timeout 100 python3 scripts/bench_torchvision.py --device cuda --batch-size 32 --rounds 7 \
    --steps 3 --out "$OUT/bench-torchvision-cuda.json" wide_resnet101_2 convnext_tiny \
    efficientnet_b0 vit_b_16 maxvit_t >"$OUT/logs/bench.log" 2>&1
timeout 120 python3 scripts/bench_torchvision.py --device cuda --batch-size 32 --rounds 7 \
    --steps 10 --train --out "$OUT/bench-torchvision-cuda-train.json" resnet50 mobilenet_v2 \
    efficientnet_b0 convnext_tiny >"$OUT/logs/bench-train.log" 2>&1
echo "all: $(($(date +%s) - start)) s"
tail -n 25 "$OUT/logs/bench.log" "$OUT/logs/bench-train.log"
tail -n 3 "$OUT/logs/timm.log"
tail -n 8 "$OUT/logs/fork.log"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -r "$OUT/logs"
