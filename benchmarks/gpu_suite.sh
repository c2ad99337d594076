#!/usr/bin/env bash
# The GPU suite, in one script for the GPU machine (H100/H200, CUDA 13, CuPy 14, torch with cuDNN,
# no network). Run from anywhere; it works in the repository root. Files for the caller go to $OUT
# (at most 5): versions.txt, gpu_tests.log, bench.log, bench-<date>-<device>.json, bench_table.md.
#
#   1. versions of the driver, nvcc, CuPy, torch and cuDNN;
#   2. python3 -m pytest tests/gpu -q -rs -n 12      (pytest-xdist where installed: the tests are bound by NVRTC
#      compiles on the CPU; ~1,900 tests in ~500 s with 14 workers on a 16-core H200 host; TESTS_BUDGET=570 s;
#      TESTS_PART=1/2 and 2/2 split the files over two calls);
#   3. compute-sanitizer memcheck and racecheck on the persistent kernel, small configurations;
#   4. the benchmark: every anchor config x lstm, gru, peephole_lstm, gru_cho, lstm_cifg, lstm_nfg, mgu,
#      indrnn; cuDNN fp32, the engine's fused backend and schedules, the PyTorch eager cell; quick mode,
#      results JSON to benchmarks/results/ and $OUT (stops starting measurements at BENCH_BUDGET s; the
#      JSON is rewritten after every cell, so a cut-short run still leaves its results);
#   5. the reduced precisions: the persistent schedule in tf32, fp16 and bf16 against cuDNN in the same
#      mode, for lstm, gru (cuDNN has them) and gru_cho (it does not), every anchor config;
#   6. nets (only when named in STAGES): the DeepSpeech net (4 layers, max-pool over time, 4 more) of LSTM and GRU
#      against cuDNN through the harness (`python -m engine bench --config deepspeech`, engine/bench/nets.py);
#   7. wheels (only when named): benchmarks/check_wheels.sh, the engine through the CUDA wheels with the system
#      toolkit hidden (issue #9's one install);
#   8. layersync (only when named): the persistent schedule with TileConfig(sync="layer") against grid sync and
#      cuDNN (probe_schedules.py --sync layer) and its phase profile at blogB;
#   9. phases (only when named): phase_profile.py of the LayerNorm LSTM beside the LSTM at mid and blogB (issue #33's
#      open 1.5x target; NOTES 2026-11-27 13:45 reads the kernel), so the next change starts from where the time goes;
#  10. lengths (only when named): benchmarks/lengths_bench.py, what lengths= costs at blogB;
#  11. probes (only when named): benchmarks/probe_wgmma.py (a step's GEMM on wgmma against mma.sync),
#      probe_fp32x3_projection.py, and phase_profile.py of one LSTM layer at B = 16, T = 1024 in fp32, tf32 and bf16
#      (issue #34 items 1-3);
#  11a. cluster (only when named): cluster mode on both paths (wgmma with the weights in registers, mma.sync):
#      its GPU tests and those of lengths= in it, compute-sanitizer memcheck and racecheck on its cases of
#      sanitize_persistent.py, and phase profiles of the LSTM (I = H = 512) and sLSTM (H = 768) at B = 16 on each path;
#  11b. train (only when named): `python -m engine bench --train` at mid and blogB, every mode's rows (fp32 with
#      TF32 off, tf32, bf16, fp16) against cuDNN in the same mode, each with its gradient error against float64;
#  11c. x3 (only when named): float32x3 on the fused backend (engine/schedules/split_products.py): its GPU tests and
#      those of the reduced modes' k_slices,
#      compute-sanitizer memcheck and racecheck on a small case in K chunks with a rest, the step's product alone in
#      every variant (probe_fused_x3.py --products: batched chunks, cublasLt's split-K, one GEMM),
#      and a step's bf16 and tf32 product with K in slices as one strided batch (probe_step_batched_k.py: the batched
#      GEMM alone and with a sum; NOTES 2026-11-28 04:01), whether dropped replayed programs give their memory back
#      (probe_replay_memory.py), and the engine's own streaming product with K over several blocks
#      (probe_stream_gemm.py), and float32x3's fp16-parts product on the engine's own wgmma kernel with each K chunk's
#      accumulator promoted in registers against cublasLt's batch of chunks, with the two-warpgroup variant (--pair),
#      and the reduced modes' products on the same design against cublasLt (probe_x3_promote.py --modes);
#  11c'. mode16 (only when named): bf16 / fp16 at blogA: a whole LSTM or GRU layer in one launch (the LSTM's math on
#      the accumulators, the GRU's from staged sums; fed by one producer thread, two (duo) or three (trio)), its
#      projection made before it, beside it and first on its stream (probe_mode_persist.py --first --plain), the
#      duo and trio entries' floors in bf16,
#      Nsight Compute's every section on the bf16 LSTM duo launch (in mode16.log), the probe's kernels under
#      compute-sanitizer memcheck and racecheck (--sanitize). Earlier runs: benchmarks/results/mode-persist-*-H200/
#      (the wide product's and mode_stream.cu's tests stay in the GPU suite);
#  11c''. feedwarp (only when named, a call of its own: ~9 minutes): the persistent schedule's bulk pipeline with its
#      feed warp (TileConfig.feed_warp, NOTES 2026-11-28 15:05) and the step GEMMs on wgmma (TileConfig.stream_wgmma):
#      their GPU tests (the bulk cases, bit-identical runs), compute-sanitizer on the bf16 runs of
#      sanitize_persistent.py, and probe_schedules.py's persistent schedule in bf16 at mid, large and blogA (LSTM,
#      GRU) with thread 0 feeding (the default), with the feed warp (--feed-warp) and on wgmma with two feed warps
#      (--stream-wgmma, also at 32 units a block), cuDNN bf16 in the same calls (feedwarp.log);
#  11d. x3rows (only when named, a call of its own): the harness's rows over the anchors and each at T = 1000
#      (configs/x3_error.json), fused float32x3 with the default chunk ("auto") in fp16 parts (the default) and TF32
#      parts against cuDNN fp32,
#      each row's error over cuDNN's (issue #34's bound), whether it ran from replays, the free memory per row;
#  11e. targets (only when named): benchmarks/issue34_targets.py, issue #34's targets met or not on this GPU, the parts
#      in TARGET_PARTS (default "bf16"; also fp16, tf32, x3, flashrnn, train: one or two a call of 10 minutes);
#  12. the markdown tables, last.
# STAGES="tests sanitize bench precision" (default: all but the optional ones) picks stages, so the suite can be split
# over two calls of under 10 minutes each on an H100. A failing stage does not stop the next one.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
export CUPY_TF32=0          # CuPy's float32 matmuls stay IEEE fp32 (the naive backend and the sgemm floor)
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks/results/suite}
mkdir -p "$OUT" benchmarks/results
start=$(date +%s)
section() { echo; echo "=== $* (at $(( $(date +%s) - start )) s)"; }

