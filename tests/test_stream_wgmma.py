"""TileConfig(stream_wgmma=True) (engine/schedules/stream.py, kernels/wgmma_stream.cuh): a stage's step GEMMs on
wgmma with the weights streamed and fed by two warps. Where the tiling takes it, what the generated source calls,
what it refuses with a named reason, and that nvcc compiles it for sm_90a. The numbers against the reference:
tests/gpu/test_precision_gpu.py (BULK_CASES, "wgmma stream")."""
from __future__ import annotations

import shutil

import pytest
from nvcc_check import compile_sources

import engine
from engine.codegen.wavefront import render_wavefront
from engine.compiler import make_plan
from engine.errors import CompileError
from engine.schedules.report import staging_text
from engine.schedules.stream import STREAM_THREADS, stream_scratch
from engine.schedules.tiling import H100, DeviceLimits, TileConfig, make_tiling


def case(preset="lstm", sizes=(64, 128, 2), batch=40, precision="bfloat16"):
    network = engine.Network(engine.preset(preset).cell, input_size=sizes[0], hidden_size=sizes[1],
                             num_layers=sizes[2])
    return network, make_plan(network, 5, batch, layout="interleaved", precision=precision).program


@pytest.mark.parametrize("preset,units,n", [("lstm", 32, 128), ("gru", 32, 96), ("lstm", 16, 64), ("lstm", None, 64)])
def test_the_tiling_streams_every_weight_into_a_wgmma_of_the_blocks_columns(preset, units, n):
    network, program = case(preset, (2560, 2560, 1), 64) if units == 32 else case(preset, (512, 512, 1), 16)
    batch = 64 if units == 32 else 16
    tiling = make_tiling(program, network, batch, TileConfig(units_per_block=units, stream_wgmma=True), H100)
    assert tiling.bulk and tiling.stream_n == n and tiling.config.threads == STREAM_THREADS
    assert not any(g.resident for g in tiling.gemms) and tiling.k_chunk == 64 and tiling.nc_streamed <= n
    assert tiling.stages == 8 and f"STAGES = {tiling.stages}" in render_wavefront(program, network, tiling)
    assert tiling.smem_bytes == (tiling.scratch_offset + stream_scratch(n, 8)) * 4 <= H100.smem_per_block
    source = render_wavefront(program, network, tiling)
    assert f"constexpr int STREAM_N = {n};" in source and "rnn_mma_gemms<RNN" not in source
    call = "rnn_stream_gemms<RNN_BF16, STREAM_N, STAGES, STREAM_AHEAD>(jobs, B, smem + SCRATCH, NC_STREAMED, W_KEEP);"
    assert call in source
    assert "    rnn_stream_init<STAGES>(smem + SCRATCH);" in source and "rnn_bulk_init<" not in source
    assert f"m64n{n}k16" in staging_text(tiling)
    default = make_tiling(program, network, batch, TileConfig(units_per_block=units), H100)
    assert default.stream_n == 0 and "rnn_stream_gemms<" not in render_wavefront(program, network, default)


@pytest.mark.parametrize("what,kwargs,config,hint", [
    ("batch", {"batch": 80}, TileConfig(stream_wgmma=True), "more than one wgmma tile of 64"),
    ("tf32", {"precision": "tf32"}, TileConfig(stream_wgmma=True), "bulk pipeline"),
    ("K = 96", {"sizes": (64, 96, 2)}, TileConfig(stream_wgmma=True), "bulk pipeline"),
    ("wide blocks", {"sizes": (512, 512, 1)}, TileConfig(units_per_block=40, stream_wgmma=True),
     "fewer units_per_block"),
    ("feed warp", {}, TileConfig(stream_wgmma=True, feed_warp=True), "feed warps of its own"),
    ("cluster", {}, TileConfig(stream_wgmma=True, sync="cluster"), "sync='cluster'"),
    ("a pipeline", {}, TileConfig(stream_wgmma=True, pipeline=(128, 2)), "chunks of 64 columns"),
    ("two slots", {}, TileConfig(stream_wgmma=True, pipeline=(64, 2)), "at least 4"),        # would deadlock
    ("three slots", {}, TileConfig(stream_wgmma=True, pipeline=(64, 3)), "an even count"),   # parity a phase early
])
def test_it_refuses_what_it_cannot_run_and_says_why(what, kwargs, config, hint):
    batch = kwargs.pop("batch", 40)
    network, program = case(batch=batch, **kwargs)
    with pytest.raises(CompileError, match="stream_wgmma") as caught:
        make_tiling(program, network, batch, config, H100)
    assert hint in str(caught.value), what


@pytest.mark.parametrize("limits", [DeviceLimits(108, 166912, "A100", "sm_80"), DeviceLimits(148, 232448, "B200",
                                                                                          "sm_100")])
def test_only_hopper_runs_it(limits):
    network, program = case()
    with pytest.raises(CompileError, match="wgmma is Hopper's"):
        make_tiling(program, network, 40, TileConfig(stream_wgmma=True), limits)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the CUDA is compiled there)")
def test_the_stream_sources_compile_for_sm90a(tmp_path):
    sources = {}
    for label, (preset, sizes, batch, precision, units) in {
            "lstm_bf16_blogA": ("lstm", (2560, 2560, 1), 64, "bfloat16", 32),
            "gru_fp16": ("gru", (512, 512, 1), 16, "float16", None),
            "lstm_two_layers": ("lstm", (64, 128, 2), 40, "bfloat16", None)}.items():
        network, program = case(preset, sizes, batch, precision)
        for persistent in (True, False):
            tiling = make_tiling(program, network, batch, TileConfig(units_per_block=units, stream_wgmma=True), H100,
                                 persistent=persistent)
            sources[f"{label}_{'persistent' if persistent else 'graph'}"] = render_wavefront(program, network, tiling)
    assert all("wgmma.mma_async" in source for source in sources.values())    # NVRTC's rule: sm_90a
    compile_sources(sources, tmp_path)


@pytest.mark.parametrize("preset,sizes,persistent,ahead", [
    ("lstm", (512, 512, 1), True, True),     # one stage of GEMMs a step: the next step's weight chunks staged early
    ("lstm", (64, 128, 2), True, True),      # two layers a launch, each block's calls alike
    ("lstm", (512, 512, 1), False, False),   # the graph schedule: a launch a stage, nothing to run ahead into
    ("ln_lstm", (512, 512, 1), True, False),   # reductions use the staging area between the calls
])
def test_the_weight_feed_runs_ahead_only_where_every_call_is_alike(preset, sizes, persistent, ahead):
    network, program = case(preset, sizes, 16)
    tiling = make_tiling(program, network, 16, TileConfig(stream_wgmma=True), H100, persistent=persistent)
    source = render_wavefront(program, network, tiling)
    assert f"constexpr bool STREAM_AHEAD = {str(ahead).lower()};" in source
    assert "rnn_stream_gemms<RNN_BF16, STREAM_N, STAGES, STREAM_AHEAD>(jobs" in source
    assert ("if constexpr (STREAM_AHEAD) rnn_stream_drain<STAGES>(smem + SCRATCH);" in source) == persistent
