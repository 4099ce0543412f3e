#!/usr/bin/env bash
# The CPU proof of issue #69 (does channels_last pay under torch.compile?), model by model, in
# the order of reports/compiled/models_cpu.txt (drawn: scripts/draw_models.py, seed 69; MODELS
# names another file), each writing as it goes under OUT (default
# reports/compiled/check-cpu_torch-$RELEASE/):
#   1. the independent measurement (scripts/speed_truth.py --compile: no cl-audit import):
#      batch 4 at 160 px, fp32 inference, both layouts torch.compile'd, compile apart, then
#      7 alternating rounds of 3 steps, one thread;
#   2. cl-audit's verdicts for the same model: `cl-audit MODEL --compile --time --json`, same
#      batch and side, one thread (OMP_NUM_THREADS=1), remedies not tried (--no-verify).
# Then scripts/summarise_compiled.py compares them (summary.json, and the page's table).
#     bash scripts/compiled_check_cpu.sh [LANE LANES]   (default: 0 1, every model)
# LANE of LANES takes every LANES-th model from the LANE-th (0-based), pinned to core LANE
# (taskset), one thread, Inductor compiling in one process: two lanes, one per core, run the
# models in about half the time. The lanes are quiet (scripts/quiet_lanes.py, QUIET=1, the
# default): the timed parts of either command (warm-up, rounds, profiled steps) run with the
# other lane stopped, so only the compiles overlap; cl-audit runs through quiet_lanes.py's
# wrapper of its CLI (its code unchanged). QUIET=0: the lanes run unhindered (the first run of
# the proof, check-cpu_torch-2.14.1, ran so: the other lane's compiles widened the rounds).
# A model whose independent run fails is an error row there and is not audited; a model that
# times out (TIMEOUT seconds, default 1800, per command: pauses count) likewise.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
release=$($PY -c 'import torch; print(torch.__version__.split("+")[0])')
out=${OUT:-reports/compiled/check-cpu_torch-$release}
mkdir -p "$out/audits" "$out/lanes"
lane=${1:-0}
lanes=${2:-1}
taskset -cp "$((lane % $(nproc)))" $$ > /dev/null
if [ "${QUIET:-1}" = 1 ]; then
  export CL_AUDIT_QUIET_LANES=$out/lanes CL_AUDIT_LANE=$lane
  echo $$ > "$out/lanes/lane-$lane.pid"
  trap 'rm -f "$out/lanes/lane-$lane.pid"' EXIT  # a stale id could name another process
  audit=(scripts/quiet_lanes.py cl-audit)
else
  audit=(-m cl_audit)
fi
# each lane's Inductor cache its own: two processes building one kernel into one cache can read
# a half-written .so ("file too short"; seen with one shared cache)
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor-lane-$lane \
  TORCHINDUCTOR_COMPILE_THREADS=1
# the independent run compiles Inductor's CPU kernels with their profiler ranges too, as cl-audit
# does (a flag test each when no profiler runs): the same generated sources, so that cl-audit's
# compile finds the C++ kernels built (its compile seconds then exclude most of the g++ time)
export TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1
grep -v '^#' "${MODELS:-reports/compiled/models_cpu.txt}" | sed 's/ *#.*//' | awk -v l="$lane" -v n="$lanes" 'NR % n == l' |
while read -r name; do
  [ -n "$name" ] || continue
  file="$out/audits/${name#tv:}.json"
  [ -s "$file" ] && continue
  timeout "${TIMEOUT:-1800}" $PY scripts/speed_truth.py --device cpu --compile --batch 4 --size 160 \
    --rounds 7 --steps 3 --threads 1 --no-profile --models "$name" --out "$out/truth-$lane.jsonl" \
    >> "$out/truth-$lane.log" 2>&1
  [ "${QUIET:-1}" = 1 ] && $PY scripts/quiet_lanes.py resume  # should a killed one have left it stopped
  if ! grep -q "\"name\": \"$name\", \"status\": \"ok\"" "$out/truth-$lane.jsonl" 2>/dev/null; then
    echo "$name: no independent measurement, not audited" >> "$out/audit-$lane.log"
    continue
  fi
  if [[ $name == tv:* ]]; then spec=(${name#tv:}); else spec=(--timm "$name"); fi
  start=$(date +%s)
  timeout "${TIMEOUT:-1800}" $PY "${audit[@]}" "${spec[@]}" --compile --time --no-verify \
    --input-size 3x160x160 --batch-size 4 --json "$file.part" > "$out/audits/${name#tv:}.log" 2>&1
  rc=$?
  [ "${QUIET:-1}" = 1 ] && $PY scripts/quiet_lanes.py resume
  [ -s "$file.part" ] && mv "$file.part" "$file"
  echo "$name: exit $rc in $(( $(date +%s) - start )) s" >> "$out/audit-$lane.log"
done
