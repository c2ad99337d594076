"""Structural claims about compiled plans, and the explain() contract the app relies on.

"An LSTM compiles to 1 hoisted GEMM per layer + per step 1 recurrent GEMM and 1 fused kernel":
claims like this one, per preset, plus properties every preset's plan must have.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from compiler_cells import CELLS

import engine
from engine.cli import main as cli_main
from engine.compiler import make_plan
from engine.errors import BackendError
from engine.explain import explain_json, explain_text
from engine.schedule import wavefront

PRESETS = sorted(engine.presets())


def _plan(cell, num_layers=2, steps=12, batch=3, passes=None, **kw):
    network = engine.Network(cell, input_size=5, hidden_size=cell.fit_size(7), num_layers=num_layers)
    return make_plan(network, steps, batch, passes, **kw)


def _structure(name_or_cell, passes=None):
    cell = engine.preset(name_or_cell).cell if isinstance(name_or_cell, str) else name_or_cell
    program = _plan(cell, passes=passes).program
    step = [(kind, item.stage) for kind, item in program.step_order()]
    return program, step


# ---- per preset -----------------------------------------------------------------------------------

def test_lstm_is_one_hoisted_gemm_then_one_gemm_and_one_kernel_per_step():
    program, step = _structure("lstm")
    assert len(program.hoisted_gemms) == 1
    assert step == [("gemm", 1), ("kernel", 1)]
    (gemm,) = program.step_gemms(1)
    assert [o.name for o in gemm.operands] == ["h"] and len(gemm.terms) == 4
    plan = _plan(engine.preset("lstm").cell, num_layers=3)
    assert plan.launches_per_step == 3 * 2


def test_gru_cudnn_form_has_one_recurrent_gemm():
    program, step = _structure("gru")
    assert step == [("gemm", 1), ("kernel", 1)]
    (gemm,) = program.step_gemms(1)
    # r acts after U_n h (cuDNN's form), so all three recurrent matmuls read h and share one GEMM.
    assert sorted(m for t in gemm.terms for m in t.matmuls) == ["W_hn_h", "W_hr_h", "W_hz_h"]


def test_gru_cho_has_two_dependent_recurrent_gemm_stages():
    program, step = _structure("gru_cho")
    assert step == [("gemm", 1), ("kernel", 1), ("gemm", 2), ("kernel", 2)]
    (second,) = program.step_gemms(2)
    assert [o.name for o in second.operands] == ["r_h_mul"]      # r * h, known only after stage 1
    assert [m for t in second.terms for m in t.matmuls] == ["U_n_r_h_mul"]


def test_mgu_has_two_dependent_recurrent_gemm_stages():
    _, step = _structure("mgu")
    assert [s for kind, s in step if kind == "gemm"] == [1, 2]


def test_fgr_is_one_recurrent_gemm_over_all_recurrent_operands():
    program, step = _structure("lstm_fgr")
    assert step == [("gemm", 1), ("kernel", 1)]
    (gemm,) = program.step_gemms(1)
    assert [o.name for o in gemm.operands] == ["h", "i", "f", "o"]
    assert str(gemm.k) == "4H"
    i_term = next(t for t in gemm.terms if t.output == "i_next_pre")
    assert sorted(i_term.matmuls) == ["R_fi_f", "R_i_h", "R_ii_i", "R_oi_o"]


def test_indrnn_has_no_recurrent_gemm():
    program, step = _structure("indrnn")
    assert step == [("kernel", 0)]
    assert [g.stage for g in program.gemms] == ["hoisted"]


def test_peephole_lstm_is_one_recurrent_gemm_and_one_kernel():
    program, step = _structure("peephole_lstm")
    assert step == [("gemm", 1), ("kernel", 1)]
    assert set(program.kernel_params) == {"p_i", "p_f", "p_o"}


@pytest.mark.parametrize("name", PRESETS)
def test_every_matmul_is_in_exactly_one_gemm_and_stages_are_ordered(name):
    cell = engine.preset(name).cell
    program = _plan(cell).program
    cell = program.cell              # its dense form (engine/dense.py): the reductions of ln_lstm are matmuls there
    matmuls = sorted(n.name for n in cell.nodes if n.op == "matmul" and n.name in cell.live_nodes)
    grouped = sorted(m for g in program.gemms for t in g.terms for m in dict.fromkeys(t.matmuls))
    assert grouped == matmuls
    # A step GEMM of stage k only reads values produced before it: leaves, or kernels of stage k-1.
    produced_by = {out: k.stage for k in program.kernels for out in k.outputs}
    for g in program.gemms:
        for op in g.operands:
            if op.name in produced_by:
                assert produced_by[op.name] == g.stage - 1, (g.name, op.name)
            else:
                assert program.cell[op.name].is_leaf


@pytest.mark.parametrize("name", PRESETS + sorted(CELLS))
def test_launch_count_follows_the_plan(name):
    cell = engine.preset(name).cell if name in PRESETS else CELLS[name]
    plan = _plan(cell, num_layers=3)
    per_layer = sum(1 for _ in plan.program.step_order())
    assert plan.launches_per_step == 3 * per_layer
    unfused = _plan(cell, num_layers=3, passes={"fuse_elementwise": False, "group_gemms": False})
    assert unfused.launches_per_step >= plan.launches_per_step


def test_hoisting_off_puts_x_into_the_per_step_gemm():
    program, step = _structure("lstm", {"hoist_inputs": False})
    assert not program.hoisted_gemms
    (gemm,) = program.step_gemms(1)
    assert [o.name for o in gemm.operands] == ["x", "h"] and str(gemm.k) == "I + H"
    # x_t is copied into the GEMM's operands by a stage-0 kernel.
    assert step[0] == ("kernel", 0)


def test_costs_count_flops_of_the_gemms():
    plan = _plan(engine.preset("lstm").cell, num_layers=1, steps=10, batch=3)
    H, I, B, T = 7, 5, 3, 10
    (shape,) = plan.shapes["h_gemm"]
    assert (shape.m, shape.n, shape.k, shape.flops) == (B, 4 * H, H, 2 * B * 4 * H * H)
    (proj,) = plan.shapes["x_proj"]
    assert (proj.m, proj.k, proj.per) == (T * B, I, "sequence")
    kernel_flops = plan.program.kernels[0].flops_per_element * B * H
    assert plan.flops_per_step == shape.flops + kernel_flops
    assert plan.flops_total == T * plan.flops_per_step + 2 * T * B * 4 * H * I


def test_upper_layer_projection_is_chunked_in_the_wavefront():
    plan = _plan(engine.preset("lstm").cell, num_layers=2, steps=10, batch=3, chunk_steps=4)
    layer0, layer1 = plan.shapes["x_proj"]
    assert (layer0.per, layer0.m, layer0.calls) == ("sequence", 30, 1)
    assert (layer1.per, layer1.m, layer1.calls, layer1.k) == ("chunk", 12, 3, 7)


# ---- explain ----------------------------------------------------------------------------------------

CONTRACT = {"cell": str, "hash": str, "sizes": dict, "passes": list, "gemms": list, "kernels": list,
            "launches_per_step": int, "flops_per_step": int, "bytes_per_step": int, "flops_total": int,
            "node_groups": dict, "wavefront": dict}


@pytest.mark.parametrize("name", PRESETS)
def test_explain_json_contract(name):
    data = explain_json(name, input_size=5, hidden_size=engine.preset(name).cell.fit_size(7), num_layers=2, steps=6,
                        batch=3)
    for key, kind in CONTRACT.items():
        assert isinstance(data[key], kind), key
    projected = engine.preset(name).cell.uses_projection            # LSTMP: the sizes say P too
    assert set(data["sizes"]) == {"I", "H", "L", "T", "B"} | ({"P"} if projected else set())
    assert data["wavefront"] == wavefront(2, 6).to_dict()
    for p in data["passes"]:
        assert {"name", "enabled", "why", "summary"} <= set(p)
    for g in data["gemms"]:
        assert {"name", "stage", "operands", "blocks", "m", "n", "k", "flops", "per", "layout"} <= set(g)
        assert g["stage"] == "hoisted" or isinstance(g["stage"], int)
        assert g["per"] in ("sequence", "step")
        for block in g["blocks"]:
            assert {"output", "matmuls", "biases"} <= set(block)
    for k in data["kernels"]:
        assert {"name", "stage", "nodes", "inputs", "outputs", "source"} <= set(k)
        assert k["name"] in k["source"]
    cell = engine.preset(name).cell
    assert set(data["node_groups"]) == {n.name for n in cell.nodes if not n.is_leaf}
    groups = {g["name"] for g in data["gemms"]} | {k["name"] for k in data["kernels"]}
    assert all(v in groups or v.startswith("(") for v in data["node_groups"].values())
    json.dumps(data)


def test_explain_accepts_networks_cells_presets_and_dicts():
    cell = engine.preset("gru").cell
    network = engine.Network(cell, 9, 11, 3)
    by_network = explain_json(network, steps=4, batch=2)
    assert by_network["sizes"] == {"I": 9, "H": 11, "L": 3, "T": 4, "B": 2}
    assert explain_json(engine.to_dict(cell))["hash"] == explain_json(cell)["hash"] == by_network["hash"]
    with pytest.raises(engine.CompileError, match="argument .cell_or_network. must be a cell, network, preset"):
        explain_json(42)


def test_explain_reflects_switched_off_passes():
    on = explain_json("lstm")
    off = explain_json("lstm", passes={"group_gemms": False, "fuse_elementwise": False})
    assert len(off["gemms"]) == 8 and len(on["gemms"]) == 2
    assert off["launches_per_step"] > on["launches_per_step"]
    assert [p["enabled"] for p in off["passes"] if p["name"] in ("group_gemms", "fuse_elementwise")] == [False, False]


def test_explain_text_shows_passes_gemms_kernels_and_wavefront():
    text = explain_text("gru_cho", num_layers=2, steps=5, batch=2)
    for needle in ("hoist_inputs", "r_h_mul_gemm (stage 2", "gru_cho_stage2", "wavefront depth 6",
                   "__global__ void gru_cho_stage1", "h[t] = z * h[t-1] + (1 - z) * n"):
        assert needle in text, needle


def test_explain_cli(capsys):
    assert cli_main(["explain", "mgu", "--json", "-L", "2", "--off", "wavefront"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schedule"] == "layers" and data["sizes"]["L"] == 2
    assert cli_main(["explain", "indrnn", "--no-source"]) == 0
    assert "indrnn_stage0" in capsys.readouterr().out
    assert cli_main(["explain", "no_such_cell"]) == 2
    assert "hint" in capsys.readouterr().err


# ---- the fused backend's checks, without a GPU --------------------------------------------------------

def test_fused_backend_rejects_other_dtypes_before_anything_else():
    from engine.backends import fused
    network = engine.Network(engine.preset("lstm").cell, 3, 4)
    params = engine.init_params(network)
    with pytest.raises(BackendError, match="float32 only.*hint"):
        fused.run(network, params, np.zeros((2, 1, 3)), dtype=np.float64)


def test_fused_backend_without_gpu_says_why():
    from engine.backends import fused, gpu_status
    ok, why = gpu_status()
    if ok:
        pytest.skip("a GPU is present")
    network = engine.Network(engine.preset("lstm").cell, 3, 4)
    params = engine.init_params(network)
    with pytest.raises(BackendError, match="needs a GPU"):
        fused.run(network, params, np.zeros((2, 1, 3), dtype=np.float32))
