"""TileConfig(stream_wgmma=True): a stage's step GEMMs on warpgroup MMA with their weights streamed
(kernels/wgmma_stream.cuh rnn_stream_gemms), the one-launch layer's product (kernels/mode_persist.cu's duo feed) as
the persistent and graph schedules' routine. Opt-in: written before any GPU ran it (benchmarks/NOTES.md 2026-11-28
15:12 and 15:20, step ii); make_tiling calls prepare() on the config first and finish() on the tiling last.

Where it applies: fp16 / bf16 on sm_90 (the bulk pipeline's chunked operands), at most 64 batch rows (one wgmma M
tile), every weight streamed in chunks of 64 columns, and a block's widest GEMM at most 128 columns (m64nNk16 with
N = 64, 96 or 128). A block is 320 threads: two MMA warpgroups and two feed warps.
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import CompileError
from .staging import FLOAT_BYTES

STREAM_THREADS = 320          # kernels/wgmma_stream.cuh RNN_STREAM_THREADS
STREAM_N = (64, 96, 128)      # the wgmma widths kernels/wgmma_ss.cuh instantiates
STREAM_PIPELINE = (64, 4)     # a chunk is one wgmma K tile of 64 16-bit columns (the tiling's own pipeline table)
STREAM_STAGES = (8, 6, 4)     # the routine's slots, the most that fit (an even count of at least 4; at most 15)


def prepare(config):
    """The config the tiling lays out for this path: every weight streamed, 320 threads, chunks of 64 columns."""
    if config.sync == "cluster":
        raise CompileError("TileConfig.stream_wgmma=True streams the weights, and sync='cluster' keeps them in "
                           "registers; hint: one of the two")
    if config.feed_warp:
        raise CompileError("TileConfig.stream_wgmma=True has feed warps of its own; hint: leave feed_warp False")
    if config.pipeline is not None and tuple(config.pipeline) != STREAM_PIPELINE:    # (64, 4): prepared already
        raise CompileError(f"TileConfig.pipeline={config.pipeline!r}: stream_wgmma copies chunks of 64 columns into "
                           "4, 6 or 8 slots, the most that fit (an even count of at least 4: kernels/wgmma_stream.cuh); "
                           "hint: None")
    return replace(config, resident=False, threads=STREAM_THREADS, pipeline=STREAM_PIPELINE)


def stream_scratch(n: int, stages: int) -> int:
    """Floats of the routine's staging area: 256 bytes of barriers, up to 1 KB to a 1024-byte boundary, then `stages`
    slots of a 64-row X chunk and an n-row W chunk (128 bytes a row)."""
    return (256 + 1024 + stages * (64 + n) * 128) // FLOAT_BYTES


def finish(tiling):
    """The tiling with `stream_n` (the wgmma's N) and its shared memory for the routine, or a CompileError naming
    what keeps the path from applying."""
    why = None
    if tiling.limits.arch != "sm_90":
        why = f"wgmma is Hopper's (sm_90), and this is {tiling.limits.arch or 'an unknown GPU'}"
    elif not tiling.bulk:
        why = "it needs the bulk pipeline (fp16 / bf16 on sm_90, every K a multiple of 64)"
    elif tiling.batch > 64:
        why = f"{tiling.batch} batch rows are more than one wgmma tile of 64"
    elif any(g.resident for g in tiling.gemms):
        why = "some weight stays resident in shared memory"
    elif tiling.k_chunk != 64:
        why = f"its chunks are {tiling.k_chunk} columns, not 64"
    elif tiling.nc_streamed > STREAM_N[-1]:
        why = (f"a block's widest GEMM has {tiling.nc_streamed} columns, more than {STREAM_N[-1]}; hint: fewer "
               "units_per_block")
    if why:
        raise CompileError(f"TileConfig.stream_wgmma=True cannot run this tiling: {why}")
    n = next(n for n in STREAM_N if n >= tiling.nc_streamed)
    room = tiling.limits.smem_per_block // FLOAT_BYTES - tiling.scratch_offset
    stages = next((st for st in STREAM_STAGES if stream_scratch(n, st) <= room), None)
    if stages is None:
        need = (tiling.scratch_offset + stream_scratch(n, STREAM_STAGES[-1])) * FLOAT_BYTES
        raise CompileError(f"TileConfig.stream_wgmma=True needs {need} bytes of shared memory per block, more than "
                           f"the {tiling.limits.smem_per_block} of {tiling.limits.name}; hint: fewer units_per_block")
    smem = (tiling.scratch_offset + stream_scratch(n, stages)) * FLOAT_BYTES
    return replace(tiling, stream_n=n, stages=stages, smem_bytes=smem)
