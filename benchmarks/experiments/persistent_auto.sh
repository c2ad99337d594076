#!/usr/bin/env bash
# The persistent step's "auto" choice (engine/autodiff/persistent.py worthwhile) against the fused step, engine only:
# python -m engine bench --train for PRESETS at lat, blogB and mid, first with PERSISTENT off, then "auto", one call.
# Tables go to stdout, the JSON files to $OUT/off and $OUT/auto.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 CUPY_TF32=0
OUT=${OUT:-/tmp/persistent-auto}
FLAGS=""
for p in ${PRESETS:-lstm gru gru_cho mgu lstm_fgr lstm_proj peephole_lstm}; do FLAGS="$FLAGS --preset $p"; done
for mode in off auto; do
  mkdir -p "$OUT/$mode"
  echo "## PERSISTENT $mode"
  value=False; [ $mode = auto ] && value='"auto"'
  timeout "${BUDGET:-240}" python3 -c "import engine.autodiff.persistent as p; p.PERSISTENT = $value
import sys; from engine.cli import main; sys.exit(main(sys.argv[1:]))" bench --train $FLAGS --config lat \
    --config blogB --config mid --impl fused --reps "${REPS:-21}" --out "$OUT/$mode" 2>&1 | grep "^| "
done