section versions
{
  nvidia-smi || echo "nvidia-smi: not available"
  nvcc --version || echo "nvcc: not available"
  "$PY" -c "import sys, numpy; print('python', sys.version.split()[0], '| numpy', numpy.__version__)"
  "$PY" -c "
import cupy
rt = cupy.cuda.runtime
print('cupy', cupy.__version__, '| CUDA runtime', rt.runtimeGetVersion(), '| driver API', rt.driverGetVersion(),
      '| device', rt.getDeviceProperties(0)['name'].decode())"
  "$PY" -c "
import torch
print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| cuDNN', torch.backends.cudnn.version(),
      '| GPU', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"
  "$PY" -c "import triton; print('triton', triton.__version__)" || echo "triton: not installed"
} 2>&1 | tee "$OUT/versions.txt"

STAGES=${STAGES:-tests sanitize bench precision}
BENCH_BUDGET=${BENCH_BUDGET:-400}
tests_rc=skipped; sanitize_rc=skipped; bench_rc=skipped; precision_rc=skipped

if [[ " $STAGES " == *" tests "* ]]; then
  section "GPU tests"
  # TESTS_ARGS picks a part of tests/gpu (e.g. TESTS_ARGS="tests/gpu -k 'not fuzz'"); TESTS_PART=i/n runs every n-th
  # test file from the i-th (sorted), so the suite (about 1,900 tests, ~500 s with 14 workers on an H200 host) can
  # be split over calls of under 10 minutes.
  if [ -n "${TESTS_PART:-}" ]; then
    TESTS_ARGS=$(ls tests/gpu/test_*.py | awk -v i="${TESTS_PART%/*}" -v n="${TESTS_PART#*/}" '(NR - i) % n == 0' | tr '\n' ' ')
  fi
  workers=""; "$PY" -c "import xdist" 2>/dev/null && workers="-n ${TESTS_WORKERS:-12}"
  # One BLAS thread a worker: a dozen workers each starting a BLAS thread a core thrash the host's cores, and the
  # tests whose float64 references multiply matrices of a few hundred rows stalled past any budget that way.
  eval OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout ${TESTS_BUDGET:-570} "$PY" -m pytest ${TESTS_ARGS:-tests/gpu} $workers -q -rfEs --durations=25 -p no:cacheprovider 2>&1 \
    | tee "$OUT/gpu_tests.log"
  tests_rc=${PIPESTATUS[0]}
