"""float32x3's step product in fp16 parts: the engine's own wgmma kernel, which promotes each K chunk's tensor-core
accumulator into an fp32 sum in registers (kernels/x3_wgmma.cu, engine/schedules/wgmma_products.py), against the same
product on cublasLt as the fused backend issues it otherwise (a strided batch of K chunks, then the fold).

Each variant: its error against the float64 product (norm-relative) and its time in a chain of 50 captured into a
CUDA graph (median of 11 launches), for the step products of `large` and blogA (LSTM and GRU), at ring depths of 2
and 4 slots and several promotion widths. sm_90 only (wgmma).

    python3 benchmarks/probe_x3_promote.py --out /tmp/probe [--promote 128,256] [--slots 2,4]
    python3 benchmarks/probe_x3_promote.py --out /tmp/probe --modes tf32,bfloat16,float16
    python3 benchmarks/probe_x3_promote.py --out /tmp/probe --promote 64 --pair

--pair adds the float32x3 kernel with two warpgroups a block splitting the chunks (x3_wgmma_pair_*, written
2026-11-28 and compiled, not yet run on a GPU), its error held to the engine kernel's at --promote 64.

--modes instead times a reduced mode's step product: cublasLt's (the fused backend's) against the engine's wgmma
kernel for the modes (kernels/mode_wgmma.cu), at 4 and 8 slots, each with its error against the float64 product of
the same rounded operands.

History (NOTES 2026-11-28 08:13 and 2026-11-28 09:47): the first version of the kernel copied row-major operands
with per-thread cp.async and took 33 us at `large` (cuBLAS: 18.6); with the operands pre-laid in 8 KB tiles and
staged by bulk copies it took 12.6.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_fused_ahead import write_rows  # noqa: E402
from step_chain import product_chain  # noqa: E402

from engine.codegen.cublas_enums import CUBLAS_COMPUTE_32F, CUDA_R_16F  # noqa: E402
from engine.schedules import wgmma_products  # noqa: E402
from engine.schedules.cublaslt import LtProjection, Product  # noqa: E402
from engine.schedules.project import LT_OPERANDS, operand_dtype, round_into  # noqa: E402
from engine.schedules.split_products import (  # noqa: E402
    LO_SCALE,
    chunking,
    fold,
    partial_size,
    split_into,
    stack_split,
    stacked_calls,
)

SHAPES = [("lstm", "large", 128, 1024, 4096), ("gru", "large", 128, 1024, 3072),
          ("lstm", "blogA", 64, 2560, 10240), ("gru", "blogA", 64, 2560, 7680)]
CHAIN = 50


def mode_operands(cupy, precision: str, R: int, K: int, N: int):
    """A reduced mode's step product's operands, random (h uniform in [-1, 1], W normal / sqrt(K)): h and W rounded
    row-major (cublasLt's), the float64 product of those values, and both in the wgmma products' tiles."""
    rng = np.random.default_rng(0)
    h = cupy.asarray(rng.uniform(-1, 1, (R, K)).astype(np.float32))
    w = cupy.asarray((rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32))
    dtype = operand_dtype(cupy, precision)
    hr = round_into(cupy, h, cupy.empty((R, K), dtype=dtype), precision)
    wr = round_into(cupy, w, cupy.empty((N, K), dtype=dtype), precision)
    values = {"tf32": lambda a: a.astype(cupy.float64), "float16": lambda a: a.astype(cupy.float64),
              "bfloat16": lambda a: (a.astype(cupy.uint32) << 16).view(cupy.float32).astype(cupy.float64)}
    exact = values[precision](hr) @ values[precision](wr).T
    tiles = wgmma_products.tiled_mode_operand(cupy, R, K, precision, poison=False)
    wgmma_products.round_tiles_into(cupy, h, tiles, precision)
    weight = wgmma_products.tile_mode_weight(cupy, w, precision)
    cupy.cuda.Device().synchronize()
    return hr, wr, exact, tiles, weight


def modes(cupy, lt, stream, precisions) -> list[dict]:
    """Each reduced mode's step product at SHAPES: cublasLt (one product of the rounded operands, as
    ModeDevice._multiply issues it) and the wgmma kernel at 4 and 8 slots; error against the float64 product of the
    same rounded operands."""
    rows = []
    chosen = wgmma_products.mode_stages
    for precision in precisions:
        for cell, config, R, K, N in SHAPES:
            hr, wr, exact, tiles, weight = mode_operands(cupy, precision, R, K, N)
            out = cupy.empty((R, N), dtype=cupy.float32)

            def measure(label, issue, **extra):
                error, us = product_chain(cupy, stream, out, exact, issue, CHAIN)
                rows.append({"precision": precision, "cell": cell, "config": config, "variant": label, "error": error,
                             "us": us, **extra})
                print(f"{precision:8s} {cell:4s} {config:6s} {label:28s} {us:8.2f} us  error {error:.2e}", flush=True)

            def cublas():
                data, compute = LT_OPERANDS[precision]
                if not lt.product(Product.dense(R, N, K), hr.data.ptr, wr.data.ptr, out.data.ptr, data, compute):
                    raise SystemExit(f"cublasLt offered no algorithm for the {precision} product")
            measure("cublasLt", cublas)
            blocks = (wgmma_products.padded(N) // 64) * (wgmma_products.padded(R) // 64)
            for slots in (4, 8):
                wgmma_products.mode_stages = lambda cupy, blocks, slots=slots: slots
                measure(f"wgmma kernel, {slots} slots",
                        lambda: wgmma_products.mode_product(cupy, tiles, weight, out, R, K, N, precision),
                        slots=slots, picked=chosen(cupy, blocks) == slots)
            wgmma_products.mode_stages = chosen
    return rows


def main() -> None:
    import cupy  # deferred: CuPy is optional (no GPU in CI)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--promote", default="128,256", help="columns of a promoted accumulator, comma-separated")
    ap.add_argument("--slots", default="2,4", help="ring depths, comma-separated")
    ap.add_argument("--modes", default=None, help="instead: reduced modes' products (tf32, float16, bfloat16)")
    ap.add_argument("--pair", action="store_true", help="also the kernel with two warpgroups splitting the chunks "
                    "(x3_wgmma_pair_*, kernels/x3_wgmma.cu), checked against the engine's kernel's error")
    args = ap.parse_args()
    if not wgmma_products.wgmma_capable(cupy):
        raise SystemExit("the wgmma product runs on sm_90 (H100, H200) only")
    lt = LtProjection.on_current_device(cupy)
    stream = cupy.cuda.Stream(non_blocking=True)
    if args.modes:
        rows = modes(cupy, lt, stream, args.modes.split(","))
        write_rows(cupy, args.out, "probe_mode_wgmma.json", rows)
        return
    chosen = wgmma_products.stages
    rows = []
    for cell, config, R, K, N in SHAPES:
        rng = np.random.default_rng(0)
        h = cupy.asarray(rng.uniform(-1, 1, (R, K)).astype(np.float32))
        w = cupy.asarray((rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32))
        exact = h.astype(cupy.float64) @ w.astype(cupy.float64).T
        parts = split_into(cupy, h, cupy.empty((2, R, K), dtype=cupy.float16), "fp16")
        stacked = stack_split(cupy, w, "fp16")
        tiles = wgmma_products.tiled_operand(cupy, R, K, poison=False)
        wgmma_products.tile_split_into(cupy, h, tiles, cupy.zeros(1, dtype=cupy.uint32))
        weight = wgmma_products.tile_weight(cupy, w)
        out = cupy.empty((R, N), dtype=cupy.float32)
        cupy.cuda.Device().synchronize()

        def measure(label, issue, **extra):
            error, us = product_chain(cupy, stream, out, exact, issue, CHAIN)
            rows.append({"cell": cell, "config": config, "variant": label, "error": error, "us": us, **extra})
            print(f"{cell:4s} {config:6s} {label:44s} {us:8.2f} us  error {error:.2e}", flush=True)

        found = chunking(K)
        partial = cupy.empty(partial_size(R, N, found), dtype=cupy.float32)

        def batched():                        # the fused backend's cublasLt calls (ModeDevice._stacked_product), the fold
            for call in stacked_calls(R, K, N, found):
                if not lt.product(call.shape, parts.data.ptr + 2 * call.a, stacked.data.ptr + 2 * call.w,
                                  partial.data.ptr + 4 * call.out, CUDA_R_16F, CUBLAS_COMPUTE_32F):
                    raise SystemExit("cublasLt offered no algorithm for the fp16 parts' product")
            fold(cupy, partial, out, R, N, found.count, LO_SCALE["fp16"])
        measure(f"cublasLt, batch of {found.count} x {found.size} + fold", batched)
        blocks = (wgmma_products.padded(N) // 64) * (wgmma_products.padded(R) // 64)
        print(f"{cell:4s} {config:6s} {blocks} blocks; the engine picks {chosen(cupy, blocks)} slots", flush=True)
        for slots in (int(s) for s in args.slots.split(",")):
            wgmma_products.stages = lambda cupy, blocks, slots=slots: slots
            for promote in (int(p) for p in args.promote.split(",")):
                measure(f"wgmma kernel, {slots} slots, promoted every {promote}",
                        lambda promote=promote: wgmma_products.promoted_product(cupy, tiles, weight, out, R, K, N, promote),
                        slots=slots, promote=promote, picked=chosen(cupy, blocks) == slots)
        wgmma_products.stages = chosen
        if args.pair:
            engine_error = next((r["error"] for r in reversed(rows) if r["variant"].startswith("wgmma kernel")
                                 and r.get("promote") == 64), None)          # this shape's, at --promote 64
            for slots in (2, 3):
                smem = 2 * wgmma_products.smem_bytes(slots)
                pair = wgmma_products.ring_kernel(cupy, "x3_wgmma.cu", f"x3_wgmma_pair_{slots}", smem)
                grid = (wgmma_products.padded(N) // 64, wgmma_products.padded(R) // 64)

                def issue(pair=pair, smem=smem, grid=grid):
                    pair(grid, (256,), (tiles, weight, out, np.int32(R), np.int32(N), np.int32(grid[1] * 64),
                                        np.int32(grid[0] * 64), np.int32(wgmma_products.padded(K)), np.int32(1),
                                        np.float32(1 / 2048)), shared_mem=smem)
                measure(f"two warpgroups, {slots} slots each", issue, slots=slots, promote=64, pair=True)
                if engine_error is not None and rows[-1]["error"] > 1.5 * engine_error + 1e-7:
                    raise SystemExit(f"the two-warpgroup kernel's error {rows[-1]['error']:.3g} is past the engine "
                                     f"kernel's {engine_error:.3g}: wrong")
    write_rows(cupy, args.out, "probe_x3_promote.json", rows)


if __name__ == "__main__":
    main()
