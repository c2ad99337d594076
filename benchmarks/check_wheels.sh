#!/usr/bin/env bash
# Issue #9, "one install": does the engine run on a GPU machine through the CUDA wheels alone (requirements-gpu.txt:
# nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cublas), with no system CUDA toolkit? For the GPU machine, whose
# image has both the wheels and a toolkit: the toolkit is hidden for the length of the check (its folder renamed,
# CUDA_PATH / CUDA_HOME unset, nvcc off PATH, fresh CuPy and engine kernel caches), then restored.
#
#   bash benchmarks/check_wheels.sh            (as root on a throwaway GPU machine)
#
# Prints where CuPy found CUDA, NVRTC's version, and runs the fused backend and the persistent schedule (cooperative
# launch: needs cooperative_groups.h from the runtime wheel) on an LSTM against the float64 reference.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
hidden=()
for dir in /usr/local/cuda /usr/local/cuda-13 /usr/local/cuda-13.0; do
  if [ -e "$dir" ] && [ ! -L "$dir" ]; then mv "$dir" "$dir.hidden-by-check" && hidden+=("$dir"); fi
  if [ -L "$dir" ]; then mv "$dir" "$dir.hidden-by-check" && hidden+=("$dir"); fi
done
restore() { for dir in "${hidden[@]}"; do mv "$dir.hidden-by-check" "$dir"; done; }
trap restore EXIT
echo "hidden: ${hidden[*]:-(none found)}"
clean_path=$(echo "$PATH" | tr ':' '\n' | grep -v -i cuda | paste -sd: -)
cache=$(mktemp -d)
env -u CUDA_PATH -u CUDA_HOME PATH="$clean_path" CUPY_CACHE_DIR="$cache" CELLFORGE_CACHE_DIR="$cache" CUPY_TF32=0 "$PY" - <<'PYEOF'
import shutil
import numpy as np
import cupy
import engine
from engine.backends import fused, reference
from engine.schedules import schedule_class
print("nvcc on PATH:", shutil.which("nvcc"))
print("CuPy's CUDA path:", cupy.cuda.get_cuda_path())
print("NVRTC version:", cupy.cuda.nvrtc.getVersion())
net = engine.Network(engine.preset("lstm").cell, 33, 65, 2)
params = engine.init_params(net, seed=0)
x = np.random.default_rng(1).standard_normal((9, 3, 33))
ref = reference.run(net, params, x, dtype=np.float64).outputs
for name, program in (("fused", fused.prepare(net, params)), ("persistent", schedule_class("persistent")(net, params))):
    out = program.run(x, poison=True).outputs
    err = float(np.abs(out - ref).max() / np.abs(ref).max())
    print(f"{name}: relative error {err:.2e}", "OK" if err < 1e-5 else "WRONG")
    assert err < 1e-5
print("the engine ran through the CUDA wheels alone")
PYEOF
rc=$?
rm -rf "$cache"
echo "check_wheels exit code: $rc"
exit $rc
