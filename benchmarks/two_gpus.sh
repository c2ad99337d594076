#!/usr/bin/env bash
# Issue #35 items 5 and 6 on a machine with two GPUs, in one call: CellRNN under DDP (benchmarks/ddp_train.py: 2 GPUs
# against one, and the loss curve against one GPU given the doubled batch), the two-GPU pipeline tests, then the
# same study on one GPU and on both (benchmarks/study_gpus.py). WHEELS: a folder of wheels to install first (ray where
# the machine has none); SEEDS and STEPS size the study. Files into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUPY_TF32=0
OUT=${OUT:-benchmarks/results/two-gpus}
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
nvidia-smi -L
echo "=== CellRNN under DDP (mid, lstm, fp32, TF32 off)"
timeout 200 torchrun --standalone --nproc_per_node=2 benchmarks/ddp_train.py --out "$OUT/ddp-2.json" 2>&1 | grep -v "^W1\|OMP_NUM" | tail -3
timeout 120 python3 benchmarks/ddp_train.py --out "$OUT/ddp-one.json" | tail -1
timeout 120 python3 benchmarks/ddp_train.py --world 2 --out "$OUT/ddp-one-2b.json" | tail -1
python3 benchmarks/ddp_train.py --compare "$OUT/ddp-one-2b.json" "$OUT/ddp-2.json"
python3 benchmarks/ddp_train.py --compare "$OUT/ddp-one.json" "$OUT/ddp-2.json"
echo "=== the two-GPU tests"
timeout 150 python3 -m pytest tests/gpu/test_pipeline_gpu.py -q -rs -p no:cacheprovider 2>&1 | tail -3
echo "=== a study on one GPU, then on both"
timeout ${STUDY_BUDGET:-330} python3 benchmarks/study_gpus.py --out "$OUT/study" --seeds "${SEEDS:-16}" --steps "${STEPS:-300}" 2>&1 | tail -15
