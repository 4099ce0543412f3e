#!/usr/bin/env bash
# What one short GPU lease measures, in one call (about 9.5 minutes on a 16-core H200 machine):
#   1. scripts/gpu_truth.py, eager against fake on CUDA (four processes, merged);
#      beside it, an eager CUDA training sweep of a timm shard (SHARD, default 3/6: shard 1/6
#      is regnety_2560 alone, the cost-balanced split), fp16 autocast, the settings of
#      reports/timm_torch-*_cuda_train_predicted.json.gz without --fake (six workers: fourteen
#      ran 15 large models out of the H200's memory);
#   2. then alone on the GPU, scripts/bench_torchvision.py: inference at batch 32, fp16, and
#      training steps of four models.
# Compare the sweep's rows with the prediction: scripts/compare_cuda_truth.py.
# Every part writes as it goes and stops at its own time limit, so a cut-off run keeps what it
# measured. Results land in $OUT (default /tmp/gpu-lease); reports/README.md says what was kept.
#   bash scripts/gpu_lease.sh            # where `python3` has a CUDA build of torch
# Optional: .whl/*.whl (the timm release the reports used, typer and what it needs) installed
# first. A two-model sweep says whether forked workers can use CUDA (cl_audit.compat.cuda_present,
# untried on a GPU when written); the big sweep runs with PYTORCH_NVML_BASED_CUDA_CHECK=1, which
# let them on 2026-11-27 whatever the parent asked.
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
} >"$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

start=$(date +%s)
timeout -s INT 90 python3 -m cl_audit --timm resnet18,mobilenetv3_small_050 --train \
    --device cuda --amp fp16 --jobs 2 --json "$OUT/logs/fork.json" >"$OUT/logs/fork.log" 2>&1 &
for k in 1 2 3 4; do
    OMP_NUM_THREADS=2 timeout 240 python3 scripts/gpu_truth.py --shard "$k/4" \
        --out "$OUT/logs/truth-$k.json" >"$OUT/logs/truth-$k.log" 2>&1 &
done
PYTORCH_NVML_BASED_CUDA_CHECK=1 OMP_NUM_THREADS=1 timeout -s INT 250 \
    python3 -m cl_audit --timm all --shard "${SHARD:-3/6}" --train --device cuda --amp fp16 \
    --jobs 6 --max-memory 16GB --timeout 120 \
    --checkpoint "$OUT/timm-cuda-train-eager.jsonl" >"$OUT/logs/timm.log" 2>&1 &
wait
echo "phase 1: $(($(date +%s) - start)) s"
python3 scripts/gpu_truth.py --out "$OUT/gpu-truth-cuda.json" --merge "$OUT"/logs/truth-*.json \
    >"$OUT/logs/merge.log" 2>&1
head -c 3000 "$OUT/logs/merge.log"

timeout 180 python3 scripts/bench_torchvision.py --device cuda --batch-size 32 --rounds 7 \
    --steps 3 --out "$OUT/bench-torchvision-cuda.json" >"$OUT/logs/bench.log" 2>&1
timeout 100 python3 scripts/bench_torchvision.py --device cuda --batch-size 32 --rounds 7 \
    --steps 3 --train --out "$OUT/bench-torchvision-cuda-train.json" resnet50 mobilenet_v2 \
    efficientnet_b0 convnext_tiny >"$OUT/logs/bench-train.log" 2>&1
echo "all: $(($(date +%s) - start)) s"
tail -n 45 "$OUT/logs/bench.log" "$OUT/logs/bench-train.log"
tail -n 3 "$OUT/logs/timm.log"
tail -n 12 "$OUT/logs/fork.log"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -r "$OUT/logs"
