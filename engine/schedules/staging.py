"""The sizes of a tiled GEMM's shared memory: rows of resident weights, the staged chunks of X and W, the split-K
sums, and how many warps a block's MMA tiles take (engine/schedules/tiling.py lays them out)."""
from __future__ import annotations

from ..codegen.precision import Precision
from ..plan import FLOAT_BYTES


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def row_stride(k: int) -> int:
    """Floats between rows of a shared-memory operand of k columns (rnn_row_stride in kernels/tile_gemm.cuh)."""
    return round_up(k, 4) + 4


def weight_stride(k: int, prec: Precision) -> int:
    """Elements between rows of a shared-memory weight of k columns (rnn_wstride<MODE> in kernels/tile_gemm.cuh)."""
    if prec.name == "float32":
        return row_stride(k)
    return round_up(k, 8) + 4 if prec.k_step == 8 else round_up(k, 16) + 8      # fp32 TF32 operands: tf32, float32x3


def weight_floats(rows: int, k: int, prec: Precision) -> int:
    """Floats of shared memory for `rows` rows of a weight of k columns (whole 16-byte units)."""
    return round_up(rows * weight_stride(k, prec) * prec.weight_bytes, 16) // FLOAT_BYTES


def x_stride(k_chunk: int, prec: Precision) -> int:
    """Elements (floats, or 16-bit values for fp16 / bf16) between rows of a staged X chunk: mma_gemm.cuh rnn_xstride."""
    return round_up(k_chunk, 8) + 4 if prec.k_step == 8 else round_up(k_chunk, 16) + 8


def mma_scratch(bp: int, nc_streamed: int, k_chunk: int, stages: int, threads: int, tile: int, reduce: bool,
                prec: Precision, bulk: bool = False) -> int:
    """Floats of staging rnn_mma_gemms needs (kernels/mma_gemm.cuh): 128 bytes of barriers, then per stage an X
    chunk and a W chunk when some weight is streamed (rows of k_chunk elements in the bulk pipeline, padded rows
    otherwise); then the split-K partial sums."""
    x_bytes = 4 if prec.k_step == 8 else prec.weight_bytes
    if bulk:
        slot = (bp + nc_streamed) * k_chunk * x_bytes // FLOAT_BYTES
    else:
        slot = bp * x_stride(k_chunk, prec) * x_bytes // FLOAT_BYTES + weight_floats(nc_streamed, k_chunk, prec)
    return 32 + stages * slot + (threads * tile if reduce else 0)


BULK_CHUNK = 64          # the bulk pipeline copies chunks of a multiple of 64 columns (kernels/mma_gemm.cuh)


def mma_warps(groups: int) -> int:
    """Warps of a block whose widest GEMM has `groups` warp tiles: at least 8 (two per scheduler), K split among
    them when the tiles are fewer, at most 16."""
    if groups >= 8:
        return min(16, groups)
    return min(16, groups * -(-8 // groups))


def tile_scratch(bp: int, nc_streamed: int, k_chunk: int, stages: int, threads: int, tile: int, reduce: bool) -> int:
    """Floats of staging rnn_tile_gemms needs (kernels/tile_gemm.cuh): `stages` slots of an X chunk and, when
    some weight is streamed, a W chunk; then, when some GEMM splits K, its partial sums, 16 values of a tile at a
    time (rnn_store_tile)."""
    return stages * (bp + nc_streamed) * row_stride(k_chunk) + (threads * min(tile, 16) if reduce else 0)
