"""The passes, one by one, and the claim that matters most: compiling never changes what a cell computes.

The differential tests execute the compiled Plan with the plan interpreter (engine/backends/
plan_numpy.py: the fused backend's executor with NumPy in place of CuPy and each generated kernel
evaluated from its statements) and compare with the NumPy reference in float64, for every preset
and for cells that reach the compiler's corners, with each pass switched off in turn, in both
weight layouts. That proves grouping, packing, bias folding and the placement of every value in
memory on a machine without a GPU.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from compiler_cells import CELLS

import engine
from engine.backends import plan_numpy
from engine.compiler import compile_cell, make_plan
from engine.errors import BackendError, CompileError
from engine.passes import PASS_NAMES, enabled_passes, pass_list
from engine.passes.lowering import Lowering, describe

PRESETS = sorted(engine.presets())
ALL_CELLS = {**{name: engine.preset(name).cell for name in PRESETS}, **CELLS}
PASS_CHOICES = [None, []] + [{name: False} for name in PASS_NAMES]


def _case(cell, num_layers, seed=0, steps=5, batch=3, input_size=5, hidden_size=7):
    hidden_size = cell.fit_size(hidden_size)          # a cell of heads takes the next multiple of its heads
    network = engine.Network(cell, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(100 + seed)
    x = rng.standard_normal((steps, batch, input_size))
    states = {s: rng.uniform(-0.9, 0.9, (num_layers, batch, hidden_size)) for s in cell.state_names}
    return network, params, x, states


def _max_error(result, ref):
    errors = [np.abs(result.outputs - ref.outputs).max()]
    errors += [np.abs(result.final_states[s] - ref.final_states[s]).max() for s in ref.final_states]
    return max(errors)


# ---- the differential claim ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ALL_CELLS))
def test_every_pass_combination_computes_what_the_reference_computes(name):
    cell = ALL_CELLS[name]
    for num_layers in (1, 3):
        network, params, x, states = _case(cell, num_layers, seed=num_layers)
        ref = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
        for passes in PASS_CHOICES:
            for layout in ("blocked", "interleaved"):
                result = plan_numpy.run(network, params, x, states, passes=passes, layout=layout, chunk_steps=2)
                err = _max_error(result, ref)
                assert err < 1e-12, f"{name}, L={num_layers}, passes={passes}, layout={layout}: error {err:.3g}"


@pytest.mark.parametrize("chunk_steps", [1, 2, 3, 7, 50])
def test_wavefront_chunking_does_not_change_the_result(chunk_steps):
    network, params, x, states = _case(engine.preset("gru_cho").cell, num_layers=4, steps=7)
    ref = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
    result = plan_numpy.run(network, params, x, states, chunk_steps=chunk_steps)
    assert _max_error(result, ref) < 1e-12
    assert result.info["plan"].chunk_steps == min(chunk_steps, 7)


def test_plan_interpreter_in_float32_is_close_to_float64_reference():
    network, params, x, states = _case(engine.preset("lstm").cell, num_layers=2, steps=9)
    ref = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
    result = plan_numpy.run(network, params, x, states, dtype=np.float32)
    assert result.outputs.dtype == np.float32
    rel = np.linalg.norm(result.outputs - ref.outputs) / np.linalg.norm(ref.outputs)
    assert rel < 1e-5


def test_a_broken_packing_is_caught(monkeypatch):
    """The differential test can fail: swap two blocks of the packed recurrent weight and it does."""
    import engine.plan as plan_module
    original = plan_module.pack_weights

    def swapped(program, network, params, layer, dtype=np.float64):
        packed = original(program, network, params, layer, dtype)
        gemm = program.step_gemms(1)[0]
        weight = packed[gemm.name].weight.copy()
        h = network.hidden_size
        weight[:h], weight[h:2 * h] = weight[h:2 * h].copy(), weight[:h].copy()
        packed[gemm.name] = dataclasses.replace(packed[gemm.name], weight=weight)
        return packed

    monkeypatch.setattr("engine.backends.fused.pack_weights", swapped)
    network, params, x, states = _case(engine.preset("lstm").cell, num_layers=1)
    ref = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
    assert _max_error(plan_numpy.run(network, params, x, states), ref) > 1e-3


def test_poisoned_buffers_reach_the_output_when_a_store_is_missing(monkeypatch):
    """NaN poisoning catches a value read before it is written: drop the kernel's state store."""
    network, params, x, states = _case(engine.preset("gru").cell, num_layers=1)
    plan = make_plan(network, x.shape[0], x.shape[1])
    kernel = plan.program.kernels[0]
    crippled = dataclasses.replace(kernel, stores=tuple(s for s in kernel.stores if "state" not in s.why))
    program = dataclasses.replace(plan.program, kernels=(crippled,))
    monkeypatch.setattr("engine.backends.plan_numpy.make_plan",
                        lambda *a, **k: dataclasses.replace(plan, program=program))
    result = plan_numpy.run(network, params, x, states)
    assert np.isnan(result.outputs[1:]).any()


