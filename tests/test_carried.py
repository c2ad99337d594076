"""Values the persistent kernel carries in registers between the stages of a step (engine/codegen/carried.py): which
buffers, that the stage storing them writes carry[] and the later stages read it there, that a spill nothing else
reads is no longer stored while a buffer a reduction reads still is, and where nothing is carried (the graph
schedule's launch a stage, more elements than threads). The rendered kernel compiles with nvcc; its numbers are
checked on the GPU against the float64 reference by the schedule tests that run the persistent kernel."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import engine
from engine.codegen.carried import carried
from engine.codegen.wavefront import render_wavefront
from engine.compiler import make_plan
from engine.dense import wavefront_network
from engine.schedules.tiling import H100, TileConfig, make_tiling


def tiled(name, sizes, batch, persistent=True):
    I, H, L = sizes
    network = wavefront_network(engine.Network(engine.preset(name).cell, I, H, L))
    program = make_plan(network, 10, batch, layout="interleaved").program
    return network, program, make_tiling(program, network, batch, TileConfig(), H100, persistent=persistent)


def stage(source: str, number: int) -> str:
    start = source.index(f"void ln_lstm_stage_{number}(")
    return source[start:source.index("\n}\n", start)]


def test_the_layernorm_lstm_carries_stage_2s_values_to_stage_3_at_blogb(tmp_path):
    network, program, tiling = tiled("ln_lstm", (64, 256, 3), 64)
    assert tiling.batch * tiling.units_per_block <= tiling.config.threads
    carry = carried(program, tiling)
    spills = {b.name for b in program.buffers if b.role == "spill"}
    assert spills and spills <= set(carry)
    reduced = {g.in_buffer for g in program.gemms if g.name in program.reductions}
    assert reduced & set(carry)                                  # c_next: stage 3 reads it, the partials too
    source = render_wavefront(program, network, tiling)
    two, three = stage(source, 2), stage(source, 3)
    for name, index in carry.items():
        assert f"carry[{index}] = " in two, name
        assert re.search(rf"= carry\[{index}\];", three), name
        assert f"{name}[b * H + j]" not in three, name           # no load from global memory
    for name in spills:
        assert f"{name}[b * H + j] = " not in two, name          # a spill only stage 3 reads: not stored
    for name in reduced & set(carry):
        assert f"{name}[b * H + j] = " in two, name              # still stored for its reduction
    assert f"float carry[{len(carry)}];" in source
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the rendered kernel is not compile-checked here")
    path = tmp_path / "carried.cu"
    path.write_text(source)
    done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-Werror", "all-warnings", "-cubin", str(path), "-o",
                           str(tmp_path / "carried.cubin")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_nothing_is_carried_where_a_thread_has_several_elements_or_each_stage_is_a_launch():
    network, program, tiling = tiled("ln_lstm", (512, 512, 2), 64)          # mid: 64 rows x 16 units a block
    assert tiling.batch * tiling.units_per_block > tiling.config.threads
    assert carried(program, tiling) == {}
    assert "carry" not in render_wavefront(program, network, tiling)
    network, program, tiling = tiled("ln_lstm", (64, 256, 3), 64, persistent=False)
    assert carried(program, tiling) == {}
    network, program, tiling = tiled("lstm", (64, 256, 3), 64)                # one stage: nothing to carry
    assert carried(program, tiling) == {}
