#!/usr/bin/env bash
# FlashRNN's LSTM and GRU beside cuDNN and the engine (issue #34 item 4), in one call on the GPU machine: installs the
# carried FlashRNN (benchmarks/flashrnn_setup.sh), builds its kernels for every size on every core
# (benchmarks/flashrnn_prebuild.py), then runs `python -m engine bench` once per argument (each argument: presets and
# configs, e.g. "--preset gru --config lat --config mid"), fp32 (TF32 off) and bf16 rows, and prints the tables last.
# With no argument: LSTM and GRU at B = 16, T = 1024 and every anchor. DEADLINE (s, default 570) bounds the call:
# each bench gets the time left. Files into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUPY_TF32=0 FLASHRNN_PATH=/tmp/fr PATH=/tmp/fr/bin:$PATH
OUT=${OUT:-benchmarks/results/flashrnn}
# FlashRNN's float32 multiplies on TF32 tensor cores (its fused kernel's wmma fragments are wmma::precision::tf32;
# measured 2.7e-4 from float64 at 512,512,1,1024,16, the engine's IEEE fp32 9.2e-7): its rows stand beside the
# engine's tf32 (the same math) and float32x3 (TF32 tensor cores at fp32's accuracy) as well as strict fp32.
IMPLS=${IMPLS:---impl cudnn-fp32 --impl auto --impl auto-tf32 --impl persistent-fp32x3 --impl flashrnn-fp32 --impl cudnn-bf16 --impl auto-bf16 --impl flashrnn-bf16}
mkdir -p "$OUT"
start=$(date +%s); left() { echo $(( ${DEADLINE:-570} - $(date +%s) + start )); }
[ $# -gt 0 ] || set -- "--preset lstm --preset gru --config 512,512,1,1024,16 --config lat --config blogB --config mid --config large --config blogA"
bash benchmarks/flashrnn_setup.sh /tmp/fr > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
# every (cell, config) the benches name, built once
cells=$(echo "$@" | grep -o -- "--preset [a-z_]*" | sort -u | sed 's/--preset/--cell/' | tr '\n' ' ')
configs=$(echo "$@" | grep -o -- "--config [^ ]*" | sort -u | tr '\n' ' ')
echo "=== building FlashRNN's kernels: $cells$configs"
timeout ${PREBUILD_BUDGET:-240} python3 benchmarks/flashrnn_prebuild.py $cells --dtype float32 --dtype bfloat16 \
  $configs --out "$OUT" 2>&1 | grep -E "^(lstm|gru|slstm) " | tee "$OUT/prebuild.log"
n=0
for args in "$@"; do
  n=$((n + 1)); budget=$(( $(left) - 45 ))
  [ "$budget" -gt 20 ] || { echo "=== bench $n: no time left"; continue; }
  echo "=== bench $n ($budget s): $args"
  timeout $((budget + 40)) python3 -m engine bench --quick --compile-budget 900 --time-budget "$budget" $IMPLS $args \
    --out "$OUT" --no-progress > "$OUT/bench$n.log" 2>&1
  echo "bench $n exit code: $?"
done
python3 - "$OUT" <<'PYEOF' 2>&1 | tee "$OUT/flashrnn_table.md"
import sys
from engine.bench import list_results, load_results, markdown_table
for entry in reversed(list_results(sys.argv[1])):
    print(markdown_table(load_results(entry["path"])))
PYEOF