# ---- the pass list --------------------------------------------------------------------------------------

def test_pass_list_names_every_pass_once_with_a_reason():
    passes = pass_list()
    assert [p.name for p in passes] == list(PASS_NAMES)
    assert len(set(PASS_NAMES)) == len(PASS_NAMES)
    for p in passes:
        assert len(p.why) > 30 and p.why.endswith("."), f"pass {p.name} needs a docstring saying why"


def test_passes_are_pure_and_return_new_state():
    cell = engine.preset("lstm_fgr").cell
    low = Lowering(cell=cell, source_cell=cell)
    before = describe(low)
    for p in pass_list():
        new, summary = p.run(low)
        assert describe(low) == before, f"pass {p.name} changed its input"
        assert isinstance(summary, str) and summary
        low, before = new, describe(new)


def test_compile_is_cached_and_keyed_by_options():
    cell = engine.preset("gru").cell
    a = compile_cell(cell)
    assert compile_cell(cell) is a
    keys = {a.key, compile_cell(cell, {"fuse_elementwise": False}).key, compile_cell(cell, layout="interleaved").key}
    assert len(keys) == 3


def test_enabled_passes_forms_and_errors():
    assert all(enabled_passes(None).values())
    chosen = enabled_passes({"hoist_inputs": False})
    assert chosen["hoist_inputs"] is False and chosen["group_gemms"] is True
    chosen = enabled_passes(["group_gemms"])
    assert chosen["group_gemms"] and not chosen["hoist_inputs"]
    with pytest.raises(CompileError, match="unknown pass.*hint: the passes are"):
        enabled_passes({"hoist": False})
    with pytest.raises(CompileError, match="True or False"):
        enabled_passes({"hoist_inputs": "no"})
    with pytest.raises(CompileError, match="hint"):
        enabled_passes("hoist_inputs")


def test_bad_options_raise_compile_errors():
    cell = engine.preset("lstm").cell
    with pytest.raises(CompileError, match="layout"):
        compile_cell(cell, layout="diagonal")
    with pytest.raises(CompileError, match="precision 'float8'.*hint"):
        compile_cell(cell, precision="float8")
    with pytest.raises(CompileError, match="CellGraph"):
        compile_cell("lstm")
    with pytest.raises(BackendError, match="steps"):
        make_plan(engine.Network(cell, 3, 4), 0, 2)


# ---- single passes ------------------------------------------------------------------------------------

def _record(cell, name, passes=None):
    program = compile_cell(cell, passes)
    return next(p for p in program.passes if p.name == name), program


def test_prune_dead_removes_values_no_state_needs():
    record, program = _record(CELLS["dead_value"], "prune_dead")
    assert "unused" in record.summary and "U_dead_h" in record.summary
    assert "unused" not in program.cell.by_name
    assert program.node_groups["unused"].startswith("(pruned")
    kept = compile_cell(CELLS["dead_value"], {"prune_dead": False})
    assert "unused" in kept.cell.by_name


def test_fold_constants_computes_number_only_ops_once():
    record, program = _record(CELLS["constants"], "fold_constants")
    assert "shift" in record.summary
    assert program.cell["shift"].op == "const" and program.cell["shift"].attr("value") == 0.5
    # The folded constant is summed with a hoisted projection, so it rides along as a bias.
    term = next(t for g in program.gemms for t in g.terms if t.output == "f_pre" and t.stage == "hoisted")
    assert "shift" in term.biases


def test_flatten_sums_sees_whole_add_trees():
    record, program = _record(engine.preset("lstm").cell, "flatten_sums")
    assert "i_pre = W_ii_x + b_ii + W_hi_h + b_hi" in record.summary
    # c_next = f*c + i*g has no matmul: it stays a plain add.
    assert "c_next =" not in record.summary


def test_hoist_inputs_takes_exactly_the_matmuls_on_x():
    record, program = _record(engine.preset("gru").cell, "hoist_inputs")
    assert record.summary.startswith("3 matmul(s) on x")
    (hoisted,) = program.hoisted_gemms
    assert [o.name for o in hoisted.operands] == ["x"]
    assert sorted(m for t in hoisted.terms for m in t.matmuls) == ["W_in_x", "W_ir_x", "W_iz_x"]


