"""The Python DSL: node names from local variables, numbers as ops, and errors at definition time."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import CellGraphError
from engine.dsl import W, b, cell, const, relu, sigmoid, tanh, v


def ops_by_name(graph):
    return {n.name: n for n in graph.nodes}


# ---- names -----------------------------------------------------------------------------------

def test_local_variables_name_the_nodes():
    @cell
    def small_lstm(x, h, c):
        gate_in = sigmoid(W("W_xi") @ x + W("W_hi") @ h + b("b_i"))
        candidate = tanh(W("W_xg") @ x + W("W_hg") @ h)
        c_new = c + gate_in * candidate
        h_new = tanh(c_new)
        return {"h": h_new, "c": c_new}

    nodes = ops_by_name(small_lstm)
    assert nodes["gate_in"].op == "sigmoid"
    assert nodes["candidate"].op == "tanh"
    assert nodes["c_new"].op == "add" and nodes["c_new"].args[0] == "c"
    assert {s.name: s.next for s in small_lstm.states} == {"h": "h_new", "c": "c_new"}
    # matmuls are named after weight and operand, the rest after the value they feed
    assert nodes["W_xi_x"].op == "matmul" and nodes["W_hi_h"].args == ("W_hi", "h")
    assert nodes["gate_in_pre"].op == "add"            # the argument of an activation is its "_pre"
    assert all(not n.name.startswith("%") and n.name.isidentifier() for n in small_lstm.nodes)
    # input and states are named after the function's parameters, the cell after the function
    assert small_lstm.input.name == "x" and small_lstm.state_names == ("h", "c")
    assert small_lstm.name == "small_lstm"


def test_rebinding_a_state_parameter_names_its_next_value():
    @cell
    def rebind(x, h):
        h = tanh(W("W_x") @ x + W("W_h") @ h)
        return {"h": h}

    assert rebind.next_of("h") == "h_next" and rebind["h_next"].op == "tanh"
    assert rebind["h"].op == "state"


def test_unnamed_return_value_is_named_after_its_state():
    @cell
    def inline(x, h):
        return {"h": relu(W("W_x") @ x + W("W_h") @ h)}

    assert inline.next_of("h") == "h_next"


def test_named_overrides_the_local_variable():
    @cell
    def forced(x, h):
        gate = sigmoid(W("W_x") @ x).named("update_gate")
        return {"h": gate * h}

    assert forced["update_gate"].op == "sigmoid"
    assert "gate" not in forced.by_name


def test_matmul_of_an_unnamed_expression_gets_readable_names():
    """W @ (r * h), as in Cho's GRU: the product and its operand get identifier names, not temporaries."""
    @cell
    def reset_first(x, h):
        r = sigmoid(W("W_r") @ x + W("U_r") @ h)
        n = tanh(W("W_n") @ x + W("U_n") @ (r * h))
        deep = tanh(W("U_d") @ (r * h + n))
        return {"h": n + deep}

    nodes = ops_by_name(reset_first)
    assert nodes["r_h_mul"].op == "mul" and nodes["r_h_mul"].args == ("r", "h")
    assert nodes["U_n_r_h_mul"].args == ("U_n", "r_h_mul")
    assert nodes["U_d_prod"].op == "matmul" and nodes[nodes["U_d_prod"].args[1]].op == "add"
    assert all(n.name.isidentifier() for n in reset_first.nodes)


def test_a_name_collision_with_a_parameter_gets_a_suffix():
    @cell
    def clash(x, h):
        b_h = sigmoid(W("W_x") @ x + b("b_h"))     # the local variable and the bias are both "b_h"
        return {"h": b_h * h}

    assert clash["b_h"].op == "bias"
    assert clash["b_h_1"].op == "sigmoid"


# ---- numbers ---------------------------------------------------------------------------------

@cell
def numbers(x, h):
    z = sigmoid(W("W_z") @ x + W("U_z") @ h)
    keep = 1 - z
    half = 0.5 * z
    twice = z * 2
    shifted = z + 1.0
    from_two = 2 - z
    negated = -z
    total = keep + half + twice + shifted + from_two + negated
    return {"h": total * h}


