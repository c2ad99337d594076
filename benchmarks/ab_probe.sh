#!/usr/bin/env bash
# A/B on one machine: a probe of the working tree against a base commit's copy in ./ab_base (ignored by git; the
# device call carries it), alternating, ROUNDS rounds. Machines differ by up to 15% from call to call, so a change is
# judged against its base in one call. Files go to $OUT/ab.
#   PROBE=step (default): probe_fused_training.py, forward and step ms (REPEATS), each run's table;
#   PROBE=host: probe_host_phases.py, the step's wall time and the host phases matching PHASES (STEPS steps);
#   PROBE=phases: phase_profile.py, where a wavefront step of the persistent kernel spends its time (each preset at
#     each config), the step's line and its phases;
#   PROBE=variants: cells_today.py --only variants, the autotuned forward of lstm, ln_lstm and the LSTM with an exp
#     and a max at blogB and mid, its table (PRESETS and CONFIGS do not apply; the autotuner compiles its candidates
#     on a fresh machine: give it AB_BUDGET=200 or more).
#   mkdir ab_base && git archive <commit> | tar -x -C ab_base      # here, then on the device (carry ["ab_base"]):
#   PRESETS="lstm lstm_fgr" CONFIGS="blogB mid" ROUNDS=2 bash benchmarks/ab_probe.sh
#   PROBE=host PRESETS="lstm lstm_fgr" CONFIGS="lat blogB" ROUNDS=3 bash benchmarks/ab_probe.sh
#   PROBE=phases PRESETS="ln_lstm lstm" CONFIGS=blogB ROUNDS=2 bash benchmarks/ab_probe.sh
#   PROBE=variants AB_BUDGET=240 ROUNDS=2 bash benchmarks/ab_probe.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUPY_TF32=0
OUT=${OUT:-/tmp/ab}; mkdir -p "$OUT/ab"
FLAGS=""
for p in ${PRESETS:-lstm}; do FLAGS="$FLAGS --preset $p"; done
for c in ${CONFIGS:-blogB}; do FLAGS="$FLAGS --config $c"; done
if [ "${PROBE:-step}" = host ]; then
  run="benchmarks/probe_host_phases.py --steps ${STEPS:-30}"
  keep=${PHASES:-^## |Program.load|lay_out|bptt.record|FusedTape.backward}
elif [ "${PROBE:-step}" = phases ]; then
  run="benchmarks/phase_profile.py"
  keep="us a wavefront step|^  "
elif [ "${PROBE:-step}" = variants ]; then
  run="benchmarks/cells_today.py --only variants"
  FLAGS=""
  keep="^case |^blogB |^mid "
else
  run="benchmarks/probe_fused_training.py --repeats ${REPEATS:-9}"
  keep=.
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  for side in base new; do
    dir=.; [ $side = base ] && dir=ab_base
    echo "## $side, round $r"
    (cd $dir && timeout "${AB_BUDGET:-200}" python3 $run $FLAGS) 2>&1 | grep -E "$keep" | tee "$OUT/ab/$side-$r.md"
  done
done
