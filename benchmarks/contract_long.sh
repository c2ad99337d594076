#!/usr/bin/env bash
# The long run of the contract tests (docs/reliability.md): 10,000 generated examples per entry family.
# The slowest tests are split over four processes with different hypothesis seeds (2,500 examples each); the rest
# run under pytest-xdist with CONTRACT_EXAMPLES=10000. Logs go to $OUT (default benchmarks/results/contract-long).
# The GPU is hidden (CUDA_VISIBLE_DEVICES=""): with one visible, the generated calls of engine.bench run real
# benchmarks, minutes each, past the contract's deadline; the GPU paths have their own suite (tests/gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/contract-long}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export CUDA_VISIBLE_DEVICES=""
SLOW=(tests/test_contract_dsl.py
      tests/test_contract_api.py::test_mutated_cell_dicts_load_or_are_refused_and_what_loads_round_trips
      tests/test_contract_api.py::test_numpy_integer_sizes_are_the_same_network_as_python_ints)
WORKERS=${WORKERS:-12}
for seed in 1 2 3 4; do
  CONTRACT_EXAMPLES=2500 timeout "${LIMIT_S:-560}" "$PY" -m pytest "${SLOW[@]}" -q -p no:cacheprovider -o addopts="" \
    --hypothesis-seed="$seed" --hypothesis-show-statistics > "$OUT/slow-seed$seed.log" 2>&1 &
done
CONTRACT_EXAMPLES=10000 timeout "${LIMIT_S:-560}" "$PY" -m pytest tests/test_contract_api.py tests/test_contract_cli.py \
  tests/test_contract_files.py -q -p no:cacheprovider -o addopts="" -n "$WORKERS" -ra \
  --deselect "${SLOW[1]}" --deselect "${SLOW[2]}" --hypothesis-show-statistics > "$OUT/families.log" 2>&1
echo "families rc=$?"
wait
for seed in 1 2 3 4; do echo "seed $seed: $(tail -1 "$OUT/slow-seed$seed.log")"; done
tail -1 "$OUT/families.log"
