"""Property-based tests (hypothesis) over random cell graphs: the whole op set, 1-3 states, matmuls on x and on
h, dependent matmuls such as U(r * h), elementwise chains, parameters of every kind.

- A random valid cell validates, and the compiled plan, run by the NumPy plan interpreter with every pass on
  and in both weight layouts, computes what the reference computes (float64, to 1e-10).
- Its CUDA renders: the fused module and, where the wavefront schedules can run it, their kernels in
  float32 and bfloat16; a few examples also compile with nvcc (marked `nvcc`).
- A random mutation of a valid cell's JSON (a dangling argument, an unknown op, a duplicate name, a cycle, a
  wrong attribute, a missing field) is refused with CellGraphError naming a node or a field, never any other
  exception.
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nvcc_check import CHECK_ONLY

import engine
from engine.backends import plan_numpy
from engine.codegen.equations import text_equations
from engine.dsl_emit import emit_dsl
from engine.errors import CellGraphError

UNARY = ("neg", "one_minus", "sigmoid", "tanh", "relu", "hard_sigmoid", "identity")
BINARY = ("add", "sub", "mul")


@st.composite
def cell_designs(draw) -> dict:
    """A valid cell as engine.to_dict JSON. Every value is H-sized except x; the states' next values are drawn
    from the computed values, so the recurrence may run through any chain of ops."""
    nodes = [{"name": "x", "op": "input"}]
    n_states = draw(st.integers(1, 3))
    states = [f"s{i}" for i in range(n_states)]
    nodes += [{"name": s, "op": "state"} for s in states]
    pool = list(states)                      # H-sized values available as arguments
    computed: list[str] = []
    count = 0

    auto = draw(st.booleans())               # name computed values as the DSL names its own ("v3_add"), so the
    #                                          equation renderers inline them and their parentheses matter

    def new(prefix: str, op: str | None = None) -> str:
        nonlocal count
        count += 1
        return f"{prefix}{count}_{op}" if auto and op and draw(st.booleans()) else f"{prefix}{count}"

    def add(node: dict) -> str:
        nodes.append(node)
        return node["name"]

    # At least one projection of x, so that every cell has an input GEMM to hoist.
    w = add({"name": new("W"), "op": "weight", "attrs": {"rows": "H", "cols": "I"}})
    pool.append(add({"name": new("Wx"), "op": "matmul", "args": [w, "x"]}))
    computed.append(pool[-1])
    for _ in range(draw(st.integers(2, 14))):
        kind = draw(st.sampled_from(("matmul_h", "matmul_x", "unary", "binary", "bias", "vector", "scale")))
        if kind == "matmul_h":                               # on a state or on any computed value: U(r * h)
            u = add({"name": new("U"), "op": "weight", "attrs": {"rows": "H", "cols": "H"}})
            value = add({"name": new("Uv"), "op": "matmul", "args": [u, draw(st.sampled_from(pool))]})
        elif kind == "matmul_x":
            w = add({"name": new("W"), "op": "weight", "attrs": {"rows": "H", "cols": "I"}})
            value = add({"name": new("Wx"), "op": "matmul", "args": [w, "x"]})
        elif kind == "unary":
            op = draw(st.sampled_from(UNARY))
            value = add({"name": new("u", op), "op": op, "args": [draw(st.sampled_from(pool))]})
        elif kind == "binary":
            a, b, op = draw(st.sampled_from(pool)), draw(st.sampled_from(pool)), draw(st.sampled_from(BINARY))
            value = add({"name": new("v", op), "op": op, "args": [a, b]})
        elif kind == "bias":
            bias = add({"name": new("b"), "op": "bias", "attrs": {"dim": "H"}})
            value = add({"name": new("pb"), "op": "add", "args": [draw(st.sampled_from(pool)), bias]})
        elif kind == "vector":
            vec = add({"name": new("p"), "op": "vector", "attrs": {"dim": "H"}})
            value = add({"name": new("pv"), "op": "mul", "args": [vec, draw(st.sampled_from(pool))]})
        else:
            factor = draw(st.sampled_from((0.5, -1.5, 2.0)))
            value = add({"name": new("k", "scale"), "op": "scale", "args": [draw(st.sampled_from(pool))],
                         "attrs": {"factor": factor}})
        pool.append(value)
        computed.append(value)
    # Squash each next value into (-1, 1) so that three steps of products stay finite.
    spec = []
    for s in states:
        nxt = add({"name": f"{s}_next", "op": "tanh", "args": [draw(st.sampled_from(computed))]})
        spec.append({"name": s, "next": nxt})
    return {"schema": "rnn-cell-graph", "version": 1, "name": "fuzzed", "doc": "", "output": "s0",
            "nodes": nodes, "states": spec}


def case(cell, num_layers=2, seed=0):
    network = engine.Network(cell, input_size=5, hidden_size=6, num_layers=num_layers)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 2, 5))
    states = {s: rng.uniform(-0.9, 0.9, (num_layers, 2, 6)) for s in cell.state_names}
    return network, params, x, states


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(cell_designs())
def test_random_cells_compile_to_a_plan_that_computes_the_reference(design):
    cell = engine.from_dict(design)
    network, params, x, states = case(cell)
    ref = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
    assert np.isfinite(ref.outputs).all()
    for layout in ("blocked", "interleaved"):
        got = plan_numpy.run(network, params, x, states, layout=layout, chunk_steps=2)
        errors = [np.abs(got.outputs - ref.outputs).max()]
        errors += [np.abs(got.final_states[s] - ref.final_states[s]).max() for s in ref.final_states]
        assert max(errors) < 1e-10, (layout, max(errors), json.dumps(design))


def render_all(cell) -> dict[str, str]:
    """Every CUDA source the engine generates for the cell: the fused module, and the wavefront kernels
    (persistent and graph; float32 and bfloat16) where the schedules can run it."""
    from engine.codegen import compile_module  # noqa: F401 - the import path the fused backend uses
    from engine.codegen.wavefront import render_wavefront
    from engine.compiler import make_plan
    from engine.schedules.tiling import H100, TileConfig, eligibility, make_tiling
    network = engine.Network(cell, input_size=5, hidden_size=6, num_layers=2)
    sources = {"fused": engine.explain_json(cell, input_size=5, hidden_size=6, num_layers=2, steps=3,
                                            batch=2)["source"]}
    for precision in ("float32", "bfloat16"):
        for batch in (2, 19):                               # the warp GEMV and the tiled / tensor-core path
            plan = make_plan(network, 3, batch, layout="interleaved", precision=precision)
            if eligibility(plan.program) is not None:
                continue
            for persistent in (True, False):
                tiling = make_tiling(plan.program, network, batch, TileConfig(), H100, persistent=persistent)
                sources[f"{precision}-B{batch}-{'persistent' if persistent else 'graph'}"] = \
                    render_wavefront(plan.program, network, tiling)
    return sources


@FAST
@given(cell_designs())
def test_random_cells_render_their_cuda(design):
    sources = render_all(engine.from_dict(design))
    for name, source in sources.items():
        assert "__global__" in source, name


class _Weight:
    """A weight in an evaluated text equation: `W ** v` is the matmul W v (** binds tighter than *, / and unary
    minus, and groups to the right, as juxtaposition reads: a * W U v is a * (W (U v)))."""

    def __init__(self, matrix):
        self.matrix = matrix

    def __pow__(self, operand):
        return self.matrix @ operand


def evaluate_text_equations(cell, params: dict, x_t, states: dict) -> dict:
    """One step of the cell computed from its plain-text equations alone (engine.codegen.equations): values as
    (size, batch) columns. Returns each state's next value."""
    from engine.ops import OPS
    env = {op: OPS[op].numpy for op in ("sigmoid", "tanh", "relu", "hard_sigmoid", "identity")}
    weights = [n.name for n in cell.nodes if n.op == "weight"]
    for n in cell.nodes:
        if n.op == "weight":
            env[n.name] = _Weight(params[n.name])
        elif n.op in ("bias", "vector"):
            env[n.name] = np.asarray(params[n.name])[:, None]
        elif n.op == "input":
            env[f"{n.name}__t"] = x_t.T
        elif n.op == "state":
            env[f"{n.name}__prev"] = states[n.name].T
    nexts = {}
    for line in text_equations(cell):
        lhs, rhs = line.split(" = ", 1)
        rhs = re.sub(r"\b(\w+)\[t-1\]", r"\1__prev", rhs)
        rhs = re.sub(r"\b(\w+)\[t\]", lambda m: f"{m.group(1)}__t" if cell[m.group(1)].op == "input"
                     else f"{m.group(1)}__next", rhs)
        for w in weights:                  # W x, W (a + b); "W -x" stays a (failing) subtraction: write W (-x)
            rhs = re.sub(rf"\b{w} (?=[\w(])", f"{w} ** ", rhs)
        value = eval(rhs, {"__builtins__": {}}, env)                           # noqa: S307 - our own text
        key = lhs[:-3] + "__next" if lhs.endswith("[t]") else lhs
        env[key] = value
        if lhs.endswith("[t]"):
            nexts[lhs[:-3]] = value.T
    return nexts


