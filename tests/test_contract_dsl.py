"""The error contract for the DSL: generated programs either build the cell they describe or raise CellGraphError.

A program is a list of steps over a growing list of values (the input x and the states first): weights applied
with @, biases, vectors and constants declared from small pools of names (so names meet again, with other sizes,
values or kinds), elementwise ops as functions or Python operators, numbers, deep chains and doublings, and steps
that are wrong on purpose (wrong arity, wrong types, comparisons, division, bad names, unknown or missing states).
Each program is built with @cell through contract.call. Where a cell comes out, it validates, its reference run
equals this file's own NumPy evaluation of the same program, and engine.dsl_emit's source rebuilds it.
"""
from __future__ import annotations

import numpy as np
from contract import call, examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import engine
from engine.dsl import W, b, cell, const, hard_sigmoid, identity, relu, sigmoid, tanh, v
from engine.dsl_emit import emit_dsl
from engine.ir import CellGraph

SIZES = {"I": 3, "H": 4}
UNARY = ("sigmoid", "tanh", "relu", "hard_sigmoid", "identity", "neg", "one_minus")
BINARY = ("add", "sub", "mul")
NUMBERS = (0.5, 2.0, 1.0, -1.0, 0.0, 3)
BAD_NUMBERS = (10 ** 400, float("nan"), True)
BAD_THINGS = ("s", None, [1.0], np.ones(2))
POOL = {"weight": ("W0", "W1", "p"), "bias": ("b0", "p"), "vector": ("u0", "p"), "const": ("k0", "c_0_5", "p")}

index = st.integers(0, 40)
valid_step = st.one_of(
    st.tuples(st.just("matmul"), st.sampled_from(POOL["weight"]), st.sampled_from(("H", "H", "I")), index),
    st.tuples(st.just("bias"), st.sampled_from(POOL["bias"]), st.sampled_from(("H", "H", "I"))),
    st.tuples(st.just("vector"), st.sampled_from(POOL["vector"]), st.sampled_from(("H", "H", "I"))),
    st.tuples(st.just("const"), st.sampled_from((0.5, 2.0, -1.0)), st.sampled_from((None, *POOL["const"]))),
    st.tuples(st.just("unary"), st.sampled_from(UNARY), index),
    st.tuples(st.just("binary"), st.sampled_from(BINARY), index, index),
    st.tuples(st.just("number"), st.sampled_from(("+", "r+", "*", "r*", "-", "r-")), index, st.sampled_from(NUMBERS)),
    st.tuples(st.just("chain"), index, index, st.integers(1, 300)),
    st.tuples(st.just("double"), index, st.integers(1, 30)),
    st.tuples(st.just("named"), index, st.sampled_from(("g", "x", "h_next", "gate"))),
)
invalid_step = st.one_of(
    st.tuples(st.just("arity"), st.sampled_from(UNARY[:5]), index, index),
    st.tuples(st.just("bad_arg"), st.sampled_from(UNARY[:5]), st.sampled_from(BAD_THINGS + (1.0,))),
    st.tuples(st.just("bad_combine"), index, st.sampled_from(BAD_THINGS)),
    st.tuples(st.just("bad_number"), index, st.sampled_from(BAD_NUMBERS)),
    st.tuples(st.just("compare"), index, index, st.sampled_from(("==", "!=", "<", "bool"))),
    st.tuples(st.just("floor_divide"), index),        # `/` builds a div op; `//` has no op
    st.tuples(st.just("bad_name"), st.sampled_from(("W", "b", "v", "const", "named")),
              st.sampled_from((5, None, "", "two words"))),
    st.tuples(st.just("weight_second"), index),
)


@st.composite
def programs(draw):
    states = draw(st.sampled_from((("h",), ("h", "c"))))
    valid = draw(st.booleans()) or draw(st.booleans())        # three in four programs have valid steps only
    step = valid_step if valid else st.one_of(valid_step, valid_step, invalid_step)
    steps = draw(st.lists(step, min_size=1, max_size=10))
    # A next value: a value of the program, or one projected to size H (tanh(W @ value): most such cells build).
    returns = {s: (draw(st.sampled_from((-1, -2))) if valid else draw(index), draw(st.booleans()) or valid)
               for s in states}
    ending = "all" if valid else draw(st.sampled_from(("all", "missing", "unknown", "number", "leaf")))
    return states, steps, returns, ending


