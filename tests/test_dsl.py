"""The Python DSL: node names from local variables, numbers as ops, and errors at definition time."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


# ---- a name declared twice, wrong-type arguments, comparisons: each an error, never a silent wrong cell ----------

def build_error(body) -> CellGraphError:
    """The CellGraphError of building a cell whose step is `body(x, h)`."""
    def step(x, h):
        return {"h": body(x, h)}
    with pytest.raises(CellGraphError) as info:
        cell(step)
    assert "hint:" in str(info.value)
    return info.value


@pytest.mark.parametrize("body, node, field", [
    (lambda x, h: tanh(W("W") @ x + const(0.5, "k") * h + const(2.0, "k")), "k", "attrs.value"),
    (lambda x, h: tanh(W("W") @ x + W("W", rows="P") @ x), "W", "attrs.rows"),
    (lambda x, h: tanh(W("W") @ x + b("p") + b("p", dim="I")), "p", "attrs.dim"),
    (lambda x, h: tanh(W("W") @ x + v("u") * h + v("u", dim="I")), "u", "attrs.dim"),
], ids=["const-value", "weight-rows", "bias-dim", "vector-dim"])
def test_a_parameter_declared_again_differently_is_an_error(body, node, field):
    error = build_error(body)
    assert (error.node, error.field) == (node, field)


@pytest.mark.parametrize("body", [
    lambda x, h: tanh(W("W") @ x + const(2.0, "c_0_5") + h + 0.5),      # the user's first, the number's second
    lambda x, h: tanh(W("W") @ x + 0.5 + h + const(2.0, "c_0_5")),      # the number's first
    lambda x, h: tanh(W("W") @ x + 0.5 + b("c_0_5")),                   # a parameter of another kind
], ids=["user-first", "number-first", "bias"])
def test_an_automatic_constant_name_taken_by_the_user_is_an_error(body):
    error = build_error(body)
    assert error.node == "c_0_5" and "on its own" in str(error)


def test_the_same_parameter_declared_twice_alike_is_one_node():
    @cell
    def twice(x, h):
        return {"h": tanh(W("W") @ x + b("p") + b("p") + const(0.5, "k") * h + const(0.5, "k") + 0.5 + 0.5)}
    names = [n.name for n in twice.nodes]
    assert names.count("p") == names.count("k") == names.count("c_0_5") == 1


@pytest.mark.parametrize("compare", [
    lambda a, h: a == h, lambda a, h: a != h, lambda a, h: a < h, lambda a, h: a >= 0.5, lambda a, h: bool(a),
    lambda a, h: a if a else h, lambda a, h: a in [h],
], ids=["==", "!=", "<", ">=", "bool", "if", "in"])
def test_comparing_cell_values_is_an_error(compare):
    build_error(lambda x, h: compare(tanh(W("W") @ x), h))


@pytest.mark.parametrize("body, field", [
    (lambda x, h: tanh(W(5) @ x), "name"),
    (lambda x, h: tanh(W("W x") @ x), "name"),
    (lambda x, h: tanh(W("W", rows="Q") @ x), "rows"),
    (lambda x, h: tanh(W("W") @ x + b(None)), "name"),
    (lambda x, h: tanh(W("W") @ x + v("u", dim=3) * h), "dim"),
    (lambda x, h: tanh(W("W") @ x + const("a")), "const() argument 'value'"),
    (lambda x, h: tanh(W("W") @ x + const(float("nan"))), "const() argument 'value'"),
    (lambda x, h: tanh(W("W") @ x + const(1.0, name=3)), "name"),
    (lambda x, h: tanh(W("W") @ x, h), "args"),
    (lambda x, h: tanh(x=W("W") @ x), "x"),
    (lambda x, h: tanh(1.0), "x"),
    (lambda x, h: tanh(W("W") @ x) * 10 ** 400, "the factor in '*'"),
    (lambda x, h: tanh(W("W") @ x) // 2, "'//'"),
    (lambda x, h: tanh(W("W") @ x) / "2", "/"),
    (lambda x, h: x @ W("W"), "'@'"),
    (lambda x, h: tanh(W("W") @ x).named(7), "name"),
], ids=["W-int", "W-space", "W-rows", "b-None", "v-dim", "const-str", "const-nan", "const-name", "arity",
        "keyword", "number-arg", "huge-factor", "floor-division", "divide-by-text", "weight-second", "named-int"])
def test_wrong_arguments_to_dsl_helpers_name_the_argument(body, field):
    assert build_error(body).field == field


@pytest.mark.parametrize("options, field", [
    ({"name": 5}, "name"), ({"output": None}, "output"), ({"input_is_hidden": "yes"}, "input_is_hidden"),
    ({"state_dims": ["h"]}, "state_dims"), ({"state_dims": {"h": "Q"}}, "state_dims['h']"),
    ({"state_dims": {"k": "P"}}, "state_dims"),
])
def test_wrong_cell_options_name_the_option(options, field):
    with pytest.raises(CellGraphError) as info:
        cell(lambda x, h: {"h": tanh(W("W") @ x)}, **options)
    assert info.value.field == field and "hint:" in str(info.value)


def test_a_value_of_another_cell_is_an_error():
    leaked = []

    @cell
    def first(x, h):
        leaked.append(h)
        return {"h": tanh(W("W") @ x)}

    with pytest.raises(CellGraphError, match="another @cell"):
        @cell
        def second(x, h):
            return {"h": tanh(W("W") @ x) + leaked[0]}
    with pytest.raises(CellGraphError, match="outside the @cell"):
        leaked[0] + leaked[0]


# ---- under a profiler or a debugger ------------------------------------------------------------------------------

PROFILED = '''
import sys
from engine.dsl import W, b, cell, tanh
seen = []
def tracer(frame, event, arg):
    seen.append(event)
    return tracer
if sys.argv[1:] == ["trace"]:
    sys.settrace(tracer)
@cell
def rnn(x, h):
    pre = W("W_x") @ x + W("W_h") @ h + b("b")
    return {"h": tanh(pre)}
assert sys.gettrace() is (tracer if sys.argv[1:] == ["trace"] else None)
sys.settrace(None)
assert "pre" in [n.name for n in rnn.nodes]
print("built", len(rnn.nodes))
'''


@pytest.mark.parametrize("how", [["-m", "cProfile", "-o", "{out}"], []], ids=["cProfile", "settrace"])
def test_a_cell_builds_under_a_profiler_and_a_debugger(tmp_path, how):
    script = tmp_path / "profiled.py"
    script.write_text(PROFILED)
    args = [a.format(out=tmp_path / "profile.out") for a in how] + [str(script)] + ([] if how else ["trace"])
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "built 10" in done.stdout


@pytest.mark.parametrize("call", [lambda: W("w", "H", 3, 5), lambda: W(rows="H"), lambda: b("b", foo=1),
                                  lambda: v(), lambda: const()], ids=["W-extra", "W-missing", "b-keyword",
                                                                      "v-missing", "const-missing"])
def test_a_helper_called_with_arguments_it_does_not_take_names_them(call):
    def bad(x, h):
        call()
        return {"h": h}
    with pytest.raises(CellGraphError, match=r"field 'args'.*\n  hint: write "):
        cell(bad)


@pytest.mark.parametrize("number", [10**400, 10**5000, -(10**400)], ids=["1e400", "5000-digits", "-1e400"])
def test_an_integer_beyond_float_range_is_refused_by_its_size(number):
    with pytest.raises(CellGraphError, match=r"must be a finite number, got an integer of \d+ bits"):
        cell(lambda x, h: {"h": W("w") @ x + const(number)})
    with pytest.raises(CellGraphError, match=r"must be a finite number, got an integer of \d+ bits"):
        cell(lambda x, h: {"h": (W("w") @ x) * number})
