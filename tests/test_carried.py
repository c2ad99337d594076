"""Values the persistent kernel carries in registers between the stages of a step (engine/codegen/carried.py): which
buffers; that the stage storing them writes carry[] and the later stages read it there; that a state's store writes
carry[] and its global element, and the next step reads carry[] (the first step the initial state); that a spill
nothing else reads is no longer stored, nor one whose reduction reads it from shared memory, while one whose
reduction reads it from L2 still is; and where nothing is carried (the graph schedule's launch a stage, more
elements than threads). The rendered kernel compiles with nvcc; its numbers are checked on the GPU against the
float64 reference by the schedule tests that run the persistent kernel."""
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
        if program.buffer(name).double:                          # c_state: across steps (the next test)
            continue
        assert f"carry[{index}] = " in two, name
        assert re.search(rf"= carry\[{index}\];", three), name
        assert f"{name}[b * H + j]" not in three, name           # no load from global memory
    for name in spills:
        assert f"{name}[b * H + j] = " not in two, name          # a spill only stage 3 reads: not stored
    for name in reduced & set(carry):                             # its reduction's partials read shared memory
        assert f"{name}[b * H + j] = " not in two, name
        assert re.search(rf"\(smem \+ SCRATCH \+ \d+\)\[\(int\)b \* .*\] = {name.removesuffix('_gemm_in')};", two), name
    assert f"float carry[{len(carry)}];" in source
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the rendered kernel is not compile-checked here")
    path = tmp_path / "carried.cu"
    path.write_text(source)
    done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-Werror", "all-warnings", "-cubin", str(path), "-o",
                           str(tmp_path / "carried.cubin")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("name, sizes, batch, stage_number", [
    ("lstm", (64, 256, 3), 64, 1), ("ln_lstm", (64, 256, 3), 64, 2), ("gru_cho", (24, 40, 2), 3, 2)])
def test_a_state_passes_from_one_step_to_the_next_in_a_register(name, sizes, batch, stage_number):
    network, program, tiling = tiled(name, sizes, batch)
    carry = carried(program, tiling)
    states = [n for n in carry if program.buffer(n).double]
    assert states
    source = render_wavefront(program, network, tiling)
    for state in states:
        index = carry[state]
        loads = re.findall(rf"= \(t == 0 \? (\w+)\[b \* H \+ j\] : carry\[{index}\]\);", source)
        assert loads and set(loads) == {f"{state}_cur"}, state                 # step 0: the initial state
        assert f"{state}_cur[b * H + j];" not in source, state                 # no other load of it
        body = source[source.index(f"_stage_{stage_number}("):]
        body = body[:body.index("\n}\n")]
        store = body.index(f"{state}_next[b * H + j] = ")                     # stored for the final states ...
        assert re.search(rf"carry\[{index}\] = \w+;", body), state         # ... and carried to step t + 1
        assert store > max(m.start() for m in re.finditer(r"\(t == 0 \?", body)), state   # loaded before stored


def test_a_carried_value_whose_reduction_reads_l2_is_still_stored_there():
    network, program, tiling = tiled("ln_lstm", (24, 40, 2), 3)             # B = 3: the partials read L2
    carry = carried(program, tiling)
    reduced = {g.in_buffer for g in program.gemms if g.name in program.reductions} & set(carry)
    assert reduced
    two = stage(render_wavefront(program, network, tiling), 2)
    for name in reduced:
        assert f"carry[{carry[name]}] = " in two and f"{name}[b * H + j] = " in two, name


def test_nothing_is_carried_where_a_thread_has_several_elements_or_each_stage_is_a_launch():
    network, program, tiling = tiled("ln_lstm", (512, 512, 2), 64)          # mid: 64 rows x 16 units a block
    assert tiling.batch * tiling.units_per_block > tiling.config.threads
    assert carried(program, tiling) == {}
    assert "carry" not in render_wavefront(program, network, tiling)
    network, program, tiling = tiled("ln_lstm", (64, 256, 3), 64, persistent=False)
    assert carried(program, tiling) == {}
    network, program, tiling = tiled("lstm", (64, 256, 3), 64, persistent=False)   # nor the LSTM's c state
    assert carried(program, tiling) == {}


def test_the_schedule_report_says_what_the_kernel_keeps_in_registers():
    """explain_json's persistent tiling (the app's Schedule page) names the carried buffers in a sentence; the graph
    schedule and a kernel with more elements than threads keep nothing there."""
    from engine.explain import explain_json
    report = explain_json("ln_lstm", 64, 256, 3, 100, 64)["schedules"]
    tiling = report["persistent"]["tiling"]
    assert tiling["carried"] == list(carried(*tiled("ln_lstm", (64, 256, 3), 64)[1:]))
    assert "c_state (state) from one step to the next" in tiling["carried_text"]
    assert "i_rsqrt_tmp from the stage that computes them to the later stages" in tiling["carried_text"]
    assert "64 rows x 6 units <= 384 threads" in tiling["carried_text"]
    assert report["graph"]["tiling"]["carried"] == [] and report["graph"]["tiling"]["carried_text"] == ""
    mid = explain_json("ln_lstm", 512, 512, 2, 100, 64)["schedules"]["persistent"]["tiling"]
    assert mid["carried"] == [] and mid["carried_text"] == ""
    text = engine.explain("ln_lstm", 64, 256, 3, 100, 64, schedule="persistent")
    assert f"(16 floats); and {tiling['carried_text']}" in text                  # explain()'s registers line