class DslOps:
    """The program's steps in the DSL."""
    def weight(self, name, rows, value):
        return W(name, rows=rows) @ value

    def bias(self, name, dim):
        return b(name, dim=dim)

    def vector(self, name, dim):
        return v(name, dim=dim)

    def const(self, value, name):
        return const(value) if name is None else const(value, name)

    def unary(self, op, value):
        if op == "neg":
            return -value
        if op == "one_minus":
            return 1 - value
        return {"sigmoid": sigmoid, "tanh": tanh, "relu": relu, "hard_sigmoid": hard_sigmoid,
                "identity": identity}[op](value)


class NumpyOps:
    """The same steps on NumPy arrays (batch rows), with the parameters' values: the independent evaluation."""
    def __init__(self, params):
        self.params = params

    def weight(self, name, rows, value):
        return value @ self.params[name].T

    def bias(self, name, dim):
        return self.params[name]

    def vector(self, name, dim):
        return self.params[name]

    def const(self, value, name):
        return value

    def unary(self, op, value):
        return {"sigmoid": lambda a: 1 / (1 + np.exp(-a)), "tanh": np.tanh, "relu": lambda a: np.maximum(a, 0),
                "hard_sigmoid": lambda a: np.clip(a / 6 + 0.5, 0, 1), "identity": lambda a: a,
                "neg": lambda a: -a, "one_minus": lambda a: 1 - a}[op](value)


def execute(steps, values: list, ops, returns: dict, ending: str):
    """Run the program's steps over `values` (x and the states first) with `ops`; its return value."""
    values = list(values)
    at = lambda i: values[i % len(values)]  # noqa: E731
    for step in steps:
        kind, args = step[0], step[1:]
        if kind == "matmul":
            values.append(ops.weight(args[0], args[1], at(args[2])))
        elif kind == "bias":
            values.append(ops.bias(*args))
        elif kind == "vector":
            values.append(ops.vector(*args))
        elif kind == "const":
            values.append(ops.const(*args))
        elif kind == "unary":
            values.append(ops.unary(args[0], at(args[1])))
        elif kind == "binary":
            a, c = at(args[1]), at(args[2])
            values.append(a + c if args[0] == "add" else a - c if args[0] == "sub" else a * c)
        elif kind == "number":
            values.append(with_number(args[0], at(args[1]), args[2]))
        elif kind == "chain":
            a, c = at(args[0]), at(args[1])
            for _ in range(args[2]):
                a = a + c
            values.append(a)
        elif kind == "double":
            a = at(args[0])
            for _ in range(args[1]):
                a = a + a
            values.append(a)
        elif kind == "named":
            a = at(args[0])
            values.append(a.named(args[1]) if hasattr(a, "named") else a)
        else:
            invalid(kind, args, at)
    result = {s: ops.unary("tanh", ops.weight(f"W_{s}", "H", at(i))) if projected else at(i)
              for s, (i, projected) in returns.items()}
    if ending == "missing" and len(result) > 1:
        result.pop(next(iter(result)))
    elif ending == "unknown":
        result["k"] = at(0)
    elif ending == "number":
        result[next(iter(result))] = 1.0
    elif ending == "leaf":
        result[next(iter(result))] = values[0]
    return result


def with_number(operator: str, a, n):
    """a combined with the number n by a Python operator ("r+": the number on the left)."""
    if operator == "+":
        return a + n
    if operator == "r+":
        return n + a
    if operator == "*":
        return a * n
    if operator == "r*":
        return n * a
    return a - n if operator == "-" else n - a