@FAST
@given(cell_designs())
def test_random_cells_equations_compute_the_cell_and_the_dsl_rebuilds_it(design):
    """The plain-text equations, evaluated as written, give the reference's step (so their parentheses are right);
    the LaTeX renders a line per named value; the DSL the engine writes rebuilds the same graph."""
    cell = engine.from_dict(design)
    network, params, x, states = case(cell, num_layers=1)
    one = engine.run(network, params, x[:1], {k: v for k, v in states.items()}, backend="reference",
                     dtype=np.float64)
    got = evaluate_text_equations(cell, params[0], x[0], {k: v[0] for k, v in states.items()})
    for s in cell.state_names:
        assert np.allclose(got[s], one.final_states[s][0], rtol=1e-12, atol=1e-12), (s, text_equations(cell))
    assert engine.to_latex(cell).count("&=") == len(text_equations(cell))      # every next value is a named node
    namespace: dict = {}
    exec(compile(emit_dsl(cell), "<emitted>", "exec"), namespace)              # noqa: S102 - our own source
    (rebuilt,) = [v for v in namespace.values() if isinstance(v, engine.CellGraph)]
    original, again = engine.to_dict(cell), engine.to_dict(rebuilt)
    assert {n["name"]: n for n in again["nodes"]} == {n["name"]: n for n in original["nodes"]}
    assert again["states"] == original["states"] and again["output"] == original["output"]