fi

if [[ " $STAGES " == *" sanitize "* ]]; then
  section "compute-sanitizer on the persistent kernel"
  sanitize_rc=0
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 3 "$PY" benchmarks/sanitize_persistent.py 2>&1 \
      | tee "$OUT/sanitize_$tool.log" | tail -4
    rc=${PIPESTATUS[0]}; echo "compute-sanitizer $tool exit code: $rc"; [ "$rc" = 0 ] || sanitize_rc=$rc
  done
fi

if [[ " $STAGES " == *" bench "* ]]; then
  section benchmark
  timeout $((BENCH_BUDGET + 30)) "$PY" -m engine bench --quick --warmup 2 --compile-budget 60 --time-budget "$BENCH_BUDGET" \
    --impl cudnn-fp32 --impl fused --impl graph --impl persistent --impl torch-eager \
    --preset lstm --preset gru --preset peephole_lstm --preset gru_cho --preset lstm_cifg --preset lstm_nfg \
    --preset mgu --preset indrnn \
    --config lat --config blogB --config mid --config large --config blogA \
    --out benchmarks/results --copy-to "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v "^\s*$" | tail -5
  bench_rc=${PIPESTATUS[0]}
fi

if [[ " $STAGES " == *" precision "* ]]; then
  section "benchmark: reduced precisions against cuDNN in the same mode"
  timeout $((BENCH_BUDGET + 30)) "$PY" -m engine bench --quick --warmup 2 --time-budget "$BENCH_BUDGET" \
    --impl cudnn-tf32 --impl persistent-tf32 --impl cudnn-fp16 --impl persistent-fp16 \
    --impl cudnn-bf16 --impl persistent-bf16 \
    --preset lstm --preset gru --preset gru_cho \
    --config lat --config blogB --config mid --config large --config blogA \
    --out benchmarks/results --copy-to "$OUT" 2>&1 | tee "$OUT/bench_precision.log" | grep -v "^\s*$" | tail -5
  precision_rc=${PIPESTATUS[0]}
fi

wheels_rc=skipped
if [[ " $STAGES " == *" wheels "* ]]; then
  section "the engine through the CUDA wheels alone"
  timeout 300 bash benchmarks/check_wheels.sh 2>&1 | tee "$OUT/wheels.log" | tail -8
  wheels_rc=${PIPESTATUS[0]}
fi

layersync_rc=skipped
if [[ " $STAGES " == *" layersync "* ]]; then
  section "per-layer arrival counters against grid sync"
  {
    for sync in grid layer; do
      timeout 150 "$PY" benchmarks/probe_schedules.py --preset lstm --preset gru --preset gru_cho \
        --config lat --config blogB --config mid --schedule persistent --no-fused --sync $sync 2>&1 \
        | grep -A12 "^preset" | sed "s/^/[sync=$sync] /"
    done
    timeout 90 "$PY" benchmarks/phase_profile.py --preset lstm --config blogB --sync layer 2>&1 | grep -v "^\s*$"
  } | tee "$OUT/layersync.log"
  layersync_rc=${PIPESTATUS[0]}