def invalid(kind, args, at):
    """The steps that are wrong on purpose (only reached while building: they raise)."""
    functions = {"sigmoid": sigmoid, "tanh": tanh, "relu": relu, "hard_sigmoid": hard_sigmoid, "identity": identity}
    if kind == "arity":
        functions[args[0]](at(args[1]), at(args[2]))
    elif kind == "bad_arg":
        functions[args[0]](args[1])
    elif kind == "bad_combine":
        at(args[0]) + args[1]
    elif kind == "bad_number":
        at(args[0]) * args[1]
        at(args[0]) + args[1]
    elif kind == "compare":
        a, c = at(args[0]), at(args[1])
        if {"==": lambda: a == c, "!=": lambda: a != c, "<": lambda: a < c, "bool": lambda: bool(a)}[args[2]]():
            pass
    elif kind == "floor_divide":
        at(args[0]) // 2
    elif kind == "bad_name":
        helper, name = args
        {"W": lambda: W(name) @ at(0), "b": lambda: b(name), "v": lambda: v(name), "const": lambda: const(1.0, 5 if name is None else name),
         "named": lambda: (at(0) * 1.0).named(name)}[helper]()
    elif kind == "weight_second":
        at(args[0]) @ W("W0")
    raise AssertionError(f"the invalid step {kind}{args} did not raise")


def build(program) -> CellGraph:
    states, steps, returns, ending = program

    def body(x, *state_values):
        return execute(steps, [x, *state_values], DslOps(), returns, ending)

    if states == ("h",):
        def step(x, h):
            return body(x, h)
    else:
        def step(x, h, c):
            return body(x, h, c)
    return cell(step)


def numpy_run(program, graph: CellGraph, params, x, initial):
    """Outputs (T, B, H) and final states of the program, evaluated step by step in NumPy."""
    states, steps, returns, _ = program
    current = {s: initial[s][0] for s in states}
    outputs = []
    with np.errstate(all="ignore"):
        for t in range(x.shape[0]):
            result = execute(steps, [x[t], *(current[s] for s in states)], NumpyOps(params), returns, "all")
            current = {s: np.broadcast_to(np.asarray(result[s], dtype=np.float64), current[s].shape)
                       for s in states}
            outputs.append(current[graph.output])
    return np.stack(outputs), current


def same_cell(a: CellGraph, b: CellGraph) -> bool:
    """The same nodes (names, ops, arguments, attributes), states, output, name and doc. The order of the nodes may
    differ: the emitted source creates a value written inline where its consumer is computed."""
    def nodes(graph):
        return {n["name"]: n for n in graph.structure()["nodes"]}
    strip = lambda g: {k: v for k, v in g.structure().items() if k != "nodes"}  # noqa: E731
    return nodes(a) == nodes(b) and strip(a) == strip(b) and (a.name, a.doc) == (b.name, b.doc)


def rebuilt(source: str) -> CellGraph:
    namespace: dict = {}
    exec(compile(source, "<emitted>", "exec"), namespace)  # noqa: S102 - the emitter's own output
    return next(value for value in namespace.values() if isinstance(value, CellGraph))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_generated_programs_build_what_they_say_or_raise(program):
    outcome = call(build, program, deadline_s=30)
    event("built" if outcome.ok else "CellGraphError")
    if not outcome.ok:
        return
    graph = outcome.result
    assert call(graph.replace).ok                                        # it validates again, from its nodes
    again = rebuilt(call(emit_dsl, graph).result)
    assert same_cell(again, graph)
    if len(graph.nodes) > 400:
        return                                                          # the long chains: structure only
    event("compared with NumPy")
    network = engine.Network(graph, input_size=SIZES["I"], hidden_size=SIZES["H"])
    params = engine.init_params(network, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2, SIZES["I"]))
    initial = {s: rng.uniform(-0.8, 0.8, (1, 2, SIZES["H"])) for s in graph.state_names}
    with np.errstate(all="ignore"):
        result = engine.run(network, params, x, initial, backend="reference", dtype=np.float64)
    outputs, final = numpy_run(program, graph, params[0], x, initial)
    np.testing.assert_allclose(result.outputs, outputs, rtol=1e-9, atol=1e-12, equal_nan=True)
    for s in graph.state_names:
        np.testing.assert_allclose(result.final_states[s][0], final[s], rtol=1e-9, atol=1e-12, equal_nan=True)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(valid_step, min_size=1, max_size=8), st.sampled_from((("h",), ("h", "c"))))
def test_valid_programs_build(steps, states):
    """Programs of valid steps whose every next value is H-sized build (the family's positive half)."""
    program = (states, [("matmul", "W_in", "H", 0), *steps, ("unary", "tanh", -1)], {s: (-1, False) for s in states},
               "all")
    outcome = call(build, program, deadline_s=30)
    if outcome.ok:
        assert set(outcome.result.state_names) == set(states)
