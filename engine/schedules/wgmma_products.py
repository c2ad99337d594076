"""The fused backend's step products on the engine's own Hopper kernels: float32x3 in fp16 parts (kernels/x3_wgmma.cu:
each K chunk's tensor-core accumulator promoted into an fp32 sum in registers, no P to write and fold) and the
reduced modes tf32, fp16 and bf16 (kernels/mode_wgmma.cu: one accumulator over K, as cuBLAS's).

    weight = tile_weight(cupy, w)                          # (N, K) fp32 -> [W_hi; W_lo] fp16 in 8 KB tiles
    copy = tiled_operand(cupy, R, K, poison=False)         # what the kernels write h's parts into (the copies)
    promoted_product(cupy, copy, weight, out, R, K, N)     # out (R, N) = h @ W^T, float32x3's product
    weight = tile_mode_weight(cupy, w, "bfloat16")         # a reduced mode's: its rounded weight in tiles
    mode_product(cupy, tiled_mode_operand(cupy, R, K, "bfloat16", False), weight, out, R, K, N, "bfloat16")

A tile is 64 rows x 128 bytes (64 columns of a 16-bit type, 32 of tf32), in wgmma's 128-byte swizzle already
(kernels/tile_gemm.cuh rnn_tile_at, base.chunked), so one block of 64 batch rows x 64 weight rows streams its K
chunks through a ring of slots that one thread fills with bulk copies (kernels/tile_ring.cuh): the weights are
tiled at upload, a step operand by the kernels that write it (engine/codegen/operand_copies.py), rows and columns
padded with zeros. The cuBLAS path (split_products.py) keeps float32x3's truncating accumulation short by a strided
batch of K chunks, each a plane of P (R x N floats) written and read again by the fold. Measured on an H200
(2026-11-28, benchmarks/probe_x3_promote.py, the product alone in a chain of 50): `large` LSTM (R = 128, K = 1024,
N = 4096) 12.4 us (10.1 with two warpgroups a block, x3_kernel) against cuBLAS's batch and fold's 18.5, at a smaller
error (2.1e-7 against 3.5e-7, norm-relative to float64); blogA LSTM (R = 64, K = 2560, N = 10240) 35.5 us against
53.7. The same kernel with per-thread cp.async copies of row-major operands took 33 us at `large`: the tiles' bulk
copies are what make it fast.

A bf16 or fp16 weight past what the L2 keeps (goes_wide: blogA's LSTM, 52 MB) goes to kernels/mode_wide.cu instead:
a block of 128 weight rows against one chunk of h (h crosses L2 once per 128 rows, not per 64), clusters of two
blocks splitting K (the partial sums added over distributed shared memory), the weight's first 57 % of the L2
(36 MB of an H200's 60 MiB) evict_last so that part stays on chip across steps. blogA's LSTM product took 14.4 us
there against cublasLt's 17.1 and mode_wgmma's 19.0 (H200, 2026-11-28, benchmarks/probe_mode_stream.py); where the
weight stays in L2 cublasLt is faster (blogA's GRU, 39 MB: 8.7 us against 11.0).

Where they run: sm_90 (wgmma). float32x3 in fp16 parts takes its kernel by default (step_product "auto"); the
reduced modes take theirs where asked (step_product="wgmma"; fused_modes.FusedModeProgram). "auto" keeps cuBLAS for
them: whole runs at blogA gained nothing on mode_wide.cu (LSTM bf16 6.17 ms against cublasLt's 6.15) and the GRU lost
13-17 % on mode_wgmma.cu (H200, 2026-11-28, benchmarks/probe_wide_product.py).
"""
from __future__ import annotations

import numpy as np

from ..codegen.cuda import device_attribute, file_entry, kernel_file_source, round_blocks
from ..rounding import split_fp16
from .base import chunked
from .project import operand_dtype, round_into
from .split_products import FOLD_THREADS, LO_SCALE, stack_split

TILE = 64                    # rows of a tile, and its columns of a 16-bit type (8 KB)
TILE_BYTES = 8192
MODE_BYTES = {"tf32": 4, "float16": 2, "bfloat16": 2}   # a reduced mode's operand element
# Columns of one promoted accumulator: one chunk. On an H200 (2026-11-28, probe_x3_promote.py) the time did not depend
# on it (128, 256, 512 within 1 %) and the error fell with it (2.1e-7 at `large` for 128, 3.5e-7 for 256); with 128
# the LSTM at `lat`, T = 1000, had 2.03x cuDNN fp32's error (issue #34's bound: 2x), so every chunk is promoted.
PROMOTE = 64
STEP_PRODUCTS = ("auto", "wgmma", "cublaslt")
# kernels/mode_wide.cu for a 16-bit weight past STREAMED of the L2 the GPU reports (an H200 reports 60 MiB, of which
# buffers up to ~45 MB stayed resident across steps: probe_l2_resident.py): WIDE weight tiles a block, blocks a cluster
# splitting K, slots; the weight's first KEPT of the L2 evict_last (36 MB measured best: probe_mode_stream.py)
WIDE_MODES = ("bfloat16", "float16")
WIDE = (2, 2, 4)
STREAMED, KEPT = 0.72, 0.57
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
    """Whether the current GPU runs these kernels: sm_90 (H100, H200), whose wgmma they issue."""
    return cupy.cuda.Device().compute_capability == "90"


