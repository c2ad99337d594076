"""The wavefront schedules (engine/schedules) without a GPU: tilings, generated source, nvcc, the autotune cache.

Structural claims only, on behaviour meant to outlive the kernels' internals:
- tiling: every hidden unit has a block and the last block is not empty; a persistent launch fits on
  the device's multiprocessors; shared memory fits, and resident weight slices do not overlap; a
  tiling that cannot fit, a bad TileConfig field and an ineligible program are refused with a
  CompileError that says where and what to do next;
- source: every preset renders in both modes, with the entry points entry_points() names, one
  LayerArgs slot per layer_fields() entry (the host packs one int64 per field), and a header that
  names the cell and its equations; under the `nvcc` marker it all compiles with warnings as errors;
- cache: write/read round trip under $CELLFORGE_CACHE_DIR, keys that separate what they must, a corrupt
  file moved aside and reported, two processes writing at once, and the candidates the tuner times.

The GPU side (numbers against the reference, the tuner's timing) is tests/gpu/test_schedules.py.
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import shutil
import subprocess
import time
from multiprocessing.pool import ThreadPool

import numpy as np
import pytest
from compiler_cells import CELLS
from nvcc_check import nvcc_command

import engine
from engine.codegen import text_equations
from engine.codegen.layer_args import HALF_SUFFIX, half_copies, layer_fields
from engine.codegen.wavefront import entry_points, render_wavefront, stages
from engine.compiler import compile_program, make_plan
from engine.dense import wavefront_network
from engine.errors import CompileError
from engine.schedules import autotune
from engine.schedules.report import staging_text
from engine.schedules.tiling import H100, DeviceLimits, TileConfig, eligibility, make_tiling

# Every preset the wavefront schedules take: not LSTMP (values of size P), refused by name in test_projection.py.
PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)
MODES = {"persistent": True, "graph": False}
FLOAT_BYTES = 4                                     # shared memory holds float32
# A small made-up GPU: few SMs and little shared memory, so that the refusals are reachable.
SMALL = DeviceLimits(multiprocessors=8, smem_per_block=100 * 1024, name="small test GPU", arch="sm_90")

HIDDEN_SIZES = (13, 64, 512)
LAYER_COUNTS = (1, 3)
BATCHES = (1, 7, 64)
INPUT_SIZE = 29                                     # odd: K is not a multiple of 4 in layer 0
CONFIGS = (
    TileConfig(),                                                          # the default: blocks from the SM count
    TileConfig(units_per_block=1, rows_per_thread=1, cols_per_thread=4, threads=64),   # as many blocks as units
    TileConfig(units_per_block=8, rows_per_thread=2, cols_per_thread=8, threads=128),
    TileConfig(units_per_block=64, rows_per_thread=8, cols_per_thread=4, threads=512),
    TileConfig(rows_per_thread=4, cols_per_thread=4, resident=False),      # weights streamed
    TileConfig(units_per_block=512, rows_per_thread=8, cols_per_thread=8, threads=512),  # one fat block a layer
)


def interleaved_program(cell):
    """The program the schedules run (base.py plans with layout='interleaved'); sizes do not change it."""
    network = engine.Network(cell, input_size=INPUT_SIZE, hidden_size=16)
    return make_plan(network, 4, 2, layout="interleaved").program


# ---- tiling ---------------------------------------------------------------------------------------

def check_tiling(tiling, program, network, batch, config, limits, persistent, where):
    H, L = network.hidden_size, network.num_layers
    units, per_layer = tiling.units_per_block, tiling.blocks_per_layer
    assert units >= 1 and per_layer >= 1, where
    assert per_layer * units >= H, f"{where}: units {H - per_layer * units} have no block"
    assert (per_layer - 1) * units < H, f"{where}: the last block of a layer owns no unit"
    group = tiling.num_layers                  # layers a launch: all of them, or a divisor (persistent only)
    assert tiling.blocks == per_layer * group and tiling.launches * group == L, where
    assert group == L or persistent, f"{where}: the graph schedule runs every layer in one wavefront"
    assert (tiling.network_layers, tiling.batch, tiling.hidden, tiling.persistent) == (L, batch, H, persistent), where
    if persistent:
        assert tiling.blocks <= limits.multiprocessors, f"{where}: a cooperative launch needs every block resident"
    assert 0 <= tiling.smem_bytes <= limits.smem_per_block, where

    gemm_names = {g.name for g in program.gemms}
    tiled = {t.name for t in tiling.gemms}
    assert tiled <= gemm_names, where
    recurrent = {g.name for g in program.gemms if not g.hoisted}
    assert recurrent - set(program.reductions) <= tiled, f"{where}: a recurrent GEMM has no tile"
    assert not tiled & set(program.reductions), f"{where}: a reduction (row sums) got a GEMM tile"
    if group > 1:
        assert {g.name for g in program.hoisted_gemms} <= tiled, f"{where}: layers project in the kernel"
    else:
        assert not tiling.layer0_in_kernel, f"{where}: one layer a launch projects with cuBLAS before it"

    if not (persistent and config.resident):
        assert not tiling.resident, f"{where}: weights resident without a persistent, resident tiling"
    ranges = sorted((t.smem_offset, t.smem_offset + t.resident_floats) for t in tiling.gemms if t.resident)
    assert all(0 <= start < end for start, end in ranges), f"{where}: {ranges}"
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        assert end <= start, f"{where}: resident weight slices overlap: {ranges}"
    if ranges:
        assert ranges[-1][1] * FLOAT_BYTES <= tiling.smem_bytes, f"{where}: resident slices run past smem"
        assert ranges[-1][1] <= tiling.scratch_offset, f"{where}: resident slices run into the staging area"
    assert f"{tiling.blocks} blocks" in tiling.describe(), where


@pytest.mark.parametrize("name", PRESETS)
def test_tilings_keep_their_invariants_or_refuse_with_a_hint(name):
    program = interleaved_program(engine.preset(name).cell)
    built = refused = 0
    for H in HIDDEN_SIZES:
        for L in LAYER_COUNTS:
            network = engine.Network(program.source_cell, input_size=INPUT_SIZE, hidden_size=H, num_layers=L)
            for B in BATCHES:
                for config in CONFIGS:
                    for mode, persistent in MODES.items():
                        for limits in (H100, SMALL):
                            where = f"{name} {mode} H={H} L={L} B={B} {config.label()} on {limits.name}"
                            try:
                                tiling = make_tiling(program, network, B, config, limits, persistent=persistent)
                            except CompileError as e:
                                message = str(e)
                                assert "hint:" in message, f"{where}: {message}"
                                assert ("shared memory" in message
                                        or (persistent and "multiprocessors" in message)), f"{where}: {message}"
                                assert not (limits is H100 and config == TileConfig()), \
                                    f"{where}: the default tiling must fit an H100: {message}"
                                refused += 1
                                continue
                            check_tiling(tiling, program, network, B, config, limits, persistent, where)
                            built += 1
    assert built and refused, (built, refused)


@pytest.mark.parametrize("name,cols,tile", [("lstm", 64, (8, 8)), ("gru", 48, (8, 4))])
def test_stacked_float32_gemms_get_wide_tiles_and_stay_in_one_launch(name, cols, tile):
    """`mid` (512 units, 4 layers, B=64): 8x8 tiles for the LSTM's 64 columns a block, 8x4 for the GRU's 48 (measured
    faster than 4x4 and than 8x8 respectively, benchmarks/NOTES.md), their split-K sums in rounds (16 KiB at 256
    threads), so the four layers stay one launch with the recurrent weights resident. Narrow blocks, small batches
    and the tensor-core modes keep 4x4 (or their own tiles)."""
    program = interleaved_program(engine.preset(name).cell)
    mid = engine.Network(program.source_cell, input_size=512, hidden_size=512, num_layers=4)
    tiling = make_tiling(program, mid, 64, TileConfig(), H100)
    assert (tiling.config.rows_per_thread, tiling.config.cols_per_thread) == tile
    assert tiling.launches == 1 and "h_gemm" in tiling.resident and tiling.units_per_block * len(
        next(g for g in program.gemms if g.name == "h_gemm").terms) == cols
    assert tiling.smem_bytes <= H100.smem_per_block and f"{tile[0]}x{tile[1]} accumulators" in tiling.describe()
    blog_b = engine.Network(program.source_cell, input_size=64, hidden_size=256, num_layers=3)
    one_layer = engine.Network(program.source_cell, input_size=512, hidden_size=512, num_layers=1)
    for network, batch in ((blog_b, 64), (one_layer, 64), (mid, 32)):
        tiling = make_tiling(program, network, batch, TileConfig(), H100)
        assert (tiling.config.rows_per_thread, tiling.config.cols_per_thread) == (4, 4), (network, batch)
    for precision in ("tf32", "bfloat16"):
        reduced = compile_program(engine.preset(name).cell, layout="interleaved", precision=precision)
        tiling = make_tiling(reduced, mid, 64, TileConfig(), H100)
        assert tiling.mma and "tensor-core MMA" in tiling.describe()
    chosen = make_tiling(program, mid, 64, TileConfig(rows_per_thread=4, cols_per_thread=4), H100)
    assert (chosen.config.rows_per_thread, chosen.config.cols_per_thread) == (4, 4)      # a named tile stays
    assert TileConfig().label().startswith("units=auto tile=auto")


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_one_layer_launches_of_wide_blocks_get_8x4_tiles(name):
    """`large` (1024 units, 2 layers, B=128: layer by layer) and `blogA` (2560 units, one layer, B=64): 8x4 tiles,
    measured 3-11% faster than 4x4 for the LSTM and the GRU on an H100 (and than 8x8 or 4x8); the projections stay
    cuBLAS GEMMs before each launch."""
    program = interleaved_program(engine.preset(name).cell)
    large = engine.Network(program.source_cell, input_size=1024, hidden_size=1024, num_layers=2)
    blog_a = engine.Network(program.source_cell, input_size=2560, hidden_size=2560, num_layers=1)
    for network, batch in ((large, 128), (blog_a, 64)):
        tiling = make_tiling(program, network, batch, TileConfig(), H100)
        assert tiling.num_layers == 1 and not tiling.layer0_in_kernel, network
        assert (tiling.config.rows_per_thread, tiling.config.cols_per_thread) == (8, 4), network
        assert tiling.smem_bytes <= H100.smem_per_block and "8x4 accumulators" in tiling.describe()


@pytest.mark.parametrize("hidden,layers,threads", [(512, 2, 128), (2560, 1, 256)])
def test_the_warp_gemv_takes_four_warps_unless_its_columns_are_many(hidden, layers, threads):
    """`lat` (512 units, 2 layers, B=1: 8 units, 32 LSTM columns a block): 128 threads, 8 columns a warp (faster for
    every preset on an H100); 2560 units in one layer (20 units, 80 columns): 256, so a warp's accumulators stay few."""
    program = interleaved_program(engine.preset("lstm").cell)
    network = engine.Network(program.source_cell, input_size=hidden, hidden_size=hidden, num_layers=layers)
    tiling = make_tiling(program, network, 1, TileConfig(), H100)
    assert tiling.path == "gemv" and tiling.config.threads == threads
    assert make_tiling(program, network, 1, TileConfig(threads=256), H100).config.threads == 256   # a named count stays


