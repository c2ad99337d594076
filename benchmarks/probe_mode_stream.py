"""A 16-bit mode's step product that reads h fewer times and keeps part of its weight in L2 (kernels/mode_stream.cu,
kernels/mode_wide.cu; issue #34, bf16 / fp16 at blogA; NOTES 2026-11-28 11:10, 11:25 and 12:16), against cublasLt
(the fused backend's product) and the engine's wgmma kernel for the modes (kernels/mode_wgmma.cu).

For the step products of `large` and blogA (LSTM and GRU), in bf16 and fp16: each variant's error against the float64
product of the same rounded operands (it must be within 1.5x cublasLt's, or one accumulator's drift), then its time
in a chain of 50 captured into a CUDA graph (median of 11 launches). Each variant with no L2 policy and with the
weight's first `primary` bytes evict_last (36 MB, and the whole weight where it is smaller):
- mode_wide.cu: blocks of 2 or 4 weight tiles (128 or 256 rows) against one chunk of h, in clusters of 1-4 blocks
  that split K, with 2-8 slots (WIDE);
- mode_stream.cu: 64 rows a block; with --clusters also in clusters of 2 and 4 that multicast h (twice as slow:
  NOTES 11:25; a variant with a producer warp, no faster, is gone: NOTES 12:16).
--sanitize: one small product, chains of 2, for compute-sanitizer. sm_90 only.

    python3 benchmarks/probe_mode_stream.py --out /tmp/probe [--precision bfloat16] [--clusters] [--sanitize]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_fused_ahead import write_rows  # noqa: E402
from probe_x3_promote import CHAIN, SHAPES, mode_operands  # noqa: E402
from step_chain import product_chain  # noqa: E402

from engine.schedules import wgmma_products  # noqa: E402
from engine.schedules.cublaslt import LtProjection, Product  # noqa: E402
from engine.schedules.project import LT_OPERANDS  # noqa: E402

STAGES = 4                      # mode_stream.cu's slots (16 KB each)
MB = 1 << 20


def stream_product(cupy, operand, weight, out, R: int, K: int, N: int, precision: str, cluster: int,
                   primary: int) -> None:
    """out (R, N) = the tiled operand times the tiled weight^T on kernels/mode_stream.cu: clusters of `cluster`
    blocks, the weight's first `primary` bytes evict_last (0: plain copies)."""
    rp, np_ = wgmma_products.padded(R), wgmma_products.padded(N)
    grid = (np_ // 64, rp // 64)
    if grid[0] % cluster:
        raise SystemExit(f"{grid[0]} weight-row blocks do not make clusters of {cluster}")
    smem = wgmma_products.smem_bytes(STAGES, 2) + 8 * STAGES
    name = f"mode_stream_{precision}_{cluster}"
    function = wgmma_products.ring_kernel(cupy, "mode_stream.cu", name, smem)
    chunks = wgmma_products.padded(K) // 64
    function(grid, (128,), (operand, weight, out, np.int32(R), np.int32(N), np.int32(chunks), np.uint32(primary),
                            np.uint32(weight.nbytes)), shared_mem=smem)


WIDE = ((2, 1, 4), (2, 1, 8), (2, 2, 4), (2, 2, 6), (4, 1, 4), (4, 2, 2), (4, 2, 4), (4, 3, 3), (4, 4, 2),
        (4, 4, 4))                      # kernels/mode_wide.cu's entries: weight tiles a block, blocks a cluster, slots


def main() -> None:
    import cupy  # deferred: CuPy is optional (no GPU in CI)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--clusters", action="store_true", help="also mode_stream.cu's clusters of 2 and 4")
    ap.add_argument("--sanitize", action="store_true",
                    help="one small product (16 x 512 by 512 x 2048), chains of 2: for compute-sanitizer")
    ap.add_argument("--precision", action="append", default=None, help="bfloat16, float16 (default: both)")
    args = ap.parse_args()
    if not wgmma_products.wgmma_capable(cupy):
        raise SystemExit("kernels/mode_stream.cu runs on sm_90 (H100, H200) only")
    lt, stream, rows = LtProjection.on_current_device(cupy), cupy.cuda.Stream(non_blocking=True), []
    for precision in args.precision or ["bfloat16", "float16"]:
        for cell, config, R, K, N in (("lstm", "small", 16, 512, 2048),) if args.sanitize else SHAPES:
            hr, wr, exact, tiles, weight = mode_operands(cupy, precision, R, K, N)
            out = cupy.empty((R, N), dtype=cupy.float32)

            def measure(label, issue, **extra):
                error, us = product_chain(cupy, stream, out, exact, issue, 2 if args.sanitize else CHAIN)
                rows.append({"precision": precision, "cell": cell, "config": config, "variant": label,
                             "error": error, "us": us, **extra})
                print(f"{precision:8s} {cell:4s} {config:6s} {label:36s} {us:8.2f} us  error {error:.2e}", flush=True)
                return error

            def cublas():
                data, compute = LT_OPERANDS[precision]
                if not lt.product(Product.dense(R, N, K), hr.data.ptr, wr.data.ptr, out.data.ptr, data, compute):
                    raise SystemExit(f"cublasLt offered no algorithm for the {precision} product")
            bound = max(1.5 * measure("cublasLt", cublas), 4e-9 * K)
            measure("wgmma kernel (mode_wgmma.cu)",
                    lambda: wgmma_products.mode_product(cupy, tiles, weight, out, R, K, N, precision))
            primaries = sorted({0, min(weight.nbytes, 36 * MB)})
            for wt, split, stages in WIDE:
                for primary in primaries:
                    label = f"wide {wt} tiles, split {split}, {stages} slots, evict_last {primary / MB:.0f} MB"
                    if (wgmma_products.padded(N) // 64) % wt:
                        raise SystemExit(f"N = {N}: its weight tiles do not make blocks of {wt}")
                    error = measure(label, lambda a=(wt, split, stages), p=primary: wgmma_products.wide_product(
                        cupy, tiles, weight, out, R, K, N, precision, a, p), wide=wt, split=split, stages=stages,
                        primary=primary)
                    if not error <= bound:
                        raise SystemExit(f"{label}: error {error:.3g} past {bound:.3g}: wrong")
            for cluster in (1, 2, 4) if args.clusters else (1,):
                for primary in primaries:
                    label = f"stream, clusters of {cluster}, evict_last {primary / MB:.0f} MB"
                    error = measure(label, lambda c=cluster, p=primary: stream_product(
                        cupy, tiles, weight, out, R, K, N, precision, c, p), cluster=cluster, primary=primary)
                    if not error <= bound:
                        raise SystemExit(f"{label}: error {error:.3g} past {bound:.3g}: wrong")
    write_rows(cupy, args.out, "probe_mode_stream.json", rows)


if __name__ == "__main__":
    main()