def resolve_product(product: str, precision: str, parts, splitk, capable: bool) -> str:
    """step_product as it runs: "cublaslt" where asked or off sm_90 (capable); float32x3 takes "wgmma" where asked
    or left to "auto" with fp16 parts and no cublasLt split-K (after a fallback to TF32 parts it gives way); a
    reduced mode takes it where asked (fused_modes.check_step_product refuses "wgmma" where it cannot run)."""
    if product == "cublaslt" or not capable:
        return "cublaslt"
    if precision == "float32x3":
        return "wgmma" if parts == "fp16" and splitk is False else "cublaslt"
    return "wgmma" if product == "wgmma" else "cublaslt"


def goes_wide(cupy, precision: str, N: int, K: int) -> bool:
    """Whether a step product of an (N, K) weight runs on mode_wide.cu: bf16 or fp16, the weight's tiles past what the
    current GPU's L2 keeps across steps (STREAMED of it) and under 4 GiB (the kernel's L2 policy takes 32-bit sizes),
    whole blocks of WIDE[0] tiles."""
    tiles = padded(N) // TILE
    nbytes = tiles * TILE * padded(K) * 2
    return (precision in WIDE_MODES and tiles % WIDE[0] == 0 and nbytes < 1 << 32
            and nbytes > STREAMED * device_attribute(cupy, "L2CacheSize"))


def tile_columns(size: int) -> int:
    """Columns of a tile of `size`-byte elements."""
    return 128 // size