def lstm_program_and_network(hidden_size, num_layers):
    program = interleaved_program(engine.preset("lstm").cell)
    network = engine.Network(program.source_cell, input_size=INPUT_SIZE, hidden_size=hidden_size,
                             num_layers=num_layers)
    return program, network


def test_persistent_refuses_more_blocks_than_multiprocessors_and_graph_does_not():
    program, network = lstm_program_and_network(512, 3)
    config = TileConfig(units_per_block=1)
    with pytest.raises(CompileError) as caught:
        make_tiling(program, network, 4, config, SMALL, persistent=True)
    message = str(caught.value)
    assert "multiprocessors" in message and SMALL.name in message
    assert "hint:" in message and "units_per_block" in message
    # One launch per stage needs no block to wait for another: any number of blocks will do.
    tiling = make_tiling(program, network, 4, config, SMALL, persistent=False)
    assert tiling.blocks > SMALL.multiprocessors


@pytest.mark.parametrize("mode", MODES)
def test_a_tiling_that_cannot_fit_in_shared_memory_is_refused_with_a_hint(mode):
    # 64 batch rows over one block of all 512 units (2048 GEMM columns), 512 threads of 8x8 tiles.
    program, network = lstm_program_and_network(512, 1)
    config = TileConfig(units_per_block=512, rows_per_thread=8, cols_per_thread=8, threads=512, resident=False)
    with pytest.raises(CompileError) as caught:
        make_tiling(program, network, 64, config, SMALL, persistent=MODES[mode])
    message = str(caught.value)
    assert "shared memory" in message and SMALL.name in message and "hint:" in message


