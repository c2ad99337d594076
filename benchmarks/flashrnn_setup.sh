#!/usr/bin/env bash
# FlashRNN 1.0.8 (NX-AI, Apache-2.0) for the GPU machine, which has no network: installs the carried wheels
# (.whl/flashrnn/: flashrnn, einops, ninja) into $1 and removes from its gpu_info.cc the reads of the eight
# cudaDeviceProp fields CUDA 13 removed (clockRate, computeMode, cooperativeMultiDeviceLaunch, deviceOverlap,
# kernelExecTimeoutEnabled, maxTexture1DLinear, memoryClockRate, singleToDoublePrecisionPerfRatio), so that its
# kernels build with CUDA 13. Then: FLASHRNN_PATH=$1 PATH=$1/bin:$PATH python3 benchmarks/cells_today.py
set -euo pipefail
dest=${1:?usage: flashrnn_setup.sh DEST}
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --no-deps --no-index --target "$dest" .whl/flashrnn/*.whl
python3 - "$dest/flashrnn/flashrnn/gpu_info/gpu_info.cc" <<'PY'
import re, sys
path = sys.argv[1]
removed = ("clockRate", "computeMode", "cooperativeMultiDeviceLaunch", "deviceOverlap", "kernelExecTimeoutEnabled",
           "maxTexture1DLinear", "memoryClockRate", "singleToDoublePrecisionPerfRatio")
text = open(path).read()
patched = 0
for field in removed:
    text, n = re.subn(r'dict\["' + field + r'"\]\s*=\s*prop\.' + field + r'\s*;', "", text)
    assert n == 1 or (n == 0 and f"prop.{field}" not in text), (field, n)    # 0: patched by an earlier run
    patched += n
open(path, "w").write(text)
print(f"flashrnn: gpu_info.cc patched for CUDA 13 ({patched} of 8 fields; the others were already)")
PY
