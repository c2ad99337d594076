"""Reductions over the hidden units on the wavefront schedules (engine/codegen/reductions.py): the variance rewrite
(engine.dense.variance_form), the GEMMs of reductions that get no tile and no GEMM call, the deferred stages of the
state-free part (engine/passes/analysis.py), and the generated CUDA compiled by nvcc. The numbers themselves are
checked on the GPU against the float64 reference (tests/gpu/test_schedules.py, test_precision_gpu.py: every preset,
both schedules, every mode, bit-identical reruns)."""
from __future__ import annotations

import os
import shutil
import subprocess
from multiprocessing.pool import ThreadPool

import pytest
from test_schedules_cpu import nvcc_command

import engine
from engine.codegen.reductions import partial_stage, stage_shared, twins
from engine.codegen.wavefront import render_wavefront, stages
from engine.compiler import make_plan
from engine.dense import dense_form, variance_form, wavefront_network
from engine.dsl import W, b, cell, layer_norm, mean_h, sigmoid, sum_h, tanh
from engine.errors import CellGraphError
from engine.explain import dense_to_json
from engine.schedules.tiling import H100, TileConfig, make_tiling
from engine.serialize import from_dict, to_dict


def wave_program(name_or_cell, hidden=64, layers=2, batch=8, precision="float32", lengths=False):
    c = engine.preset(name_or_cell).cell if isinstance(name_or_cell, str) else name_or_cell
    network = wavefront_network(engine.Network(c, 16, c.fit_size(hidden), layers))
    return network, make_plan(network, 5, batch, layout="interleaved", precision=precision, lengths=lengths).program


def fixed_weights(c, op):
    return [n.name for n in c.nodes if n.op == "weight" and n.attr("fixed") == op]


def test_each_layer_norm_variance_becomes_one_reduction_beside_its_mean():
    for name, count in (("ln_lstm", 3), ("ln_gru", 2)):
        dense = dense_form(engine.preset(name).cell).cell
        rewritten = variance_form(dense)
        assert len(fixed_weights(rewritten, "var_h")) == count, name
        # every variance reads the values themselves now, not their squared deviations
        for n in rewritten.nodes:
            if n.op == "matmul" and rewritten[n.args[0]].attr("fixed") == "var_h":
                assert rewritten[n.args[1]].op != "mul", (name, n.name)
    plain = dense_form(engine.preset("lstm").cell).cell
    assert variance_form(plain) is plain


@cell
def off_centre(x, h):
    # the squared deviations are about the mean of another value: not a variance of v, so not rewritten
    v = W("W_v") @ x + W("R_v") @ h
    w = W("W_w") @ x
    d = v - mean_h(w)
    return {"h": tanh(v * mean_h(d * d) + b("b"))}


def test_a_mean_of_squares_about_another_values_mean_stays_two_reductions():
    dense = dense_form(off_centre).cell
    assert variance_form(dense) is dense


def test_reductions_get_no_tile_and_run_one_barrier_each():
    for name, expected in (("ln_lstm", (1, 2, 3)), ("ln_gru", (1, 2))):
        network, program = wave_program(name, batch=64)
        assert stages(program) == expected, name          # the input side's LayerNorm joins the recurrent stages
        assert program.reductions, name
        tiling = make_tiling(program, network, 64, TileConfig(), H100)
        assert not {t.name for t in tiling.gemms} & set(program.reductions)
        present = stages(program)
        for g in program.gemms:
            if g.name in program.reductions:
                assert partial_stage(program, g, present) == g.stage - 1, (name, g.name)
        source = render_wavefront(program, network, tiling)
        for g in program.gemms:
            if g.name in program.reductions:
                assert f"L.W_{g.name}" not in source, f"{name}: {g.name} multiplied by its fixed matrix"
                assert f"partials of {g.name}" in source


def test_the_other_presets_keep_their_stages():
    expected = {"lstm": (1,), "gru": (1,), "gru_cho": (1, 2), "mgu": (1, 2), "mingru": (0,), "indrnn": (0,),
                "slstm": (1,)}
    for name, want in expected.items():
        _, program = wave_program(name)
        assert stages(program) == want, name


@cell
def state_sum(x, h):
    # a reduction of the state itself: no earlier stage of the step stores it, so every block sums whole rows
    s = sum_h(h)
    return {"h": tanh(W("W") @ x + W("R") @ h + s * 0.01 + b("b"))}


