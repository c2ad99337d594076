#!/usr/bin/env bash
# The GPU check after a change to the training step, in one call: the GPU suite through benchmarks/train_gpu.sh (no probe, no bench), then
# compute-sanitizer memcheck and racecheck on persistent training steps of the two-stage presets
# (benchmarks/sanitize_training.py --persistent). Files into $OUT; the tests' and sanitizers' summaries printed.
set -u
export CUPY_TF32=0
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
OUT=$OUT TESTS=tests/gpu TESTS_BUDGET=330 PROBE=0 TRAIN=0 bash benchmarks/train_gpu.sh > $OUT/train_gpu.out 2>&1
tail -4 $OUT/gpu_tests.log
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 python benchmarks/sanitize_training.py --persistent lstm_proj gru_cho mgu > $OUT/sanitize-$tool.log 2>&1
  echo "$tool rc=$? $(grep -c 'step done' $OUT/sanitize-$tool.log) steps; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize-$tool.log | tail -1)"
done
