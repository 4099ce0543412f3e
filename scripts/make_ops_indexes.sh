#!/usr/bin/env bash
# Re-make the committed operator indexes (reports/ops/) for the torch of the Python given:
#   bash scripts/make_ops_indexes.sh .venv/bin/python            # 2.14.1: four indexes
#   bash scripts/make_ops_indexes.sh /tmp/v215/bin/python        # another release: CPU, CUDA
# Each is written whole (cl-audit writes by rename), gzip-compressed; the times are in each
# index's "seconds".
set -euo pipefail
python="${1:?the Python of the torch to index}"
out="${2:-reports/ops}"
version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
run() { "$python" -m cl_audit ops "$@" > /dev/null; }
run --json "$out/cpu-float32_torch-$version.json.gz"
run --device cuda --json "$out/cuda-float32-predicted_torch-$version.json.gz"
if [ "$version" = "2.14.1" ]; then
  run --dtype bfloat16 --json "$out/cpu-bfloat16_torch-$version.json.gz"
  run --device cuda --dtype float16 --json "$out/cuda-float16-predicted_torch-$version.json.gz"
fi
echo "indexes of torch $version written to $out"
