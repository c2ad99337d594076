#!/usr/bin/env bash
# A change to the fused stages in one call: the fused-stage GPU tests, each
# launch's GPU time at `lat` for the working tree and for ./ab_base (--launches), then the step, alternating
# (benchmarks/ab_probe.sh). Make ab_base first: mkdir ab_base && git archive <commit> | tar -x -C ab_base.
export CUPY_TF32=0
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
python -m pytest tests/gpu/test_stage_fusion_gpu.py tests/gpu/test_fused_training_gpu.py tests/gpu/test_persistent_training_gpu.py -q -n 12 -p no:cacheprovider > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log
for side in base new; do dir=.; [ $side = base ] && dir=ab_base; echo "## launches $side"
  (cd $dir && python benchmarks/probe_fused_training.py --launches lstm,gru_cho,lstm_proj,lstm_fgr,mgu lat 2>&1 | grep "^| " | grep -v "^| cell")
done
OUT=$OUT PRESETS="lstm gru_cho lstm_proj lstm_fgr" CONFIGS="lat" ROUNDS=3 REPEATS=15 bash benchmarks/ab_probe.sh 2>&1 | grep -E "^## |^\| (lstm|gru)"
echo "tests: $(tail -1 $OUT/tests.log)"