BAD_CONFIGS = [
    ("rows_per_thread", 3), ("rows_per_thread", 0), ("cols_per_thread", 16), ("threads", 100), ("threads", 0),
    ("units_per_block", 0), ("units_per_block", -4), ("units_per_block", 2.5),
    ("pipeline", (48, 4)), ("pipeline", (64, 9)),
]


@pytest.mark.parametrize("field,value", BAD_CONFIGS, ids=[f"{f}={v}" for f, v in BAD_CONFIGS])
def test_bad_tile_config_values_are_refused_by_field(field, value):
    program, network = lstm_program_and_network(64, 2)
    with pytest.raises(CompileError, match=re.escape(field)):
        make_tiling(program, network, 4, TileConfig(**{field: value}))


def test_a_named_pipeline_is_the_one_laid_out_and_the_bulk_pipeline_refuses_chunks_it_cannot_copy():
    program, network = lstm_program_and_network(256, 2)
    for pipeline in ((64, 2), (128, 3), (32, 4)):
        tiling = make_tiling(program, network, 64, TileConfig(pipeline=pipeline))
        assert (tiling.k_chunk, tiling.stages) == pipeline
        assert f"pipeline={pipeline[0]}x{pipeline[1]}" in tiling.config.label()
    network = engine.Network(program.source_cell, input_size=128, hidden_size=256, num_layers=2)   # K: whole chunks
    bf16 = make_plan(network, 17, 64, layout="interleaved", precision="bfloat16").program
    assert make_tiling(bf16, network, 64, TileConfig(pipeline=(128, 2))).bulk
    with pytest.raises(CompileError, match=r"TileConfig.pipeline=\(32, 4\).*multiple of 64"):
        make_tiling(bf16, network, 64, TileConfig(pipeline=(32, 4)))


def test_every_preset_is_eligible_in_the_interleaved_layout():
    for name in PRESETS:
        assert eligibility(interleaved_program(engine.preset(name).cell)) is None, name


INELIGIBLE = {
    "blocked layout": (lambda: compile_program(engine.preset("lstm").cell, layout="blocked"), "interleaved"),
    "input-sized GEMM": (lambda: compile_program(CELLS["input_sized"], layout="interleaved"), "size I"),
    "hoist_inputs off": (lambda: compile_program(engine.preset("gru").cell, {"hoist_inputs": False},
                                                 layout="interleaved"), "(B, I)"),
}


@pytest.mark.parametrize("case", INELIGIBLE)
def test_ineligible_programs_say_why_and_do_not_tile(case):
    build, words = INELIGIBLE[case]
    program = build()
    why = eligibility(program)
    assert why is not None and words in why, why
    network = engine.Network(program.source_cell, input_size=INPUT_SIZE, hidden_size=32, num_layers=2)
    with pytest.raises(CompileError) as caught:
        make_tiling(program, network, 4)
    assert why in str(caught.value) and f"'{program.cell.name}'" in str(caught.value)