@pytest.mark.nvcc
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell_designs())
def test_random_cells_cuda_compiles_with_nvcc(tmp_path_factory, design):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    folder = tmp_path_factory.mktemp("fuzz")
    for name, source in render_all(engine.from_dict(design)).items():
        if name.endswith("-graph") or name.startswith("float32-B2"):
            continue                                        # same stage code as the persistent kernel
        path = folder / f"{name}.cu"
        path.write_text(source)
        cmd = ["nvcc", "-arch=sm_90", "-std=c++17", *CHECK_ONLY, "-rdc=true", "--cubin", "-o", str(path.with_suffix(".cubin")),
               str(path)]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        assert done.returncode == 0, f"{name}:\n{done.stdout[-3000:]}\n{json.dumps(design)}"


# ---- invalid graphs ---------------------------------------------------------------------------------

def _dangling(d, rng):
    node = rng.choice([n for n in d["nodes"] if n.get("args")])
    node["args"][rng.integers(len(node["args"]))] = "no_such_node"


def _unknown_op(d, rng):
    rng.choice(d["nodes"][1:])["op"] = "softplus_typo"


def _duplicate(d, rng):
    d["nodes"].append(copy.deepcopy(rng.choice(d["nodes"][1:])))


def _cycle(d, rng):
    computed = [n for n in d["nodes"] if n.get("args") and n["op"] != "matmul"]
    first, last = computed[0], computed[-1]
    first["args"][0] = last["name"]
    if last["name"] == first["name"]:
        first["args"][0] = first["name"]


def _bad_attr(d, rng):
    weight = next(n for n in d["nodes"] if n["op"] == "weight")
    weight["attrs"]["rows"] = rng.choice(["Q", 3, None])


def _missing_field(d, rng):
    key = rng.choice(["nodes", "states", "output"])
    del d[key]


def _bad_output(d, rng):
    d["output"] = "nowhere"


def _wrong_arity(d, rng):
    node = next(n for n in d["nodes"] if n["op"] in BINARY)
    node["args"] = node["args"][:1]


def _state_next_unknown(d, rng):
    d["states"][0]["next"] = "ghost"


MUTATIONS = [_dangling, _unknown_op, _duplicate, _cycle, _bad_attr, _missing_field, _bad_output, _wrong_arity,
             _state_next_unknown]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell_designs(), st.sampled_from(MUTATIONS), st.integers(0, 2**31 - 1))
def test_mutated_cells_are_refused_by_name_never_with_another_exception(design, mutate, seed):
    if mutate is _wrong_arity and not any(n["op"] in BINARY for n in design["nodes"]):
        return
    if mutate is _cycle and sum(1 for n in design["nodes"] if n.get("args") and n["op"] != "matmul") < 2:
        return
    bad = copy.deepcopy(design)
    mutate(bad, np.random.default_rng(seed))
    try:
        cell = engine.from_dict(bad)
    except CellGraphError as e:
        assert e.problems and all(p.node or p.field for p in e.problems), (mutate.__name__, str(e))
        return
    # A mutation may leave a valid cell (a cycle through a state's next is a recurrence, not a loop): then it
    # must also run.
    network, params, x, states = case(cell, num_layers=1)
    engine.run(network, params, x, states, backend="reference", dtype=np.float64)