fi

nets_rc=skipped
if [[ " $STAGES " == *" nets "* ]]; then
  section "the DeepSpeech net against cuDNN"
  timeout 300 "$PY" -m engine bench --quick --config deepspeech --preset lstm --preset gru \
    --impl cudnn-fp32 --impl fused --impl graph --impl persistent --impl persistent-fused-pools \
    --out benchmarks/results --copy-to "$OUT" 2>&1 | tee "$OUT/bench_nets.log" | grep -v "^\s*$" | tail -8
  nets_rc=${PIPESTATUS[0]}
fi

phases_rc=skipped
if [[ " $STAGES " == *" phases "* ]]; then
  section "phase profiles of the LayerNorm LSTM and the LSTM (issue #33)"
  phases_rc=0; : > "$OUT/phases.log"
  for case in "ln_lstm mid" "lstm mid" "ln_lstm blogB" "lstm blogB"; do
    set -- $case
    timeout 90 "$PY" benchmarks/phase_profile.py --preset "$1" --config "$2" --json "$OUT/phase-$1-$2.json" 2>&1 \
      | grep -v "^\s*$" | sed "s/^/[$1 $2] /" | tee -a "$OUT/phases.log"
    rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || phases_rc=$rc
  done
fi

lengths_rc=skipped
if [[ " $STAGES " == *" lengths "* ]]; then
  section "what lengths= costs (blogB, LSTM, lengths in [T/2, T])"
  timeout 150 "$PY" benchmarks/lengths_bench.py --out "$OUT/lengths.json" 2>&1 | tee "$OUT/lengths.log" | tail -8
  lengths_rc=${PIPESTATUS[0]}
fi

probes_rc=skipped
if [[ " $STAGES " == *" probes "* ]]; then
  section "probes: wgmma against mma.sync, float32x3's projection, the small-batch step's phases"
  probes_rc=0; : > "$OUT/probes.log"
  probe() { "$@" 2>&1 | grep -v "^\s*$" | tee -a "$OUT/probes.log"; rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || probes_rc=$rc; }
  probe timeout 120 "$PY" benchmarks/probe_wgmma.py --json "$OUT/probe_wgmma.json"
  probe timeout 60 "$PY" benchmarks/probe_fp32x3_projection.py --json "$OUT/probe_fp32x3_projection.json"
  for precision in float32 tf32 bfloat16; do
    echo "[$precision]" | tee -a "$OUT/probes.log"
    probe timeout 90 "$PY" benchmarks/phase_profile.py --preset lstm --config 512,512,1,1024,16 --precision $precision \
      --json "$OUT/phase-lstm-b16-$precision.json"
  done
fi

cluster_rc=skipped
if [[ " $STAGES " == *" cluster "* ]]; then
  section "cluster mode: tests, compute-sanitizer, phase profiles of both paths"
  cluster_rc=0; : > "$OUT/cluster.log"
  step() { "$@" 2>&1 | grep -v "^\s*$" | tee -a "$OUT/cluster.log" | tail -12; rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || cluster_rc=$rc; }
  step env OPENBLAS_NUM_THREADS=1 timeout 200 "$PY" -m pytest tests/gpu/test_cluster_gpu.py tests/gpu/test_lengths_gpu.py \
    -k "cluster" ${TESTS_WORKERS:+-n $TESTS_WORKERS} -q -rfEs -p no:cacheprovider
  for tool in memcheck racecheck; do
    step timeout 200 compute-sanitizer --tool $tool --error-exitcode 3 "$PY" benchmarks/sanitize_persistent.py cluster
  done
  for case in "lstm 512,512,1,1024,16" "slstm 768,768,1,1024,16"; do
    set -- $case
    for path in "" "--no-wgmma"; do
      step timeout 60 "$PY" benchmarks/phase_profile.py --preset "$1" --config "$2" --precision bfloat16 --sync cluster $path
    done
  done