# ---- generated source -----------------------------------------------------------------------------

# Every preset at one odd shape; three presets that differ in structure (one stage, two stages, no
# recurrent GEMM) also at a second shape with another batch, one layer and streamed weights.
# The reduced precisions (engine.codegen.precision): the warp GEMV with rounded operands (B=3), the tensor-core
# MMA with resident weights (B=19, two stages, layer 0 in the kernel) and with streamed 16-bit weights.
SOURCE_CASES = [(name, 37, 129, 2, 3, TileConfig()) for name in PRESETS] + [
    (name, 64, 96, 1, 19, TileConfig(rows_per_thread=8, cols_per_thread=4, resident=False))
    for name in ("lstm", "gru_cho", "indrnn")] + [
    ("lstm", 37, 129, 2, 3, TileConfig(), "tf32"),
    ("gru_cho", 45, 150, 2, 19, TileConfig(), "float16"),
    ("lstm", 64, 96, 1, 19, TileConfig(resident=False), "bfloat16"),
    ("lstm", 64, 128, 2, 19, TileConfig(), "bfloat16"),                    # the bulk pipeline: K a multiple of 64
    ("gru", 128, 64, 2, 40, TileConfig(resident=False), "float16")]


# Per-layer arrival counters instead of grid barriers (TileConfig(sync="layer"), the persistent schedule only): the
# warp GEMV, a two-stage cell on register tiles, bf16 on the bulk pipeline.
LAYER_SYNC_CASES = [("lstm", 37, 129, 3, 3, TileConfig(sync="layer")),
                    ("gru_cho", 45, 150, 2, 19, TileConfig(sync="layer")),
                    ("lstm", 64, 128, 2, 19, TileConfig(sync="layer"), "bfloat16")]


def render(name, input_size, hidden_size, num_layers, batch, config, persistent, precision="float32"):
    cell = engine.preset(name).cell            # a cell of heads (slstm) takes the next multiple of its heads
    network = wavefront_network(engine.Network(cell, input_size=input_size, hidden_size=cell.fit_size(hidden_size),
                                               num_layers=num_layers))       # as the schedules compile it
    program = make_plan(network, 17, batch, layout="interleaved", precision=precision).program
    tiling = make_tiling(program, network, batch, config, H100, persistent=persistent)
    return program, render_wavefront(program, network, tiling), tiling


def case_id(case, mode):
    name, I, H, L, B = case[:5]
    precision = f"-{case[6]}" if len(case) > 6 else ""
    sync = "-layersync" if case[5].sync == "layer" else ""
    return f"{name}-{mode}-I{I}-H{H}-L{L}-B{B}{precision}{sync}"


ALL_SOURCES = ([(case, mode) for case in SOURCE_CASES for mode in MODES]
               + [(case, "persistent") for case in LAYER_SYNC_CASES])
# What nvcc compiles on the CPU machine: every source but the per-preset ones, which take one mode each, the two
# modes by turns (a preset's math is the same in both; the mode's own code is compiled by the presets of that mode).
# Every preset runs in both modes, compiled by NVRTC, in the GPU suite (tests/gpu/test_schedules.py).
NVCC_SOURCES = [(case, mode) for case, mode in ALL_SOURCES
                if case not in SOURCE_CASES[:len(PRESETS)] or mode == list(MODES)[SOURCE_CASES.index(case) % 2]]


def layer_args_slots(source: str) -> list[str]:
    """The 8-byte slots of `struct LayerArgs`, in order; an array field `name[n]` is n slots."""
    assert source.count("struct LayerArgs {") == 1
    body = source.split("struct LayerArgs {", 1)[1].split("};", 1)[0]
    slots = []
    for line in body.splitlines():
        code = line.split("//", 1)[0].strip()
        if not code:
            continue
        match = re.fullmatch(r"(.+?)\b(\w+)\s*(?:\[(\d+)\])?\s*;", code)
        assert match, f"not a field declaration: {line!r}"
        kind = match.group(1)
        assert "*" in kind or "long long" in kind or "int64_t" in kind, f"not 8 bytes: {line!r}"
        slots += [match.group(2)] * int(match.group(3) or 1)
    return slots


