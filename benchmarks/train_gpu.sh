#!/usr/bin/env bash
# Issue #13's GPU work in one call (H100/H200, no network): the GPU tests, then the training step's probe and
# benchmark. Files for the caller go to $OUT: versions.txt, gpu_tests.log, probe.md, train-<date>-<device>.json and
# train.log. Run from anywhere; it works in the repository root.
#
#   1. pytest-xdist from .whl/ when the call carries it (benchmarks/NOTES.md: the suite is too long serially);
#   2. python3 -m pytest $TESTS -q -rs -n 12 (TESTS default tests/gpu, "none" skips them; TESTS_BUDGET s, 330);
#   3. probe_fused_training.py: forward and step ms of the default step, then with PROBE_FLAGS (default
#      "--no-fuse --no-split-sums"; "none" skips it), the PRESETS (default lstm gru gru_cho mgu) at lat, blogB, mid
#      (PROBE_BUDGET, 120 s);
#   4. python -m engine bench --train: cuDNN fp32 (TF32 off) against the fused step for the PRESETS at lat, blogB and
#      mid, median of REPS (31) repetitions (TRAIN_BUDGET, 300 s); WAVEFRONT=0 times the layer-by-layer step instead
#      of the default wavefront;
#      (PROBE=0, TRAIN=0 skip stages 3 and 4);
#   5. SWEEP=1: every preset, the fused step alone, median of 21, into $OUT/sweep (SWEEP_BUDGET, 420 s).
# A failing stage does not stop the next one; the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUPY_TF32=0
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks/results/train-gpu}
mkdir -p "$OUT"
start=$(date +%s)
section() { echo; echo "=== $* (at $(( $(date +%s) - start )) s)"; }

section versions
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || echo "nvidia-smi: not available"
  "$PY" -c "import cupy, torch; print('cupy', cupy.__version__, '| CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(),
      '| torch', torch.__version__, '| cuDNN', torch.backends.cudnn.version())"
} 2>&1 | tee "$OUT/versions.txt"

XDIST=""
if ls .whl/pytest_xdist-*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n 12"

tests_rc=skipped
if [ "${TESTS:-tests/gpu}" != none ]; then
  section "GPU tests (${XDIST:-serial})"
  timeout "${TESTS_BUDGET:-330}" "$PY" -m pytest ${TESTS:-tests/gpu} -q -rs $XDIST -p no:cacheprovider 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -15
  tests_rc=${PIPESTATUS[0]}
else
  echo "GPU tests skipped (TESTS=none)" > "$OUT/gpu_tests.log"
fi

PRESETS=${PRESETS:-lstm gru gru_cho mgu}
PRESET_FLAGS=$(for p in $PRESETS; do printf -- "--preset %s " "$p"; done)
PROBE_FLAGS=${PROBE_FLAGS:---no-fuse --no-split-sums}
section "probe: the default step, then with ${PROBE_FLAGS}"
[ "${PROBE:-1}" = 0 ] && echo "probe skipped (PROBE=0)" > "$OUT/probe.md" || {
  for flags in "" "$PROBE_FLAGS"; do
    [ "$flags" = none ] && continue
    echo "probe flags: ${flags:-none}"
    timeout "${PROBE_BUDGET:-120}" "$PY" benchmarks/probe_fused_training.py $flags --repeats 9 $PRESET_FLAGS \
      --config lat --config blogB --config mid
  done
} 2>&1 | tee "$OUT/probe.md"

section "bench --train"
train_rc=skipped
[ "${TRAIN:-1}" = 0 ] && echo "bench --train skipped (TRAIN=0)" > "$OUT/train.log" || {
WAVE=""
[ "${WAVEFRONT:-1}" = 0 ] && WAVE="import engine.autodiff.fused_tape as f; f.WAVEFRONT = False;"
timeout "${TRAIN_BUDGET:-300}" "$PY" -c "$WAVE
import sys; from engine.cli import main; sys.exit(main(sys.argv[1:]))" bench --train $PRESET_FLAGS \
  --config lat --config blogB --config mid --impl cudnn-fp32 --impl fused \
  --reps "${REPS:-31}" --out "$OUT" 2>&1 | tee "$OUT/train.log" | tail -20
train_rc=${PIPESTATUS[0]}
}

sweep_rc=skipped
if [ "${SWEEP:-0}" = 1 ]; then
  section "sweep: every preset, the fused step"
  mkdir -p "$OUT/sweep"
  ALL=$("$PY" -c "import engine; print(' '.join('--preset ' + p for p in sorted(engine.presets())))")
  timeout "${SWEEP_BUDGET:-420}" "$PY" -m engine bench --train $ALL --config lat --config blogB --config mid \
    --impl fused --reps 21 --out "$OUT/sweep" 2>&1 | tee "$OUT/sweep.log" | tail -25
  sweep_rc=${PIPESTATUS[0]}
fi

section summary
echo "GPU tests rc=$tests_rc: $(tail -1 "$OUT/gpu_tests.log")"
echo "bench --train rc=$train_rc (WAVEFRONT=${WAVEFRONT:-1}); sweep rc=$sweep_rc"
grep -E "^probe flags|^\| [a-z_]+ \| (lat|blogB|mid) " "$OUT/probe.md" || true