fi

train_rc=skipped
if [[ " $STAGES " == *" train "* ]]; then
  section "the training step in every mode against cuDNN in the same mode (mid and blogB)"
  timeout $((BENCH_BUDGET + 30)) "$PY" -m engine bench --train --time-budget "$BENCH_BUDGET" -p lstm -p gru -c mid -c blogB \
    --out benchmarks/results --copy-to "$OUT" 2>&1 | tee "$OUT/bench_train.log" | grep -v "^\s*$" | tail -24
  train_rc=${PIPESTATUS[0]}
fi

x3_rc=skipped
# a step of the x3 stages: its output to x3.log, the tail shown, a failure kept in x3_rc
x3_step() { "$@" 2>&1 | grep -v "^\s*$" | tee -a "$OUT/x3.log" | tail -${X3_TAIL:-12}; rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || x3_rc=$rc; }
if [[ " $STAGES " == *" x3 "* ]]; then
  section "float32x3 on the fused backend and k_slices: tests, compute-sanitizer, the step's product"
  x3_rc=0; : > "$OUT/x3.log"
  x3_step timeout 200 "$PY" -m pytest tests/gpu/test_precision_fp32x3_gpu.py -k fused -q -rfEs -p no:cacheprovider
  x3_step timeout 90 "$PY" -m pytest "tests/gpu/test_fused_modes_gpu.py::test_k_in_slices_summed_by_the_kernels" -q -rfEs \
    -p no:cacheprovider
  for tool in memcheck racecheck; do
    x3_step timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 "$PY" benchmarks/sanitize_fused_modes.py float32x3 48
  done
  X3_TAIL=40 x3_step timeout 120 "$PY" benchmarks/probe_fused_x3.py --out "$OUT" --products
  X3_TAIL=40 x3_step timeout 90 "$PY" benchmarks/probe_step_batched_k.py --out "$OUT"
  X3_TAIL=12 x3_step timeout 120 "$PY" benchmarks/probe_replay_memory.py
  X3_TAIL=30 x3_step timeout 150 "$PY" benchmarks/probe_stream_gemm.py --out "$OUT"
  X3_TAIL=30 x3_step timeout 90 "$PY" benchmarks/probe_x3_promote.py --out "$OUT" --promote 64,128 --pair
  X3_TAIL=40 x3_step timeout 90 "$PY" benchmarks/probe_x3_promote.py --out "$OUT/modes" --modes tf32,bfloat16,float16
fi
mode16_rc=skipped
# a step of the mode16 stage: its output to mode16.log, the tail shown, a failure kept in mode16_rc
mode16_step() { "$@" 2>&1 | grep -v "^\s*$" | tee -a "$OUT/mode16.log" | tail -${M16_TAIL:-12}; rc=${PIPESTATUS[0]}
                [ "$rc" = 0 ] || mode16_rc=$rc; }
if [[ " $STAGES " == *" mode16 "* ]]; then
  section "bf16 / fp16 at blogA: the one-launch layer, its floors, Nsight Compute on it, compute-sanitizer"
  mode16_rc=0; : > "$OUT/mode16.log"
  M16_TAIL=40 mode16_step timeout 200 "$PY" benchmarks/probe_mode_persist.py --out "$OUT" --first --plain
  M16_TAIL=20 mode16_step timeout 200 "$PY" benchmarks/probe_mode_persist.py --floors --feed duo --feed trio --plain \
    --precision bfloat16
  # every section of Nsight Compute on blogA's bf16 duo launch (the 2nd: the first timed one; --share leaves the
  # projection-beside runs out, which ncu's one kernel at a time would stall)
  M16_TAIL=6 mode16_step timeout 240 ncu -k regex:mode_persist_bfloat16_32_8_duo$ --launch-skip 1 -c 1 --set full \
    "$PY" benchmarks/probe_mode_persist.py --precision bfloat16 --cell lstm --feed duo --plain --share 0.7
  for tool in memcheck racecheck; do
    M16_TAIL=8 mode16_step timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 "$PY" \
      benchmarks/probe_mode_persist.py --sanitize --precision bfloat16
  done