def kernel_entries(source: str) -> dict[str, str]:
    """Each __global__ function's name -> its declaration line."""
    found = {}
    for line in source.splitlines():
        if "__global__" in line and not line.lstrip().startswith("//"):
            match = re.search(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", line)
            assert match, line
            found[match.group(1)] = line
    return found


@pytest.mark.parametrize("name,layers", [("lstm", 2), ("gru_cho", 1), ("gru", 3)])
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_16_bit_gemms_read_the_copy_the_cell_code_writes(name, layers, precision):
    """On the fp16 / bf16 tensor-core path every GEMM X is a 16-bit copy, and every store to a copied buffer
    writes the copy too (else a GEMM would read a stale or poisoned copy)."""
    program, source, tiling = render(name, 40, 72, layers, 19, TileConfig(), True, precision)
    halves = half_copies(program, tiling)
    assert tiling.mma and halves
    recurrent = {g.in_buffer for g in program.gemms if not g.hoisted}
    assert recurrent <= set(halves)
    assert (program.input_buffer in halves) == (layers > 1)       # projections in the kernel read the layer input
    mode = "RNN_FP16" if precision == "float16" else "RNN_BF16"
    tables = source.split(f"const RnnMmaJob<{mode}> jobs[")[1:]
    jobs = [x for table in tables for x in re.findall(r"\{(L\.\w+)", table.split("};", 1)[0])]
    assert tables and len(jobs) >= len(tables) and all(x.endswith(HALF_SUFFIX) for x in jobs), jobs
    stored = re.findall(r"^\s*(\w+)\[[^\]]+\] = (\w+);$", source, re.M)
    for kernel in program.kernels:
        for store in kernel.stores:
            param = next(p for p in kernel.params if p.name == store.access.param)
            if param.source in halves:
                line = f"{param.name}{HALF_SUFFIX}["
                assert any(line in ln and f"rnn_bits16<{mode}>({store.var})" in ln for ln in source.splitlines()), \
                    (kernel.name, store)
    assert stored                                              # the fp32 stores are still there


@pytest.mark.parametrize("precision,sizes,limits,bulk", [
    ("bfloat16", (64, 128), H100, True),
    ("float16", (128, 192), H100, True),
    ("bfloat16", (64, 96), H100, False),                       # K = 96: not whole chunks of 64
    ("bfloat16", (64, 128), DeviceLimits(108, 166912, "A100", "sm_80"), False),   # no bulk copies before sm_90
    ("tf32", (64, 128), H100, False),                          # X stays fp32: no chunked copy to stage
])
def test_the_bulk_pipeline_needs_16_bits_sm90_and_whole_chunks(precision, sizes, limits, bulk):
    network = engine.Network(engine.preset("lstm").cell, input_size=sizes[0], hidden_size=sizes[1], num_layers=2)
    program = make_plan(network, 5, 19, layout="interleaved", precision=precision).program
    tiling = make_tiling(program, network, 19, TileConfig(), limits)
    assert tiling.bulk == bulk and ("bulk copies" in tiling.describe()) == bulk
    if bulk:
        assert tiling.k_chunk % 64 == 0 and all(sizes[i] % tiling.k_chunk == 0 for i in (0, 1))
    source = render_wavefront(program, network, tiling)
    assert f"constexpr bool BULK = {str(bulk).lower()};" in source
    assert ("rnn_chunked<K_CHUNK>(" in source.split("struct LayerArgs")[1]) == bulk   # the twin stores
    # The barriers are set up once per launch, in every entry point, before any stage runs.
    for persistent in (True, False):
        tiled = make_tiling(program, network, 19, TileConfig(), limits, persistent=persistent)
        text = render_wavefront(program, network, tiled)
        entries = len(kernel_entries(text))
        assert text.count("    rnn_bulk_init<STAGES, PRODUCER_WARPS>(smem + SCRATCH);") == (entries if bulk else 0)
    # The bulk pipeline's feed warp: one warp past the MMA warps, counted in the block's threads (kernels/mma_gemm.cuh
    # rnn_mma_gemms, PW), asked for with TileConfig(feed_warp=True); by default thread 0 feeds it between its MMAs.
    fed = make_tiling(program, network, 19, TileConfig(feed_warp=True), limits)
    assert fed.producer_warps == int(bulk) and tiling.producer_warps == 0
    assert fed.config.threads == tiling.config.threads + 32 * int(bulk)
    assert "constexpr int PRODUCER_WARPS = 0;" in source
    assert f"constexpr int PRODUCER_WARPS = {int(bulk)};" in render_wavefront(program, network, fed)
    assert (("a warp of its own" in staging_text(fed)) == bulk and "a warp of its own" not in staging_text(tiling)
            and ("thread 0 moves" in staging_text(tiling)) == bulk)
    given = make_tiling(program, network, 19, TileConfig(threads=64, feed_warp=True), limits)   # one MMA warp's room
    assert given.producer_warps == 0 and given.config.threads == 64


def test_the_chunked_layout_is_rnn_chunked_and_keeps_bank_groups_apart():
    from engine.schedules.base import chunked, chunked_weight
    rows, block, cols, kc = 3 * 19, 19, 192, 64
    values = np.arange(rows * cols).reshape(rows, cols)
    flat = chunked(np, values, block, kc)
    # Element (r, k) sits where kernels/mma_gemm.cuh rnn_chunked puts it.
    r, k = np.arange(rows)[:, None], np.arange(cols)[None, :]
    b, w = r % block, k % kc
    where = ((r // block * (cols // kc) + k // kc) * block + b) * kc + (((w >> 3) ^ (b & 7)) << 3) + (w & 7)
    assert np.array_equal(flat[where], values)
    # A chunk of a row block is contiguous: block i, chunk c holds exactly its block x kc elements.
    start = (1 * (cols // kc) + 2) * block * kc
    chunk = values[block:2 * block, 2 * kc:3 * kc].ravel()
    assert sorted(flat[start:start + block * kc].tolist()) == sorted(chunk.tolist())
    # Eight consecutive rows' copies of one 16-byte group land in eight different 16-byte groups of a 128-byte line.
    for g in range(kc // 8):
        assert sorted((where[i, g * 8] % 64) // 8 for i in range(8)) == list(range(8))
    bits = np.arange(1, 10 * 128 + 1, dtype=np.uint16).reshape(10, 128)
    weight = chunked_weight(bits, 4, 3, 8, 64)                  # 3 blocks of 4 rows, padded to 8 rows each
    padded = np.zeros((24, 128), dtype=np.uint16)
    for i in range(3):
        padded[i * 8:i * 8 + len(bits[i * 4:i * 4 + 4])] = bits[i * 4:i * 4 + 4]
    assert np.array_equal(weight, chunked(np, padded, 8, 64)) and np.count_nonzero(weight) == bits.size


@pytest.mark.parametrize("precision,batch", [("float32", 19), ("tf32", 19), ("bfloat16", 3)])
def test_fp32_tf32_and_the_gemv_path_keep_no_16_bit_copies(precision, batch):
    program, source, tiling = render("lstm", 40, 72, 2, batch, TileConfig(), True, precision)
    assert half_copies(program, tiling) == () and HALF_SUFFIX not in source


@pytest.mark.parametrize("case,mode", ALL_SOURCES, ids=[case_id(c, m) for c, m in ALL_SOURCES])
def test_wavefront_source_has_entry_points_struct_and_header(case, mode):
    name = case[0]
    program, source, tiling = render(*case[:6], MODES[mode], *case[6:])

    names = entry_points(program)
    wanted = {names["persistent"]} if mode == "persistent" else set(names["wave"])
    assert len(names["wave"]) == len(stages(program)) >= 1
    entries = kernel_entries(source)
    assert set(entries) == wanted, f"{mode} source defines {sorted(entries)}, entry_points() says {sorted(wanted)}"
    for line in entries.values():
        assert 'extern "C"' in line, f"CuPy looks kernels up by their unmangled name: {line}"

    assert layer_args_slots(source) == [f.name for f in layer_fields(program, tiling)]

    leading = []
    for line in source.splitlines():
        if not line.startswith("//"):
            break
        leading.append(line)
    header = "\n".join(leading)
    assert f"'{name}'" in header, f"the header does not name cell '{name}':\n{header}"
    for equation in text_equations(program.cell):
        assert equation in header, f"equation {equation!r} missing from the header"


@pytest.mark.nvcc
def test_every_wavefront_source_compiles_with_nvcc(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    jobs = []
    for case, mode in NVCC_SOURCES:
        label = case_id(case, mode)
        _, source, _ = render(*case[:6], MODES[mode], *case[6:])
        path = tmp_path / f"{label}.cu"
        path.write_text(source)
        jobs.append((label, nvcc_command(path, tmp_path / f"{label}.cubin")))

    def compile_one(job):
        label, cmd = job
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        return label, done.returncode, done.stdout

    with ThreadPool(os.cpu_count() or 2) as pool:
        results = pool.map(compile_one, jobs)
    failed = [(label, output) for label, code, output in results if code != 0]
    assert not failed, (f"nvcc failed on {len(failed)} of {len(jobs)} sources ({tmp_path}): "
                        + ", ".join(label for label, _ in failed) + "\n\nfirst failure, "
                        + f"{failed[0][0]}:\n{failed[0][1][-4000:]}")


# ---- the autotune cache ---------------------------------------------------------------------------

@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    return tmp_path


def lstm_network(input_size=32, hidden_size=64, num_layers=2, name="lstm"):
    return engine.Network(engine.preset(name).cell, input_size=input_size, hidden_size=hidden_size,
                          num_layers=num_layers)


def test_cache_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path / "nested" / "dir"))
    assert autotune.cache_path() == tmp_path / "nested" / "dir" / "autotune.json"
    monkeypatch.delenv("CELLFORGE_CACHE_DIR")
    assert autotune.cache_path().name == "autotune.json" and "cellforge" in autotune.cache_path().parts


def test_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path / "not" / "yet"))   # created on first write
    assert autotune.read_cache() == {}
    key = autotune.cache_key(lstm_network(), 17, 3, "test GPU")
    timings = [{"candidate": "fused", "ms": 1.5}, {"candidate": "graph", "error": "did not compile"}]
    persistent = autotune.Choice("persistent", TileConfig(16, 2, 8, threads=128), "fastest", key, timings)
    fused = autotune.Choice("fused", None, "only one", "other")
    autotune.write_entry(key, persistent)
    autotune.write_entry("other", fused)

    on_disk = json.loads(autotune.cache_path().read_text())
    assert on_disk["version"] == autotune.CACHE_VERSION and set(on_disk["entries"]) == {key, "other"}
    entries = autotune.read_cache()
    back = autotune.Choice.from_dict(key, entries[key])
    assert back.cached and not persistent.cached
    assert (back.schedule, back.config, back.why, back.key, back.timings) == (
        "persistent", persistent.config, "fastest", key, timings)
    again = autotune.Choice.from_dict("other", entries["other"])
    assert (again.schedule, again.config) == ("fused", None)
    # Writing a key again replaces its entry and keeps the others.
    autotune.write_entry(key, fused)
    entries = autotune.read_cache()
    assert entries[key]["schedule"] == "fused" and "other" in entries
    assert not list(autotune.cache_path().parent.glob("*.tmp")), "a temporary file was left behind"


def test_cache_key_separates_sizes_steps_batch_device_precision_and_cell():
    base = dict(network=lstm_network(), steps=17, batch=3, device="NVIDIA H100", precision="float32")
    variants = {
        "base": {},
        "input size": {"network": lstm_network(input_size=33)},
        "hidden size": {"network": lstm_network(hidden_size=65)},
        "layers": {"network": lstm_network(num_layers=3)},
        "cell": {"network": lstm_network(name="gru")},
        "steps": {"steps": 18},
        "batch": {"batch": 4},
        "device": {"device": "NVIDIA H200"},
        "precision": {"precision": "float16"},
        "another precision": {"precision": "bfloat16"},
    }
    keys = {what: autotune.cache_key(**(base | change)) for what, change in variants.items()}
    assert len(set(keys.values())) == len(keys), keys
    assert autotune.cache_key(**base) == keys["base"], "the key is not deterministic"


CORRUPT = {
    "not json": b"{not json",
    "truncated": b'{"version": 1, "entries": {"k": {"sched',
    "not utf-8": b"\xff\xfe\x00garbage",
    "a list": b"[1, 2]",
    "null": b"null",
    "old version": json.dumps({"version": -1, "entries": {}}).encode(),
    "entries not a dict": json.dumps({"version": autotune.CACHE_VERSION, "entries": [1]}).encode(),
}


@pytest.mark.parametrize("what", CORRUPT)
def test_a_corrupt_cache_is_moved_aside_reported_and_rebuilt(cache_dir, caplog, what):
    path = autotune.cache_path()
    path.write_bytes(CORRUPT[what])
    with caplog.at_level(logging.WARNING, logger="engine.autotune"):
        assert autotune.read_cache() == {}
    (aside,) = cache_dir.glob("autotune.json.corrupt-*")
    assert aside.read_bytes() == CORRUPT[what] and not path.exists()
    assert str(path) in caplog.text and aside.name in caplog.text, caplog.text
    # The next write starts a fresh, valid file.
    autotune.write_entry("k", autotune.Choice("fused", None, "why", "k"))
    assert set(autotune.read_cache()) == {"k"}


def test_two_corrupt_files_in_a_row_are_both_kept(cache_dir, caplog):
    path = autotune.cache_path()
    for text in ("{first", "{second"):
        path.write_text(text)
        with caplog.at_level(logging.WARNING, logger="engine.autotune"):
            assert autotune.read_cache() == {}
    kept = sorted(p.read_text() for p in cache_dir.glob("autotune.json.corrupt-*"))
    assert kept == ["{first", "{second"], "the second corrupt file replaced the first one moved aside"


def write_many(tag: str, count: int, barrier) -> None:
    """One process of the concurrency test: `count` entries under keys tag-0 .. tag-(count-1)."""
    barrier.wait()
    for i in range(count):
        key = f"{tag}-{i}"
        autotune.write_entry(key, autotune.Choice("fused", None, f"write {i} of {tag}", key))


def test_two_processes_writing_at_once_leave_a_valid_file_with_every_key(cache_dir):
    context = multiprocessing.get_context("spawn")        # fresh interpreters, as two separate tuning runs
    barrier = context.Barrier(2)
    count = 50
    writers = [context.Process(target=write_many, args=(tag, count, barrier)) for tag in ("a", "b")]
    for writer in writers:
        writer.start()
    # Meanwhile read without the lock, as tune() does: the atomic replace means no read sees half a file.
    deadline = time.monotonic() + 120
    while any(w.is_alive() for w in writers) and time.monotonic() < deadline:
        autotune.read_cache()
    for writer in writers:
        writer.join(timeout=max(1.0, deadline - time.monotonic()))
        assert writer.exitcode == 0, f"writer exited with {writer.exitcode}"
    data = json.loads(autotune.cache_path().read_text())
    expected = {f"{tag}-{i}" for tag in ("a", "b") for i in range(count)}
    assert set(data["entries"]) == expected, f"lost updates: {sorted(expected - set(data['entries']))}"
    assert not list(cache_dir.glob("autotune.json.corrupt-*")), "a reader saw a partly written file"
    assert not list(cache_dir.glob("*.tmp")), "a temporary file was left behind"


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_candidates_of_an_eligible_program_start_with_fused_and_can_all_be_tiled(batch):
    network = lstm_network(hidden_size=256, num_layers=2)
    found = autotune.candidates(network, batch, H100)
    assert found[0] == autotune.Candidate("fused")
    schedules = [c.schedule for c in found]
    assert "persistent" in schedules and "graph" in schedules
    assert len(set(found)) == len(found), "a candidate is timed twice"
    program = make_plan(network, 8, batch, layout="interleaved").program
    for candidate in found[1:]:
        assert candidate.config is not None, candidate
        tiling = make_tiling(program, network, batch, candidate.config, H100,
                             persistent=candidate.schedule == "persistent")
        assert tiling.blocks >= 1, candidate.label()


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_layer_sync_is_a_candidate_when_there_are_layers_to_synchronise(precision):
    def syncs(layers, batch=64):
        found = autotune.candidates(lstm_network(hidden_size=256, num_layers=layers), batch, H100, precision)
        return [c.config.sync for c in found if c.schedule == "persistent"]
    # the default (None: grid barriers at B=64, arrival counters at B=1) first, the other barrier once
    assert syncs(2)[0] is None and syncs(2).count("layer") == 1 and "grid" not in syncs(2)
    assert syncs(2, batch=1)[0] is None and syncs(2, batch=1).count("grid") == 1 and "layer" not in syncs(2, batch=1)
    # one layer: nothing to synchronise but the layer's own blocks; in bf16 a layer of 256 units is also a cluster
    assert set(syncs(1)) == ({None, "cluster"} if precision == "bfloat16" else {None})


@pytest.mark.parametrize("batch,layers,persistent,expected", [
    (1, 2, True, "layer"), (4, 3, True, "layer"),       # the warp GEMV, several layers a launch: arrival counters
    (1, 1, True, "grid"), (64, 2, True, "grid"),        # one layer, or register tiles: grid barriers
    (1, 2, False, "grid"),                              # the graph schedule has no barriers to choose
])
def test_the_default_barrier_follows_the_gemm_shape(batch, layers, persistent, expected):
    network = lstm_network(hidden_size=256, num_layers=layers)
    program = make_plan(network, 8, batch, layout="interleaved").program
    tiling = make_tiling(program, network, batch, TileConfig(), H100, persistent=persistent)
    assert tiling.config.sync == expected
    assert make_tiling(program, network, batch, TileConfig(sync="grid"), H100, persistent=persistent).config.sync == "grid"


def test_a_deep_stack_also_tries_half_its_layers_a_launch():
    network = lstm_network(hidden_size=512, num_layers=8)
    found = autotune.candidates(network, 64, H100)
    halves = [c for c in found if c.schedule == "persistent" and c.config.layers_per_launch == 4]
    assert len(halves) == 1
    program = make_plan(network, 8, 64, layout="interleaved").program
    tiling = make_tiling(program, network, 64, halves[0].config, H100, persistent=True)
    assert tiling.num_layers == 4 and tiling.launches == 2 and "weights resident" in tiling.describe()
    assert not [c for c in autotune.candidates(lstm_network(hidden_size=64, num_layers=3), 64, H100)
                if c.schedule == "persistent" and c.config.layers_per_launch not in (None, 1)]


def test_candidates_of_an_ineligible_program_are_only_fused():
    network = engine.Network(CELLS["input_sized"], input_size=24, hidden_size=32, num_layers=2)
    assert autotune.candidates(network, 8, H100) == [autotune.Candidate("fused")]


@pytest.mark.parametrize("case", LAYER_SYNC_CASES, ids=[case_id(c, "persistent") for c in LAYER_SYNC_CASES])
def test_layer_sync_waits_for_its_own_layer_and_the_one_below_only(case):
    program, source, tiling = render(*case[:6], True, *case[6:])
    entry = source[source.index('extern "C" __global__'):]
    assert "unsigned* __restrict__ arrivals" in entry.splitlines()[0]
    assert "grid.sync()" not in entry and "kernels/layer_sync.cuh (inlined)" in source
    S = len(stages(program))
    assert f"constexpr unsigned S = {S};" in entry and "for (int t = 0; t < T; ++t)" in entry
    assert "constexpr int HEADS = 1, BLOCKS_PER_HEAD = BLOCKS_PER_LAYER / HEADS;" in entry    # a counter a layer
    assert "unsigned* const own = arrivals + layer * HEADS + (blockIdx.x % BLOCKS_PER_LAYER) / BLOCKS_PER_HEAD;" in entry
    assert entry.count("rnn_arrive(own);") == S                              # one count per stage
    assert entry.count("rnn_wait_for(arrivals + (layer - 1) * HEADS + hd,") == 1     # the layer below: before the first
    for i in range(S):
        assert f"rnn_wait_for(own, BLOCKS_PER_HEAD * ((unsigned)t * S + {i}u));" in entry
    assert "by per-layer arrival counters" in tiling.describe() and tiling.config.label().endswith("sync=layer")


def test_layer_sync_is_for_the_persistent_schedule_and_says_its_values():
    with pytest.raises(CompileError, match="sync='layer' applies to the persistent schedule only"):
        render("lstm", 37, 129, 2, 3, TileConfig(sync="layer"), False)
    with pytest.raises(CompileError, match="TileConfig.sync='barrier' is not 'grid', 'layer', 'head' or 'cluster'"):
        render("lstm", 37, 129, 2, 3, TileConfig(sync="barrier"), True)


def test_layer_by_layer_kernels_warm_l2_with_the_step_rows_of_their_cublas_projections():
    _, source, tiling = render("lstm", 64, 256, 2, 64, TileConfig(layers_per_launch=1), True)
    assert tiling.num_layers == 1 and not tiling.layer0_in_kernel
    stage = source[source.index("void lstm_stage_1("):]
    assert stage.index("rnn_prefetch_l2(L.x_proj_out + ((long)t * B + r) * (4 * H) + (long)u0 * 4, 4 * tu);") < \
        stage.index("rnn_tile_gemms<"), "the prefetch goes out before the GEMMs it hides behind"
    _, together, tiling = render("lstm", 64, 256, 2, 64, TileConfig(), True)
    assert tiling.layer0_in_kernel and "rnn_prefetch_l2(L." not in together, "in-kernel projections are on chip"