def test_group_gemms_joins_terms_that_share_an_operand_with_zero_blocks():
    program = compile_cell(CELLS["shared_operand"])
    (gemm,) = program.step_gemms(1)
    assert [o.name for o in gemm.operands] == ["h", "c"]
    assert len(gemm.terms) == 2
    network = engine.Network(CELLS["shared_operand"], 3, 4)
    params = engine.init_params(network)
    weight = engine.plan.pack_weights(program, network, params, 0)[gemm.name].weight
    z_rows = slice(4, 8)
    assert np.all(weight[z_rows, 4:8] == 0), "z reads no c: its c columns are zeros"
    np.testing.assert_array_equal(weight[z_rows, 0:4], params[0]["U_z"])


def test_group_gemms_keeps_unrelated_matmuls_apart():
    program = compile_cell(CELLS["disjoint_operands"])
    assert [[o.name for o in g.operands] for g in program.step_gemms(1)] == [["h"], ["c"]]


def test_group_gemms_puts_dependent_matmuls_in_later_stages():
    program = compile_cell(CELLS["three_stages"])
    assert [(g.stage, [o.name for o in g.operands]) for g in program.gemms] == [
        ("hoisted", ["x"]), (1, ["h"]), (2, ["r_h_mul"]), (3, ["s_h_mul"])]
    assert program.num_stages == 3


def test_a_matmul_used_twice_keeps_its_own_block():
    program = compile_cell(CELLS["reused_matmul"])
    (gemm,) = program.step_gemms(1)
    assert [(t.name, t.output, t.matmuls) for t in gemm.terms] == [("m", "m", ("m",))]


def test_a_summand_added_twice_is_packed_twice():
    cell = CELLS["doubled_summand"]
    program = compile_cell(cell)
    (gemm,) = program.step_gemms(1)
    assert gemm.terms[0].matmuls == ("u", "u")
    network = engine.Network(cell, 3, 4)
    params = engine.init_params(network)
    weight = engine.plan.pack_weights(program, network, params, 0)[gemm.name].weight
    np.testing.assert_allclose(weight, 2 * params[0]["U"])


def test_group_gemms_off_gives_one_gemm_per_matmul():
    cell = engine.preset("lstm").cell
    program = compile_cell(cell, {"group_gemms": False})
    matmuls = [n.name for n in cell.nodes if n.op == "matmul"]
    assert sorted(t.name for g in program.gemms for t in g.terms) == sorted(matmuls)
    assert len(program.gemms) == len(matmuls)


def test_fold_biases_moves_biases_into_the_hoisted_gemm_and_out_of_the_kernel():
    program = compile_cell(engine.preset("lstm").cell)
    (hoisted,) = program.hoisted_gemms
    assert [t.biases for t in hoisted.terms] == [("b_ii", "b_hi"), ("b_if", "b_hf"), ("b_ig", "b_hg"),
                                                  ("b_io", "b_ho")]
    assert program.kernel_params == ()
    unfolded = compile_cell(engine.preset("lstm").cell, {"fold_biases": False})
    assert len(unfolded.kernel_params) == 8


def test_fuse_elementwise_off_gives_one_kernel_per_value():
    cell = engine.preset("lstm").cell
    fused = compile_cell(cell)
    single = compile_cell(cell, {"fuse_elementwise": False})
    assert len(fused.kernels) == 1
    statements = sum(len(k.statements) for k in fused.kernels)
    assert len(single.kernels) == statements
    assert all(len(k.statements) == 1 for k in single.kernels)


def test_fusion_places_values_as_late_as_possible():
    """GRU-Cho's update gate z is only needed at the end: it is computed in stage 2, not stage 1."""
    program = compile_cell(engine.preset("gru_cho").cell)
    stage1, stage2 = program.kernels
    assert "z" not in stage1.nodes and "z" in stage2.nodes
    assert stage1.outputs == ("r_h_mul",)


def test_wavefront_off_runs_layers_one_after_the_other():
    network = engine.Network(engine.preset("lstm").cell, 3, 4, num_layers=3)
    plan = make_plan(network, 10, 2, {"wavefront": False})
    assert plan.program.schedule == "layers" and plan.num_chunks == 1
    assert list(plan.chunk_order()) == [((0, 0),), ((1, 0),), ((2, 0),)]
    on = make_plan(network, 10, 2, chunk_steps=3)
    assert on.num_chunks == 4
    assert [list(d) for d in on.chunk_order()] == [[tuple(c) for c in d] for d in on.chunk_wavefront.steps]
