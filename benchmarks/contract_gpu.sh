#!/usr/bin/env bash
# The contract's argument family with a GPU visible (docs/reliability.md): the same generated bad values as the long
# run, where a valid call may now reach the GPU backends (backend left to "auto") and engine.bench runs real
# benchmarks. The argument table runs at CONTRACT_EXAMPLES=10000 (400 examples per entry); engine.bench, whose
# valid calls each measure the device for seconds, runs as four processes of different hypothesis seeds,
# BENCH_EXAMPLES generated calls each. The CLI family hides the GPU in-process by design (tests/test_contract_cli.py).
# Logs go to $OUT (default benchmarks/results/contract-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/contract-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ENTRY=tests/test_contract_api.py::test_every_entry_answers_a_bad_argument_with_its_own_error
ENTRIES=$("$PY" -c "import sys; sys.path.insert(0, 'tests'); import test_contract_api as t; print(len(t.ENTRIES))")
for seed in 1 2 3 4; do
  CONTRACT_EXAMPLES=$(( ${BENCH_EXAMPLES:-25} * ENTRIES )) timeout "${LIMIT_S:-500}" "$PY" -m pytest "$ENTRY[bench]" -q \
    -p no:cacheprovider -o addopts="" --hypothesis-seed="$seed" --hypothesis-show-statistics \
    > "$OUT/bench-seed$seed.log" 2>&1 &
done
CONTRACT_EXAMPLES=10000 timeout "${LIMIT_S:-500}" "$PY" -m pytest "$ENTRY" -q -p no:cacheprovider -o addopts="" \
  -n "${WORKERS:-12}" -ra --deselect "$ENTRY[bench]" --hypothesis-show-statistics > "$OUT/entries.log" 2>&1
echo "entries rc=$?"
wait
for seed in 1 2 3 4; do echo "bench seed $seed: $(tail -1 "$OUT/bench-seed$seed.log")"; done
tail -1 "$OUT/entries.log"
