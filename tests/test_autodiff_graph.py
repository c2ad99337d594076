"""The backward step graph as data: what backward_graph derives for known cells (structural claims), its describe()
text (a golden snapshot), and its refusals. The numbers it computes are tested in test_autodiff.py.

Regenerate the snapshot after an intended change with UPDATE_GOLDEN=1 and review the diff.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
from compiler_cells import CELLS

import engine
from engine.autodiff import AutodiffError, BackwardGraph, backward_graph
from engine.autodiff.graph import FLOWS, ROLES
from engine.ops import GRAD_OPS, OPS, OpDef, apply_backward

GOLDEN = Path(__file__).parent / "golden"


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing snapshot {path}; create it with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs from describe(); review, then UPDATE_GOLDEN=1"


def matmuls(cell) -> list[engine.Node]:
    return [n for n in cell.nodes if n.op == "matmul" and n.name in cell.live_nodes]


@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_every_preset_derives_a_well_formed_backward_graph(name):
    """Every node reads values defined before it (or saved, or entering the step), its role and tags are known, and
    every live parameter gets a gradient."""
    cell = engine.preset(name).cell
    graph = backward_graph(cell)
    defined = {i.name for i in graph.inputs} | set(graph.saved)
    for node in graph.nodes:
        assert set(node.args) <= defined, node
        assert node.role in ROLES and (node.flows_to in FLOWS) == (node.role == "operand_grad"), node
        if not node.accumulates:
            defined.add(node.name)
    assert set(graph.saved) <= {n.name for n in cell.nodes}
    assert {n.param for n in graph.nodes if n.accumulates} == {p.name for p in cell.params}


def test_lstm_describe_matches_the_golden_snapshot():
    _check_golden("lstm_backward.txt", backward_graph(engine.preset("lstm").cell).describe())


def test_lstm_one_weight_gradient_per_matmul_and_tagged_operand_gradients():
    cell = engine.preset("lstm").cell
    graph = backward_graph(cell)
    weight_grads = graph.with_role("weight_grad")
    assert sorted(n.of for n in weight_grads) == sorted(m.name for m in matmuls(cell))            # 8, one each
    for node in weight_grads:
        weight, operand = cell[node.of].args
        assert node.op == "outer" and node.param == weight and node.accumulates
        assert node.args == (graph.adjoint_of(node.of), operand)
    operand_grads = {n.of: [] for n in graph.with_role("operand_grad")}
    for n in graph.with_role("operand_grad"):
        operand_grads[n.of].append(n)
    assert sorted(operand_grads) == ["h", "x"] and [len(v) for v in operand_grads.values()] == [4, 4]
    assert all(n.flows_to == "state" and n.recurrent for n in operand_grads["h"])
    assert all(n.flows_to == "input" and not n.recurrent for n in operand_grads["x"])
    assert all(n.op == "matmul_t" for v in operand_grads.values() for n in v)


def test_lstm_every_parameter_gets_a_gradient_and_the_backward_reads_activations_only():
    cell = engine.preset("lstm").cell
    graph = backward_graph(cell)
    assert {n.param for n in graph.nodes if n.accumulates} == {p.name for p in cell.params}
    assert all(len(graph.param_grads(p.name)) == 1 for p in cell.params)
    assert all(n.op == "batch_sum" for n in graph.with_role("param_grad"))
    # sigmoid' and tanh' come from the outputs: no pre-activation is kept for the backward
    values = [n for n in graph.saved if not cell[n].is_param]
    assert values == ["x", "h", "c", "i", "f", "g", "o", "h_next_tanh"]
    assert dict(graph.state_adjoints) == {"h": "d_h", "c": "d_c"} and graph.input_adjoint == "d_x"
    assert [(i.name, i.source, i.of) for i in graph.inputs] == [("d_output", "output", "h_next"),
                                                                ("d_h_carry", "carry", "h_next"),
                                                                ("d_c_carry", "carry", "c_next")]


def test_gru_recurrent_operand_gradients_and_the_shared_adjoints():
    graph = backward_graph(engine.preset("gru").cell)
    assert {n.of: n.flows_to for n in graph.with_role("operand_grad")} == {"h": "state", "x": "input"}
    assert len(graph.with_role("weight_grad")) == 6
    assert graph.adjoint_of("W_in_x") == graph.adjoint_of("n_pre") == "d_n_pre"                  # add passes through
    assert graph.by_name["d_h"].op == "sum" and len(graph.by_name["d_h"].args) == 4               # z * h and 3 GEMMs


def test_mgu_operand_gradient_through_an_internal_value_is_recurrent():
    graph = backward_graph(engine.preset("mgu").cell)
    internal = [n for n in graph.with_role("operand_grad") if n.flows_to == "internal"]
    assert len(internal) == 1 and internal[0].recurrent                                         # U_h (f * h)


def test_an_internal_operand_of_the_input_alone_is_not_recurrent():
    graph = backward_graph(CELLS["input_sized"])
    tags = {(n.of, n.flows_to, n.recurrent) for n in graph.with_role("operand_grad")}
    assert ("gx", "internal", False) in tags                  # W (x * ...): batchable over time like the input's
    assert ("p", "internal", True) in tags                    # Q tanh(P h): on the recurrence
    assert ("h", "state", True) in tags


def test_lstm_proj_state_sizes():
    graph = backward_graph(engine.preset("lstm_proj").cell)
    text = graph.describe()
    assert "d_output (B, P)" in text and "d_h_carry (B, P)" in text and "d_c_carry (B, H)" in text
    assert [n.param for n in graph.with_role("weight_grad") if n.of == "h_next"] == ["W_hr"]


def test_dead_values_and_constants_get_no_adjoint_and_unread_states_a_zero():
    dead = backward_graph(CELLS["dead_value"])
    assert dead.adjoint_of("unused") is None and not dead.param_grads("U_dead")
    consts = backward_graph(CELLS["constants"])
    const_values = [n.name for n in CELLS["constants"].nodes if CELLS["constants"].dims[n.name] == "1"]
    assert const_values and all(consts.adjoint_of(n) is None for n in const_values)
    unread = backward_graph(CELLS["projection_only"])
    assert dict(unread.state_adjoints) == {"h": None} and "h[t-1]: zero (not read)" in unread.describe()


def test_a_state_whose_next_value_is_another_state_passes_its_adjoint_through():
    graph = backward_graph(CELLS["linear_states"])               # h[t] = c[t-1] (the output), c[t] = U h[t-1]
    d_c = graph.by_name[dict(graph.state_adjoints)["c"]]
    assert d_c.op == "sum" and d_c.args == (graph.output_input, graph.carry_input("h"))
    assert graph.by_name[dict(graph.state_adjoints)["h"]].op == "matmul_t"


def test_a_weight_used_by_three_matmuls_gets_three_outer_products():
    cell = CELLS["shared_weight"]
    graph = backward_graph(cell)
    users = sorted(m.name for m in matmuls(cell) if m.args[0] == "U")
    assert len(users) == 3 and sorted(n.of for n in graph.param_grads("U")) == users


def test_the_pass_does_not_mutate_the_cell_and_its_result_is_frozen():
    cell = engine.preset("peephole_lstm").cell
    before = (engine.to_json(cell), cell.structural_hash)
    graph = backward_graph(cell)
    assert (engine.to_json(cell), cell.structural_hash) == before
    assert backward_graph(cell) == graph                                                         # deterministic
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.nodes = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.nodes[0].op = "mul"


def test_backward_names_never_shadow_forward_values():
    cell = engine.from_dict({
        "schema": "rnn-cell-graph", "version": 1, "name": "clash", "output": "h",
        "nodes": [{"name": "x", "op": "input"}, {"name": "h", "op": "state"},
                  {"name": "W", "op": "weight", "attrs": {"rows": "H", "cols": "I"}},
                  {"name": "d_output", "op": "matmul", "args": ["W", "x"]},
                  {"name": "d_h", "op": "mul", "args": ["d_output", "h"]},
                  {"name": "h_next", "op": "tanh", "args": ["d_h"]}],
        "states": [{"name": "h", "next": "h_next"}]})
    graph = backward_graph(cell)
    forward = {n.name for n in cell.nodes}
    backward = [i.name for i in graph.inputs] + [n.name for n in graph.nodes]
    assert not forward & set(backward) and len(set(backward)) == len(backward)


def test_every_op_has_a_rule_per_port_naming_known_ops():
    for name, spec in OPS.items():
        assert len(spec.vjp) == spec.arity, name
        for rule in spec.vjp:
            assert rule.op in GRAD_OPS or rule.op in OPS, (name, rule)
            assert set(rule.args) <= {"dy", "y", *spec.ports}, (name, rule)


def test_the_kink_conventions_are_pytorchs():
    """relu'(0) = 0 (threshold_backward on the output); hard_sigmoid' = 1/6 strictly inside (-3, 3)."""
    dy = np.ones(5)
    assert apply_backward("relu_grad", [dy, np.array([0.0, 0.0, 1e-300, 2.0, 0.0])], {}).tolist() == [0, 0, 1, 1, 0]
    x = np.array([-3.0, -2.999, 0.0, 2.999, 3.0])
    np.testing.assert_array_equal(apply_backward("hard_sigmoid_grad", [dy, x], {}), [0, 1 / 6, 1 / 6, 1 / 6, 0])


def test_an_op_without_a_gradient_rule_is_refused_naming_the_node(monkeypatch):
    monkeypatch.setitem(OPS, "softplus", OpDef("softplus", ("x",), "elementwise", np.logaddexp.reduce, None,
                                               r"\mathrm{{softplus}}({x})"))
    cell = engine.from_dict({
        "schema": "rnn-cell-graph", "version": 1, "name": "soft", "output": "h",
        "nodes": [{"name": "x", "op": "input"}, {"name": "h", "op": "state"},
                  {"name": "W", "op": "weight", "attrs": {"rows": "H", "cols": "I"}},
                  {"name": "Wx", "op": "matmul", "args": ["W", "x"]},
                  {"name": "smooth", "op": "softplus", "args": ["Wx"]},
                  {"name": "h_next", "op": "mul", "args": ["smooth", "h"]}],
        "states": [{"name": "h", "next": "h_next"}]})
    with pytest.raises(AutodiffError) as e:
        backward_graph(cell)
    assert e.value.node == "smooth" and "op 'softplus' has no gradient rule" in str(e.value)
    assert "hint: give OpDef('softplus') in engine/ops.py a vjp" in str(e.value)


def test_a_rule_naming_an_unknown_op_is_refused(monkeypatch):
    broken = dataclasses.replace(OPS["tanh"], vjp=(dataclasses.replace(OPS["tanh"].vjp[0], op="tanh_prime"),))
    monkeypatch.setitem(OPS, "tanh", broken)
    with pytest.raises(AutodiffError, match="node 'g'.*uses unknown op 'tanh_prime'"):
        backward_graph(engine.preset("lstm").cell)


def test_something_that_is_not_a_cell_is_refused():
    with pytest.raises(AutodiffError, match="(?s)backward_graph needs a CellGraph, got Preset.*hint"):
        backward_graph(engine.preset("lstm"))
    assert isinstance(backward_graph(engine.preset("lstm").cell), BackwardGraph)


# ---- the split: inside the reverse sweep, or once a layer after it (engine.autodiff.hoist) ---------------------

def test_the_lstm_keeps_only_the_recurrence_in_its_reverse_sweep():
    from engine.autodiff.hoist import split_backward
    graph = engine.backward_graph(engine.preset("lstm").cell)
    split = split_backward(graph)
    assert {n.name for n in split.per_step} | {n.name for n in split.after} == {n.name for n in graph.nodes}
    assert not {n.name for n in split.per_step} & {n.name for n in split.after}
    # every parameter gradient (the 8 outer products, the bias sums) and the input's adjoint wait for the sweep
    assert all(not n.accumulates for n in split.per_step)
    assert {n.name for n in graph.nodes if n.accumulates} <= {n.name for n in split.after}
    assert all(n.flows_to != "input" for n in split.per_step if n.role == "operand_grad")
    assert any(n.flows_to == "input" for n in split.after if n.role == "operand_grad")
    # the sweep keeps, per step, the four gates' pre-activation adjoints that the deferred products read
    assert len(split.recorded) == 4, split.recorded
    assert "once a layer" in split.describe()


@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_every_preset_splits_into_a_sweep_that_yields_the_states_adjoints(name):
    from engine.autodiff.hoist import split_backward
    graph = engine.backward_graph(engine.preset(name).cell)
    split = split_backward(graph)
    in_loop = {n.name for n in split.per_step} | {i.name for i in graph.inputs}
    for state, adjoint in graph.state_adjoints:
        assert adjoint is None or adjoint in in_loop, (state, adjoint)
    for node in split.per_step:                       # the sweep reads nothing computed after it
        assert not set(node.args) & {n.name for n in split.after}, node


def test_explain_shows_the_backward_step_and_its_split():
    data = engine.explain_json("gru_cho", input_size=8, hidden_size=16)
    backward = data["backward"]
    assert set(backward["per_step"]) | set(backward["after"]) == {n["name"] for n in backward["nodes"]}
    assert any(n["role"] == "weight_grad" for n in backward["nodes"])
    assert "backward split of cell 'gru_cho'" in backward["text"]
    assert "backward step of cell 'gru_cho'" in engine.explain_text("gru_cho", input_size=8, hidden_size=16,
                                                                    sources=False)
