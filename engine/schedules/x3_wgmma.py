"""float32x3's step product in fp16 parts on the engine's own Hopper kernel (kernels/x3_wgmma.cu): one launch, each
K chunk's tensor-core accumulator promoted into an fp32 sum in registers, no P to write and fold.

    weight = tile_weight(cupy, w)                          # (N, K) fp32 -> [W_hi; W_lo] fp16 in 64 x 64 tiles
    copy = tiled_operand(cupy, R, K, poison=False)         # what the kernels write h's parts into (the copies)
    promoted_product(cupy, copy, weight, out, R, K, N)     # out (R, N) = h @ W^T, float32x3's product

The cuBLAS path (split_products.py) keeps the tensor cores' truncating accumulation short by a strided batch of K
chunks, each a plane of P (R x N floats) written and read again by the fold. Here one block of 64 batch rows x 64
features streams its operands through a ring of 8 KB tiles (bulk copies, the tiles pre-swizzled in global memory:
the weights at upload, the operand by the kernels that write it, engine/codegen/operand_copies.py) and adds the big
product's accumulator into an fp32 sum every PROMOTE columns. Measured on an H200 (2026-11-28,
benchmarks/probe_x3_promote.py, the product alone in a chain of 50): `large` LSTM (R = 128, K = 1024, N = 4096)
12.6 us against cuBLAS's batch and fold's 18.6, at a smaller error (2.1e-7 against 3.5e-7, norm-relative to
float64); blogA LSTM (R = 64, K = 2560, N = 10240) 35.8 us against 54.2. The same kernel with per-thread cp.async
copies of row-major operands took 33 us at `large`: the tiles' bulk copies are what make it fast.

Where it runs: sm_90 (wgmma), float32x3 in fp16 parts (x3_product "auto" or "wgmma", fused_modes.FusedModeProgram).
"""
from __future__ import annotations

import numpy as np

from ..codegen.cuda import KERNELS_DIR, file_entry, helper_source, round_blocks
from ..codegen.nvrtc import load_module
from ..rounding import split_fp16
from .base import chunked
from .split_products import FOLD_THREADS, LO_SCALE, split_into

TILE = 64                    # rows and columns of a tile (8 KB of fp16)
STAGE_BYTES = 4 * TILE * TILE * 2
# Columns of one promoted accumulator: one chunk. On an H200 (2026-11-28, probe_x3_promote.py) the time did not depend
# on it (128, 256, 512 within 1 %) and the error fell with it (2.1e-7 at `large` for 128, 3.5e-7 for 256); with 128
# the LSTM at `lat`, T = 1000, had 2.03x cuDNN fp32's error (issue #34's bound: 2x), so every chunk is promoted.
PROMOTE = 64
X3_PRODUCTS = ("auto", "wgmma", "cublaslt")
THREADS = 128                # one warpgroup a block


def promote_columns(chunk, K: int) -> int:
    """Columns of one promoted accumulator for x3_chunk `chunk`: "auto", PROMOTE; None, all of K; an int, itself
    rounded up to whole tiles (the kernel promotes after whole chunks of 64)."""
    if chunk == "auto":
        return PROMOTE
    return padded(K if chunk is None else chunk)


