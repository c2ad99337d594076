#!/usr/bin/env bash
# A/B of the training step's host time (probe_host_phases.py) between the working tree and a base commit's copy in
# ./ab_base (as benchmarks/ab_probe.sh: `mkdir ab_base && git archive <commit> | tar -x -C ab_base`, carried to the
# device), alternating, ROUNDS rounds; the step's wall time and the phases named in PHASES, into $OUT/ab_host.md.
#   PRESETS="lstm lstm_fgr" CONFIGS="lat blogB" ROUNDS=2 bash benchmarks/ab_host.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUPY_TF32=0
OUT=${OUT:-/tmp/ab}; mkdir -p "$OUT"
FLAGS=""
for p in ${PRESETS:-lstm lstm_fgr}; do FLAGS="$FLAGS --preset $p"; done
for c in ${CONFIGS:-lat blogB}; do FLAGS="$FLAGS --config $c"; done
for r in $(seq 1 "${ROUNDS:-2}"); do
  for side in base new; do
    dir=.; [ $side = base ] && dir=ab_base
    echo "## $side, round $r"
    (cd $dir && timeout "${AB_BUDGET:-200}" python3 benchmarks/probe_host_phases.py --steps "${STEPS:-30}" $FLAGS) 2>&1 \
      | grep -E "${PHASES:-^## |Program.load|lay_out|bptt.record|FusedTape.backward}"
  done
done | tee "$OUT/ab_host.md"
