"""The floor of a step's product where the weight comes from DRAM: a kernel that only reads the weight (16-byte
loads, several in flight a thread, every SM busy), T launches chained in one CUDA graph, against cublasLt's product
of the same weight in the same kind of chain (issue #34: blogA's bf16 product reads its 52 MB at ~2.7 TB/s;
benchmarks/probe_step_l2.py, H200, 2026-11-28).

The read kernel folds what it reads into one word a block (so nothing is optimized away) and is checked against
NumPy's XOR of the same words. Weights: random bits. Medians of CUDA-event intervals after warm-up.

    python3 benchmarks/probe_stream_floor.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_chain import graph_ms  # noqa: E402

CASES = [("lstm blogA bf16", 4 * 2560 * 2560 * 2, 200), ("gru blogA bf16", 3 * 2560 * 2560 * 2, 200),
         ("lstm blogA tf32", 4 * 2560 * 2560 * 4, 200), ("lstm large layer bf16", 4 * 1024 * 1024 * 2, 100)]
SOURCE = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ w, const long n, unsigned* __restrict__ out)
{
    unsigned acc = 0;
    const long stride = (long)gridDim.x * blockDim.x;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {          // four 16-byte loads in flight a thread
        const uint4 a = w[i], b = w[i + stride], c = w[i + 2 * stride], d = w[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) { const uint4 a = w[i]; acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ unsigned part[32];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned v = 0;
        for (int k = 0; k < (int)(blockDim.x >> 5); ++k) v ^= part[k];
        out[blockIdx.x] = v;
    }
}
"""


def main() -> None:
    import cupy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    kernel = cupy.RawModule(code=SOURCE).get_function("read_all")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    for name, nbytes, T in CASES:
        words = np.random.default_rng(0).integers(0, 2 ** 32, nbytes // 4, dtype=np.uint32)
        w = cupy.asarray(words)
        n = nbytes // 16
        for blocks_per_sm, threads in ((2, 512), (4, 256), (8, 256), (16, 128)):
            blocks = sms * blocks_per_sm
            out = cupy.zeros(blocks, dtype=cupy.uint32)
            cupy.cuda.Device().synchronize()          # made on the null stream, which `stream` does not wait for
            with stream:
                kernel((blocks,), (threads,), (w, np.int64(n), out))
            stream.synchronize()
            folded = np.bitwise_xor.reduce(cupy.asnumpy(out))
            if folded != np.bitwise_xor.reduce(words):
                raise SystemExit(f"{name}: the read kernel's fold differs from NumPy's")
            with stream:
                stream.begin_capture()
                for _ in range(T):
                    kernel((blocks,), (threads,), (w, np.int64(n), out))
                graph = stream.end_capture()
            ms = graph_ms(cupy, stream, graph, args.reps)
            us = 1e3 * ms / T
            rows.append({"case": name, "MB": nbytes / 1e6, "blocks": blocks, "threads": threads, "us_per_read": us,
                         "TB_per_s": nbytes / (us * 1e-6) / 1e12})
            print(f"{name:24s} {nbytes / 1e6:7.1f} MB  {blocks:5d} x {threads:3d}  {us:7.2f} us a read  "
                  f"{nbytes / (us * 1e-6) / 1e12:5.2f} TB/s", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_stream_floor.json").write_text(json.dumps(
            {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