def padded(n: int) -> int:
    """n rounded up to whole tiles."""
    return -(-n // TILE) * TILE


def wgmma_capable(cupy) -> bool:
    """Whether the current GPU runs kernels/x3_wgmma.cu: sm_90 (H100, H200), whose wgmma the kernel issues."""
    return cupy.cuda.Device().compute_capability == "90"


def resolve_product(product: str, parts: str, splitk, capable: bool) -> str:
    """x3_product as it runs: "wgmma" where it was asked for or left to "auto", with fp16 parts, no cublasLt split-K,
    on an sm_90 GPU (capable); "cublaslt" otherwise (fused_modes.check_x3_product refuses "wgmma" where it cannot
    run; after a fallback to TF32 parts it gives way)."""
    return "wgmma" if product != "cublaslt" and parts == "fp16" and splitk is False and capable else "cublaslt"


def tiled(xp, parts, rows: int, cols: int):
    """parts (2, rows, cols) -> flat, each part padded with zeros to whole tiles and laid out as the kernel reads it
    (engine/schedules/base.py chunked: blocks of 64 rows, each as 64 x 64 tiles, 16-byte groups swizzled)."""
    rp, kp = padded(rows), padded(cols)
    full = xp.zeros((2, rp, kp), dtype=parts.dtype)
    full[:, :rows, :cols] = parts.reshape(2, rows, cols)
    return xp.ascontiguousarray(chunked(xp, full.reshape(2 * rp, kp), TILE, TILE))


def tile_weight(xp, weight):
    """(N, K) float32 -> flat fp16: [W_hi; W_lo] in fp16 parts (split_products.stack_split), each padded to whole
    tiles and tiled (the caller checks the range first)."""
    N, K = weight.shape
    if xp is np:
        hi, lo = split_fp16(np.asarray(weight, np.float32))
        parts = np.stack([hi, lo]).astype(np.float16)
    else:
        parts = split_into(xp, xp.ascontiguousarray(weight, dtype=xp.float32),
                           xp.empty((2, N, K), dtype=xp.float16), "fp16")
    return tiled(xp, parts, N, K)


def tiled_operand(xp, R: int, K: int, poison: bool):
    """A step operand's copy in tiles: (2, Rp, Kp) fp16 (the shape of its padded parts; the elements in tile order).
    Zeros past R and K (K's padding is multiplied by the weight's zeros, so it must not be NaN); poison: the rest
    NaN bit patterns (0xFFFF)."""
    rp, kp = padded(R), padded(K)
    copy = xp.zeros((2, rp, kp), dtype=xp.float16)
    if poison:
        marks = xp.zeros((2, rp, kp), dtype=xp.uint16)
        marks[:, :R, :K] = 0xFFFF
        copy.view(xp.uint16).ravel()[...] = chunked(xp, marks.reshape(2 * rp, kp), TILE, TILE)
    return copy


def tile_split_into(xp, source, copy, flag):
    """source (R, K) float32, C-contiguous -> its fp16 parts in tiles, into `copy` (tiled_operand's; its padding left
    as it is), on the current stream, nothing allocated (a captured run does this); flag (a uint32 device array of
    one) set where a value is past fp16's range. What the kernels write as they store h (kernels/split_products.cu
    split_tiles_fp16; the initial states' copies are made this way)."""
    R, K = source.shape
    file_entry(xp, "split_products.cu", "split_tiles_fp16")((round_blocks(xp, R * K),), (FOLD_THREADS,),
                                                           (source, copy, np.int32(R), np.int32(K), flag))
    return copy


def stages(cupy, blocks: int) -> int:
    """Slots of the ring: 2 where the grid has more blocks than the GPU has SMs (65 KB a block, so three fit an SM
    and the grid is one wave), else 4. On an H200 (2026-11-28): blogA LSTM (160 blocks) 35.8 us with 2 slots against
    50.7 with 4; its GRU (120) 27.0 with 4 against 30.2; `large` (128) 12.6 with either."""
    return 2 if blocks > cupy.cuda.Device().attributes["MultiProcessorCount"] else 4


def smem_bytes(slots: int) -> int:
    """The ring, its barriers after it, and the slack that aligns it to 1024 bytes."""
    return slots * STAGE_BYTES + 8 * slots + 1024


def kernel_source() -> str:
    """kernels/x3_wgmma.cu with the helpers it needs inlined before it (NVRTC gets no include path)."""
    helpers = "".join(helper_source(name) for name in ("tile_gemm.cuh", "mma_gemm.cuh", "wgmma.cuh"))
    return helpers + (KERNELS_DIR / "x3_wgmma.cu").read_text()


_functions: dict = {}        # (slots, device) -> the loaded kernel


def promoted_product(cupy, operand, weight, out, R: int, K: int, N: int, promote: int = PROMOTE) -> None:
    """out (R, N) float32, C-contiguous = float32x3's product of the tiled operand parts (tiled_operand) and the tiled
    weight (tile_weight), on the current stream. promote: columns of one promoted accumulator (a multiple of 64)."""
    rp, np_, kp = padded(R), padded(N), padded(K)
    grid = (np_ // TILE, rp // TILE)
    slots = stages(cupy, grid[0] * grid[1])
    key = (slots, cupy.cuda.Device().id)
    if key not in _functions:
        function = load_module(kernel_source(), kernel="x3_wgmma").get_function(f"x3_wgmma_{slots}")
        function.max_dynamic_shared_size_bytes = smem_bytes(slots)
        _functions[key] = function
    _functions[key](grid, (THREADS,), (operand, weight, out, np.int32(R), np.int32(N), np.int32(rp), np.int32(np_),
                                       np.int32(kp), np.int32(max(1, promote // TILE)), np.float32(1 / LO_SCALE["fp16"])),
                    shared_mem=smem_bytes(slots))


def promoted_numpy(h, w, promote: int = PROMOTE):
    """What the kernel computes, in float64 sums of its fp16 parts: h (R, K) and w (N, K) float32 split
    (engine.rounding.split_fp16), the big product over K in groups of `promote` columns each summed apart and added in
    order, the small products over K whole, divided by 2^11."""
    (h_hi, h_lo), (w_hi, w_lo) = (tuple(p.astype(np.float64) for p in split_fp16(np.asarray(a, np.float32)))
                                  for a in (h, w))
    K = h_hi.shape[1]
    big = sum(h_hi[:, k:k + promote] @ w_hi[:, k:k + promote].T for k in range(0, K, promote))
    return (h_lo @ w_hi.T + h_hi @ w_lo.T) / LO_SCALE["fp16"] + big