def tiled(xp, parts, rows: int, cols: int):
    """parts (n, rows, cols), or one (rows, cols), of 2- or 4-byte elements -> flat, each padded with zeros to whole
    tiles and laid out as the kernels read them (base.chunked: blocks of 64 rows, each as tiles of 64 rows x 128
    bytes, 16-byte groups swizzled)."""
    size = parts.dtype.itemsize
    columns = tile_columns(size)
    rp, kp = padded(rows), -(-cols // columns) * columns
    full = xp.zeros((parts.size // (rows * cols), rp, kp), dtype=parts.dtype)
    full[:, :rows, :cols] = parts.reshape(-1, rows, cols)
    return xp.ascontiguousarray(chunked(xp, full.reshape(-1, kp), TILE, columns, 16 // size))


def tile_weight(xp, weight):
    """(N, K) float32 -> flat fp16: [W_hi; W_lo] in fp16 parts (split_products.stack_split), each padded to whole
    tiles and tiled (the caller checks the range first)."""
    return tiled(xp, stack_split(xp, weight, "fp16"), *weight.shape)


def tiled_buffer(xp, n: int, R: int, K: int, dtype, poison: bool):
    """n tiled matrices (R, K) of `dtype`, (n, Rp, Kp) (their padded shape; the elements in tile order): zeros, and
    with poison NaN bit patterns where values go (a NaN in K's padding would reach every output through the weight's
    zeros, so the padding stays zero)."""
    columns = tile_columns(np.dtype(dtype).itemsize)
    shape = (n, padded(R), -(-K // columns) * columns)
    if not poison:
        return xp.zeros(shape, dtype=dtype)
    bits = xp.uint16 if np.dtype(dtype).itemsize == 2 else xp.uint32
    marks = xp.full((n, R, K), 0xFFFF if bits is xp.uint16 else 0x7FC00000, dtype=bits)
    return tiled(xp, marks, R, K).view(dtype).reshape(shape)


def tiled_operand(xp, R: int, K: int, poison: bool):
    """A step operand's copy in tiles: (2, Rp, Kp) fp16 parts (tiled_buffer)."""
    return tiled_buffer(xp, 2, R, K, xp.float16, poison)


def tile_split_into(xp, source, copy, flag):
    """source (R, K) float32, C-contiguous -> its fp16 parts in tiles, into `copy` (tiled_operand's; its padding left
    as it is), on the current stream, nothing allocated (a captured run does this); flag (a uint32 device array of
    one) set where a value is past fp16's range. What the kernels write as they store h (kernels/tiles.cu
    split_tiles_fp16; the initial states' copies are made this way)."""
    R, K = source.shape
    file_entry(xp, "tiles.cu", "split_tiles_fp16")((round_blocks(xp, R * K),), (FOLD_THREADS,),
                                                  (source, copy, np.int32(R), np.int32(K), flag))
    return copy


def stages(cupy, blocks: int) -> int:
    """float32x3's ring slots for the one-warpgroup kernel: 2 where the grid has more blocks than the GPU has SMs
    (65 KB a block, so three fit an SM and the grid is one wave), else 4. On an H200 (2026-11-28): blogA LSTM (160
    blocks) 35.5 us with 2 slots against 52.8 with 4; its GRU (120) 26.6 with 4 against 30.5; `large` (128) 12.4-12.6
    with either."""
    return 2 if blocks > device_attribute(cupy, "MultiProcessorCount") else 4


PAIR_SLOTS = 2               # the two-warpgroup kernel's ring slots, each warpgroup's (3: within 1 %, 2026-11-28)


def x3_kernel(cupy, blocks: int, promote: int) -> tuple[str, int, int]:
    """float32x3's kernel for a grid of `blocks` and `promote` columns an accumulator: (entry, threads, shared bytes).
    Where the grid fits the SMs once and every chunk is promoted, two warpgroups a block split the chunks
    (x3_wgmma_pair_2, one block an SM: the MMA of one runs while the other waits); else one warpgroup with `stages`
    slots. On an H200 (2026-11-28, probe_x3_promote.py --pair): `large` LSTM (128 blocks) 10.1 us against 12.7, its
    GRU (96) 9.7 against 12.2, blogA GRU (120) 23.8 against 27.0, at a smaller error; blogA LSTM (160 blocks, more
    than the SMs) 42.2 against 36.0, so it keeps one warpgroup."""
    if promote == TILE and blocks <= device_attribute(cupy, "MultiProcessorCount"):
        return f"x3_wgmma_pair_{PAIR_SLOTS}", 2 * THREADS, 2 * smem_bytes(PAIR_SLOTS)
    slots = stages(cupy, blocks)
    return f"x3_wgmma_{slots}", THREADS, smem_bytes(slots)


def mode_stages(cupy, blocks: int) -> int:
    """A reduced mode's ring slots (16 KB each): 4 where blocks outnumber SMs (three blocks an SM), else 8."""
    return 4 if blocks > device_attribute(cupy, "MultiProcessorCount") else 8


def smem_bytes(slots: int, tiles: int = 4) -> int:
    """A ring of `slots` slots of `tiles` tiles, its barriers after it, and the slack that aligns it to 1024 bytes
    (kernels/tile_ring.cuh RNN_TILE_RING_BYTES)."""
    return slots * tiles * TILE_BYTES + 8 * slots + 1024


# the ring kernels' includes, and what some of them use besides (distributed shared memory and cluster barriers, a
# grid-wide counter's acquire load)
RING_HELPERS = ("tile_gemm.cuh", "mma_gemm.cuh", "wgmma.cuh", "mode_mma.cuh", "tile_ring.cuh")
FILE_HELPERS = {"mode_wide.cu": RING_HELPERS + ("cluster_sync.cuh",),
                "mode_stream.cu": RING_HELPERS + ("cluster_sync.cuh",),
                "mode_persist.cu": RING_HELPERS + ("layer_sync.cuh", "wgmma_ss.cuh")}


def kernel_source(filename: str = "x3_wgmma.cu") -> str:
    """kernels/<filename> with the helpers it needs inlined before it (NVRTC gets no include path)."""
    return kernel_file_source(filename, FILE_HELPERS.get(filename, RING_HELPERS))


def ring_kernel(cupy, filename: str, name: str, smem: int):
    """Entry `name` of kernels/<filename> (kernel_source) on the current device, its shared memory opted in
    (codegen.cuda.file_entry: loaded once a process and device)."""
    return file_entry(cupy, filename, name, FILE_HELPERS.get(filename, RING_HELPERS), smem)


def promoted_product(cupy, operand, weight, out, R: int, K: int, N: int, promote: int = PROMOTE) -> None:
    """out (R, N) float32, C-contiguous = float32x3's product of the tiled operand parts (tiled_operand) and the tiled
    weight (tile_weight), on the current stream. promote: columns of one promoted accumulator (a multiple of 64)."""
    rp, np_, kp = padded(R), padded(N), padded(K)
    grid = (np_ // TILE, rp // TILE)
    name, threads, smem = x3_kernel(cupy, grid[0] * grid[1], promote)
    function = ring_kernel(cupy, "x3_wgmma.cu", name, smem)
    function(grid, (threads,), (operand, weight, out, np.int32(R), np.int32(N), np.int32(rp), np.int32(np_),
                                np.int32(kp), np.int32(max(1, promote // TILE)), np.float32(1 / LO_SCALE["fp16"])),
             shared_mem=smem)


def promoted_numpy(h, w, promote: int = PROMOTE):
    """What the kernel computes, in float64 sums of its fp16 parts: h (R, K) and w (N, K) float32 split
    (engine.rounding.split_fp16), the big product over K in groups of `promote` columns each summed apart and added in
    order, the small products over K whole, divided by 2^11."""
    (h_hi, h_lo), (w_hi, w_lo) = (tuple(p.astype(np.float64) for p in split_fp16(np.asarray(a, np.float32)))
                                  for a in (h, w))
    K = h_hi.shape[1]
    big = sum(h_hi[:, k:k + promote] @ w_hi[:, k:k + promote].T for k in range(0, K, promote))
    return (h_lo @ w_hi.T + h_hi @ w_lo.T) / LO_SCALE["fp16"] + big


# ---- the reduced modes (kernels/mode_wgmma.cu) ------------------------------------------------------------------


def tile_mode_weight(xp, weight, precision: str):
    """(N, K) float32 -> flat: rounded to the mode's format (project.round_into: tf32 values in fp32, fp16, bf16
    bits) and tiled."""
    N, K = weight.shape
    source = xp.ascontiguousarray(weight, dtype=xp.float32)
    return tiled(xp, round_into(xp, source, xp.empty((N, K), dtype=operand_dtype(xp, precision)), precision), N, K)


def tiled_mode_operand(xp, R: int, K: int, precision: str, poison: bool):
    """A step operand's copy in a reduced mode, in tiles: (Rp, Kp) of the mode's operand type (tiled_buffer)."""
    return tiled_buffer(xp, 1, R, K, operand_dtype(xp, precision), poison)[0]


def round_tiles_into(xp, source, copy, precision: str):
    """source (R, K) float32, C-contiguous -> rounded to the mode, in tiles, into `copy` (tiled_mode_operand's; its
    padding left as it is), on the current stream, nothing allocated: what the kernels' copies write (kernels/tiles.cu
    round_tiles_*; the initial states' copies are made this way)."""
    R, K = source.shape
    file_entry(xp, "tiles.cu", f"round_tiles_{precision}")((round_blocks(xp, R * K),), (FOLD_THREADS,),
                                                         (source, copy, np.int32(R), np.int32(K)))
    return copy


def mode_product(cupy, operand, weight, out, R: int, K: int, N: int, precision: str) -> None:
    """out (R, N) float32, C-contiguous = the tiled operand (tiled_mode_operand) times the tiled weight
    (tile_mode_weight)^T in a reduced mode, on the current stream: mode_wide.cu for a 16-bit weight past the L2
    (goes_wide), else mode_wgmma.cu."""
    if goes_wide(cupy, precision, N, K):
        wide_product(cupy, operand, weight, out, R, K, N, precision)
        return
    columns = tile_columns(MODE_BYTES[precision])
    rp, np_ = padded(R), padded(N)
    grid = (np_ // TILE, rp // TILE)
    slots = mode_stages(cupy, grid[0] * grid[1])
    function = ring_kernel(cupy, "mode_wgmma.cu", f"mode_wgmma_{precision}_{slots}", smem_bytes(slots, 2))
    function(grid, (THREADS,), (operand, weight, out, np.int32(R), np.int32(N), np.int32(rp), np.int32(np_),
                                np.int32(-(-K // columns))), shared_mem=smem_bytes(slots, 2))


def wide_product(cupy, operand, weight, out, R: int, K: int, N: int, precision: str, shape: tuple = WIDE,
                 kept: int | None = None) -> None:
    """mode_product's product on kernels/mode_wide.cu (bf16, fp16): shape (weight tiles a block, blocks a cluster
    splitting K, slots: an entry the file has; the tiles must make whole blocks), the weight's first `kept` bytes
    evict_last (None: KEPT of the L2; 0: plain copies)."""
    tiles, split, slots = shape
    smem = slots * (tiles + 1) * TILE_BYTES + 16 * slots + 1024
    function = ring_kernel(cupy, "mode_wide.cu", f"mode_wide_{precision}_{tiles}_{split}_{slots}", smem)
    if kept is None:
        kept = min(weight.nbytes, int(KEPT * device_attribute(cupy, "L2CacheSize")))
    function((padded(N) // TILE // tiles * split, padded(R) // TILE), (THREADS + 32,),
             (operand, weight, out, np.int32(R), np.int32(N), np.int32(padded(K) // TILE), np.uint32(kept),
              np.uint32(weight.nbytes)), shared_mem=smem)
