"""Can the persistent kernel be a cooperative launch of thread-block clusters? (CuPy, CUDA 13, sm_90)

    python benchmarks/experiments/probe_clusters.py

A kernel with __cluster_dims__(CS, 1, 1), launched cooperatively through CuPy (RawModule with
enable_cooperative_groups=True, one block of 256 threads and 200 KiB of shared memory per SM): each block writes
a value to its shared memory, cluster.sync(), reads its neighbour's through distributed shared memory, then
grid.sync() 2000 times; the values are checked and the loop timed against the same kernel without clusters.
Prints, per cluster size, the largest grid that launches. (The question behind it: blocks of one layer sharing
each X chunk through one L2 read, benchmarks/NOTES.md, 2026-11-23 22:07.)"""
from __future__ import annotations

import cupy
import numpy as np

SRC = r'''
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(256, 1) spike(int* out, int iters)
{
    extern __shared__ int smem[];
    cg::grid_group grid = cg::this_grid();
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) smem[0] = blockIdx.x * 7 + 1;
    cluster.sync();
    const unsigned rank = cluster.block_rank();
    int* peer = cluster.map_shared_rank(smem, (rank + 1) % cluster.num_blocks());
    int v = peer[0];
    cluster.sync();
    for (int i = 0; i < iters; ++i) grid.sync();
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}
'''
SRC_NOCLUSTER = SRC.replace("__cluster_dims__(CS, 1, 1) ", "").replace(
    "cg::cluster_group cluster = cg::this_cluster();", "").replace(
    "cluster.sync();\n    const unsigned rank = cluster.block_rank();\n    int* peer = cluster.map_shared_rank(smem, (rank + 1) % cluster.num_blocks());\n    int v = peer[0];\n    cluster.sync();",
    "__syncthreads(); int v = smem[0];")

def run(src, cs, blocks, smem=200 * 1024, iters=2000):
    mod = cupy.RawModule(code=src, options=("-std=c++17", f"-DCS={cs}"), enable_cooperative_groups=True)
    k = mod.get_function("spike")
    k.max_dynamic_shared_size_bytes = smem
    out = cupy.full(blocks, -1, dtype=cupy.int32)
    k((blocks,), (256,), (out, np.int32(10)), shared_mem=smem)
    cupy.cuda.Device().synchronize()
    s, e = cupy.cuda.Event(), cupy.cuda.Event()
    s.record(); k((blocks,), (256,), (out, np.int32(iters)), shared_mem=smem); e.record(); e.synchronize()
    us = cupy.cuda.get_elapsed_time(s, e) * 1e3 / iters
    return out.get(), us

sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
print("device", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "SMs", sms)
try:
    _, us = run(SRC_NOCLUSTER, 1, sms)
    print(f"no cluster: {sms} blocks, grid.sync {us:.2f} us")
except Exception as ex:
    print("no cluster failed:", type(ex).__name__, str(ex)[:300])
for cs in (2, 4, 8):
    for blocks in dict.fromkeys((sms // cs * cs, 128, 120, 112, 96, 64)):
        if blocks % cs:
            continue
        try:
            vals, us = run(SRC, cs, blocks)
            want = np.array([((b // cs) * cs + (b % cs + 1) % cs) * 7 + 1 for b in range(blocks)])
            print(f"cluster {cs}: {blocks} blocks OK={np.array_equal(vals, want)} grid.sync {us:.2f} us")
            break
        except Exception as ex:
            print(f"cluster {cs}: {blocks} blocks failed: {type(ex).__name__} {str(ex)[:200]}")
