#!/usr/bin/env bash
# The CPU proof of issue #66, on a quiet machine (nothing else running), in order, each step
# writing as it goes under reports/speed/check-cpu_torch-$RELEASE/:
#   1. this machine's table made by `cl-audit table` within its default budget (2 threads),
#   2. the held-out models measured in both layouts (scripts/speed_truth.py: batch 4 at 192 px,
#      neither the grid's batches 2 and 8 nor its sides), 2 threads, the noisy ones measured
#      again with 9 rounds (scripts/remeasure_noisy.py: the final file, both passes in it),
#   3. a one-thread table and the first 20 held-out models measured with one thread, likewise,
#   4. each measured set predicted with the tables (scripts/validate_speed.py).
#     bash scripts/speed_check_cpu.sh [STEP...]   (default: all four)
# OUT names the folder (another machine's check beside this one's); SHIPPED the table step 4
# holds against the machine's own (default: the CPU table shipped before cl-audit table).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
release=$($PY -c 'import torch; print(torch.__version__.split("+")[0])')
out=${OUT:-reports/speed/check-cpu_torch-$release}
mkdir -p "$out"
export CL_AUDIT_TABLES=$out/tables
models=reports/speed/models_cpu_held_out.txt
steps=${*:-1 2 3 4}
for step in $steps; do
  case $step in
  1) /usr/bin/time -f "%e s" -o "$out/table-2t.time" \
       $PY -m cl_audit table --device cpu --force 2>&1 | tee "$out/table-2t.log" ;;
  2) $PY scripts/speed_truth.py --device cpu --batch 4 --size 192 --rounds 5 --steps 2 \
       --models-file $models --out "$out/truth-2t.jsonl" 2>&1 | tail -n 60 > "$out/truth-2t.log"
     $PY scripts/remeasure_noisy.py "$out/truth-2t.jsonl" --out "$out/truth-2t-final.jsonl" -- \
       --device cpu --batch 4 --size 192 --rounds 9 --steps 2 ;;
  3) /usr/bin/time -f "%e s" -o "$out/table-1t.time" \
       $PY -m cl_audit table --device cpu --threads 1 --force 2>&1 | tee "$out/table-1t.log"
     grep -v '^#' $models | head -n 20 > "$out/models-1t.txt"
     $PY scripts/speed_truth.py --device cpu --batch 4 --size 192 --rounds 5 --steps 2 --threads 1 \
       --models-file "$out/models-1t.txt" --out "$out/truth-1t.jsonl" 2>&1 | tail -n 30 > "$out/truth-1t.log"
     $PY scripts/remeasure_noisy.py "$out/truth-1t.jsonl" --out "$out/truth-1t-final.jsonl" -- \
       --device cpu --batch 4 --size 192 --rounds 9 --steps 2 --threads 1 ;;
  4) t2=$(ls "$CL_AUDIT_TABLES"/cpu-*-2c2t_*.json); t1=$(ls "$CL_AUDIT_TABLES"/cpu-*-2c1t_*.json 2>/dev/null || true)
     shipped=${SHIPPED:-reports/speed/tables-v1/cpu-2core_torch-2.14.1_onednn-3.12.0_v2.json}
     $PY scripts/validate_speed.py "$out/truth-2t-final.jsonl" --device cpu --table "$t2" \
       --table "$shipped" ${t1:+--table "$t1"} --out "$out/validation-2t.json" 2> "$out/validation-2t.log"
     [ -n "$t1" ] || continue  # no one-thread check made
     OMP_NUM_THREADS=1 $PY scripts/validate_speed.py "$out/truth-1t-final.jsonl" --device cpu \
       --table "$t1" --table "$t2" --table "$shipped" --out "$out/validation-1t.json" \
       2> "$out/validation-1t.log" ;;
  esac
done