fi
feed_rc=skipped
# a step of the feedwarp stage: its output to feedwarp.log, the tail shown, a failure kept in feed_rc
feed_step() { "$@" 2>&1 | grep -v "^\s*$" | tee -a "$OUT/feedwarp.log" | tail -${FEED_TAIL:-8}; rc=${PIPESTATUS[0]}
              [ "$rc" = 0 ] || feed_rc=$rc; }
if [[ " $STAGES " == *" feedwarp "* ]]; then
  section "the bulk pipeline's feed warp and the wgmma stream: GPU tests, compute-sanitizer, the persistent schedule"
  feed_rc=0; : > "$OUT/feedwarp.log"
  FEED_TAIL=6 feed_step env OPENBLAS_NUM_THREADS=1 timeout 240 "$PY" -m pytest tests/gpu/test_precision_gpu.py \
    -k "bulk_pipeline or bit_identical" -q -rfEs -p no:cacheprovider
  for tool in memcheck racecheck; do
    FEED_TAIL=3 feed_step timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 "$PY" \
      benchmarks/sanitize_persistent.py bfloat16
  done
  for feed in "" --feed-warp --stream-wgmma "--stream-wgmma --units 32"; do
    FEED_TAIL=9 feed_step timeout 120 "$PY" benchmarks/probe_schedules.py --precision bfloat16 --preset lstm \
      --preset gru --config mid --config large --config blogA --schedule persistent --no-fused $feed \
      --json "$OUT/feedwarp$(echo "$feed" | tr -d ' -').json"
  done
fi
targets_rc=skipped
if [[ " $STAGES " == *" targets "* ]]; then
  section "issue #34's targets: ${TARGET_PARTS:-bf16}"
  parts=""; for part in ${TARGET_PARTS:-bf16}; do parts="$parts --part $part"; done
  timeout 560 "$PY" benchmarks/issue34_targets.py --out "$OUT" $parts --time-budget "${TARGET_BUDGET:-400}" 2>&1 \
    | tee "$OUT/targets.log" | grep -v "^\s*$" | tail -16
  targets_rc=${PIPESTATUS[0]}
fi

if [[ " $STAGES " == *" x3rows "* ]]; then
  section "the harness's rows: fused float32x3 (auto chunks, fp16 and TF32 parts) against cuDNN fp32, the anchors and T = 1000"
  [ "$x3_rc" = skipped ] && x3_rc=0 && : > "$OUT/x3.log"
  X3_TAIL=50 x3_step timeout 450 "$PY" benchmarks/probe_fused_x3.py --out "$OUT" --configs benchmarks/configs/x3_error.json \
    --chunks auto --parts fp16,tf32 --lean
fi

section "table"
"$PY" - "$OUT" <<'PYEOF' 2>&1 | tee "$OUT/bench_table.md"
import sys
from engine.bench import list_results, load_results, markdown_table
from engine.bench.nets import net_markdown_table
found = list_results(sys.argv[1])
for entry in found[:3] or [None]:
    results = load_results(entry["path"]) if entry else None
    if results is None:
        print("no benchmark results were written")
    elif results.get("cells"):
        print(markdown_table(results))
    if results is not None and results.get("nets"):
        print(net_markdown_table(results))
    print()
PYEOF
echo
echo "gpu tests exit code: $tests_rc; compute-sanitizer: $sanitize_rc; bench exit code: $bench_rc;" \
     "precision bench exit code: $precision_rc; nets: $nets_rc; wheels: $wheels_rc; layersync: $layersync_rc;" \
     "phases: $phases_rc; lengths: $lengths_rc; probes: $probes_rc; cluster: $cluster_rc; train: $train_rc;" \
     "x3: $x3_rc; mode16: $mode16_rc; feedwarp: $feed_rc; targets: $targets_rc" \
     "(124 = timed out); total $(( $(date +%s) - start )) s"
