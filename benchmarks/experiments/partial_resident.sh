#!/usr/bin/env bash
# Session 10 (issue #8): weights partly resident on the tensor-core path (TileConfig.partial), in one device call:
# the GPU tests that cover the changed kernels, then blogA/large probes with and without partial residency and
# with other pipelines. Output: $OUT/tests.log, $OUT/probe-*.json, a short table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 CUPY_TF32=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/versions.txt"
timeout 300 python3 -m pytest tests/gpu/test_precision_gpu.py tests/gpu/test_schedules.py -n 14 -q -p no:cacheprovider \
  -x 2>&1 | tail -15 | tee "$OUT/tests.log"
probe() {  # label, args...
  local label=$1; shift
  timeout 120 python3 benchmarks/probe_schedules.py --schedule persistent --no-fused --repeats 15 --json "$OUT/probe-$label.json" "$@" \
    2>&1 | grep -A8 "^preset" | sed "s/^/[$label] /" | tee -a "$OUT/probe.log"
}
for prec in bfloat16 float16 tf32; do
  probe "$prec-partial" --preset lstm --preset gru --config blogA --precision $prec
  probe "$prec-whole" --preset lstm --preset gru --config blogA --precision $prec --no-partial
done
for pl in 64x4 64x3 128x2; do
  probe "bf16-$pl" --preset lstm --preset gru --config blogA --precision bfloat16 --pipeline $pl
done
probe "tf32-64x2" --preset lstm --preset gru --config blogA --precision tf32 --pipeline 64x2