def test_numbers_map_to_ops():
    nodes = ops_by_name(numbers)
    assert nodes["keep"].op == "one_minus" and nodes["keep"].args == ("z",)
    assert nodes["half"].op == "scale" and nodes["half"].attr("factor") == 0.5
    assert nodes["twice"].op == "scale" and nodes["twice"].attr("factor") == 2.0
    assert nodes["shifted"].op == "add" and nodes[nodes["shifted"].args[1]].op == "const"
    assert nodes[nodes["shifted"].args[1]].attr("value") == 1.0
    assert nodes["from_two"].op == "sub" and nodes[nodes["from_two"].args[0]].attr("value") == 2.0
    assert nodes["negated"].op == "neg"
    assert numbers.warnings == ()


def test_numbers_compute_what_they_say():
    net = engine.Network(numbers, input_size=3, hidden_size=4)
    params = engine.init_params(net, seed=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 3))
    h0 = rng.standard_normal((1, 2, 4))
    result = engine.run(net, params, x, {"h": h0}, backend="reference", dtype=np.float64)
    p = params[0]
    z = 1 / (1 + np.exp(-(x[0] @ p["W_z"].T + h0[0] @ p["U_z"].T)))
    total = (1 - z) + 0.5 * z + 2 * z + (z + 1) + (2 - z) - z
    np.testing.assert_allclose(result.outputs[0], total * h0[0], rtol=0, atol=1e-13)


def test_const_helper_and_vector_parameters():
    @cell
    def with_const(x, h):
        u = v("u")
        return {"h": relu(W("W") @ x + u * h + const(0.25))}

    nodes = ops_by_name(with_const)
    assert nodes["u"].op == "vector" and nodes["u"].attr("dim") == "H"
    assert [n for n in with_const.nodes if n.op == "const"][0].attr("value") == 0.25


# ---- errors at definition time ---------------------------------------------------------------

def test_a_weight_on_two_sizes_is_an_error():
    with pytest.raises(CellGraphError) as info:
        @cell
        def shared(x, h):
            return {"h": tanh(W("W_shared") @ x + W("W_shared") @ h)}
    assert info.value.node == "W_shared"
    assert "W_shared" in str(info.value) and "hint:" in str(info.value)


def test_a_name_used_for_two_kinds_is_an_error():
    with pytest.raises(CellGraphError) as info:
        @cell
        def twice(x, h):
            return {"h": tanh(W("p") @ x + v("p") * h)}
    assert info.value.node == "p"


@pytest.mark.parametrize("helper", [
    lambda: b("b_i"),
    lambda: v("p_i"),
    lambda: const(1.0),
], ids=["b", "v", "const"])
def test_helpers_outside_cell_raise(helper):
    with pytest.raises(CellGraphError) as info:
        helper()
    assert "@cell" in str(info.value) and "hint:" in str(info.value)


def test_ops_on_non_values_raise():
    with pytest.raises(CellGraphError, match="sigmoid"):
        sigmoid(1.0)
    with pytest.raises(CellGraphError, match="W_x"):
        W("W_x") @ np.ones(3)


def test_unknown_state_in_return_is_named():
    with pytest.raises(CellGraphError) as info:
        @cell
        def wrong(x, h):
            return {"h": tanh(W("W") @ x), "k": tanh(W("U") @ h)}
    assert info.value.node == "k" and info.value.field == "return"


def test_return_must_be_a_dict_for_several_states():
    with pytest.raises(CellGraphError) as info:
        @cell
        def two(x, h, c):
            return tanh(W("W") @ x)
    assert info.value.field == "return"


def test_control_flow_on_values_is_an_error():
    with pytest.raises(CellGraphError, match="truth value"):
        @cell
        def branchy(x, h):
            pre = W("W") @ x
            if pre:
                pass
            return {"h": tanh(pre)}


def test_a_cell_needs_a_state_argument():
    with pytest.raises(CellGraphError) as info:
        @cell
        def stateless(x):
            return {}
    assert info.value.field == "signature"


def test_combining_with_a_string_is_an_error():
    with pytest.raises(CellGraphError, match="str"):
        @cell
        def stringy(x, h):
            return {"h": tanh(W("W") @ x) + "1"}


def test_dsl_graph_round_trips_through_json():
    text = engine.to_json(numbers)
    assert engine.from_json(text) == numbers