@cell
def ln_small(x, h, c):
    z = layer_norm([W("W_i") @ x + W("R_i") @ h, W("W_g") @ x + W("R_g") @ h])
    i, g = sigmoid(z[0]), tanh(z[1])
    c_next = c + i * g
    return {"h": tanh(layer_norm(c_next)), "c": c_next}


def rendered(c, hidden, layers, batch, precision="float32", persistent=True, lengths=False):
    network, program = wave_program(c, hidden, layers, batch, precision, lengths)
    tiling = make_tiling(program, network, batch, TileConfig(), H100, persistent=persistent)
    return program, render_wavefront(program, network, tiling)


def test_a_reduction_of_a_state_sums_whole_rows():
    program, source = rendered(state_sum, 32, 1, 8)
    (name,) = program.reductions
    g = next(g for g in program.gemms if g.name == name)
    assert partial_stage(program, g, stages(program)) is None
    assert "the whole row" in source and f"partials of {name}" not in source


@pytest.mark.nvcc
def test_reduction_sources_compile_with_nvcc(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    cases = {"state_sum": (state_sum, 32, 1, 8, "float32"),            # whole rows
             "ln_small_gemv": (ln_small, 48, 2, 3, "float32"),          # warp GEMV, no staging area
             "ln_small_tiled": (ln_small, 40, 3, 24, "float32"),        # staged partials, a last block of fewer units
             "ln_lstm_bf16": ("ln_lstm", 64, 2, 19, "bfloat16"),        # tensor cores, the bulk pipeline's barriers
             "ln_gru_tf32": ("ln_gru", 48, 1, 64, "tf32"),
             # the values in shared memory (StageShared) in the graph schedule's stage kernels, and with lengths
             "ln_lstm_graph": ("ln_lstm", 64, 2, 24, "float32", {"persistent": False}),
             "ln_lstm_lengths": ("ln_lstm", 64, 2, 24, "float32", {"lengths": True}),
             "sum_beside": (sum_beside, 64, 1, 16, "float32")}                 # a sum_h twin beside a mean alone
    jobs = []
    for label, (c, hidden, layers, batch, precision, *options) in cases.items():
        _, source = rendered(c, hidden, layers, batch, precision, **(options[0] if options else {}))
        path = tmp_path / f"{label}.cu"
        path.write_text(source)
        jobs.append((label, nvcc_command(path, tmp_path / f"{label}.cubin")))

    def compile_one(job):
        label, cmd = job
        return label, subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    with ThreadPool(os.cpu_count() or 2) as pool:
        for label, done in pool.map(compile_one, jobs):
            assert done.returncode == 0, f"{label}:\n{done.stdout[-3000:]}"


def test_fixed_is_the_engines_own_attribute():
    data = to_dict(engine.preset("lstm").cell)
    weight = next(n for n in data["nodes"] if n["op"] == "weight")
    weight["attrs"]["fixed"] = "sum_h"
    with pytest.raises(CellGraphError, match="fixed") as info:
        from_dict(data)
    assert weight["name"] in str(info.value)
    dense = dense_form(engine.preset("ln_lstm").cell).cell
    assert fixed_weights(dense, "mean_h")            # the dense form marks its matrices
    bad = [n if n.op != "weight" or n.attr("fixed") is None else
           type(n)(n.name, n.op, n.args, tuple(sorted({**n.attr_dict, "fixed": "max_h"}.items()))) for n in dense.nodes]
    with pytest.raises(CellGraphError, match="attrs.fixed"):
        type(dense)(dense.name, tuple(bad), dense.states, dense.output, dense.doc, dense.input_is_hidden)


def test_explain_says_what_the_wavefront_schedules_run():
    network = engine.Network(engine.preset("ln_lstm").cell, 64, 256, 3)
    dense = dense_to_json(network, make_plan(network, 10, 64))
    assert dense["wavefront"] == {"reduction_terms": 6, "stages_per_step": 3}
    assert dense["stages_per_step"] == 5                  # backend 'fused' multiplies by the fixed matrices
    text = engine.explain_text(network, steps=10, batch=64, sources=False)
    assert "wavefront schedules: no GEMM; 6 row sum(s)" in text and "3 stage(s) a step" in text


def test_reduction_values_stay_in_shared_memory_where_nothing_else_reads_them():
    """On the tiled path the cell code writes a reduction's operands into the staging area where the block's
    partials read them, and the consumer writes each term's row value there once for the cell code: no round trip
    through L2. A buffer another stage loads from global memory is still written there too (ln_lstm's c_next, where
    stage 3 is a launch of its own; the persistent kernel carries it in a register); with no room, or on the warp-GEMV path (no staging area), everything goes through global memory."""
    program, source = rendered("ln_lstm", 64, 2, 24)
    reductions = [g for g in program.gemms if g.name in program.reductions]
    assert len(reductions) == 3
    for g in reductions:
        assert f"L.{g.out_buffer}" not in source, g.name            # the row values: shared memory only
        assert f"partials of {g.name}" in source
    state_free = [g for g in reductions if g.stage == 2]           # W x and R h: only the partials read them
    for g in state_free:
        assert f"L.{g.in_buffer}" not in source, g.name
    (c_next,) = [g for g in reductions if g.stage == 3]
    assert f"{c_next.in_buffer}[b * H + j] = c_next;" not in source   # stage 3 reads it from a register (carried.py)
    assert source.count("written by the cell code") == 3
    _, launched = rendered("ln_lstm", 64, 2, 24, persistent=False)      # a launch a stage: stage 3 loads it from L2
    assert f"{c_next.in_buffer}[b * H + j] = c_next;" in launched and launched.count("written by the cell code") == 3
    assert "* B + b] = acc" not in source and "row_value = smem + SCRATCH" in source

    network, program = wave_program("ln_lstm", 64, 2, 24)
    tiling = make_tiling(program, network, 24, TileConfig(), H100)
    produced = [g for g in program.gemms if g.name in program.reductions and g.stage == 3]
    none = stage_shared(program, 2, reductions[:2], produced, tiling.units_per_block, 24, free=0)
    assert none.sums == {} and none.vals == {} and none.end == 0
    some = stage_shared(program, 2, reductions[:2], produced, tiling.units_per_block, 24, free=24 * 4)
    assert len(some.sums) == 2 and some.vals == {}                 # the operands no longer fit
    _, gemv = rendered(ln_small, 48, 2, 3)
    assert "row_value = smem" not in gemv and "written by the cell code" not in gemv


@cell
def sum_beside(x, h):
    # the sum of v beside its variance (twins: the variance's thread writes the sum), and a mean of w alone
    v = W("W_v") @ x + W("R_v") @ h
    w = W("W_w") @ x
    d = v - mean_h(v)
    return {"h": tanh(v * mean_h(d * d) + sum_h(v) * 0.01 + mean_h(w) + b("b"))}


def test_a_layer_norms_mean_is_written_by_its_variances_consumer():
    """twins(): a LayerNorm's mean term adds the values its variance term's partials already sum, so it has no
    partials of its own and no consumer thread; the variance's thread writes both row values (half the partials a
    block loads). A sum_h of the variance's values is a twin too; a mean of other values keeps its own partials."""
    network, program = wave_program("ln_lstm", 64, 2, 64)
    reductions = [g for g in program.gemms if g.name in program.reductions]
    for g in reductions:
        terms = program.reductions[g.name]
        assert len(terms) == 2 and terms[0][0][1] == "mean_h" and terms[1][0][1] == "var_h", g.name
        assert twins(program, g) == {0: 1}, g.name
    _, source = rendered("ln_lstm", 64, 2, 64)
    for g in reductions:
        assert f"{g.name} term 0 with term 1" in source                   # no slot of its own ...
        assert f"// {g.name} term 1 and term 0" in source                  # ... the variance's slot writes it
        assert f"k == 0) {{   // {g.name} term 0" not in source            # and no partials
    assert source.count("twin_acc = tot * (1.0f / H);") == 2               # one copy for each stage's shape
    stage_2 = source[source.index("void ln_lstm_stage_2("):]
    assert "for (int e = threadIdx.x; e < B * 2; e += blockDim.x)" in stage_2[:stage_2.index("the cell math")]
    _, launched = rendered("ln_lstm", 64, 2, 64, persistent=False)          # the stage launches: the same
    assert launched.count("twin_acc = tot * (1.0f / H);") == 2

    _, plain = wave_program(sum_beside, 64, 1, 16)
    found = {g.name: (plain.reductions[g.name], twins(plain, g)) for g in plain.gemms if g.name in plain.reductions}
    (v_terms, v_twins), (w_terms, w_twins) = found["v_gemm"], found["w_gemm"]
    assert [p[0][1] for p in v_terms] == ["var_h", "sum_h"] and v_twins == {1: 0}
    assert [p[0][1] for p in w_terms] == ["mean_h"] and w_twins == {}
    _, source = rendered(sum_beside, 64, 1, 16)
    assert "twin_acc = tot;   // sum_h of the same operands" in source
    assert "w_gemm term 0 = mean_h(w)" in source and "v_gemm term 1 with term 0" in source
