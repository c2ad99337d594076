"""engine.dsl_emit: a cell graph written back as DSL source that rebuilds the same graph.

Claims: every preset round-trips exactly (same nodes in the same order, names, states, output, doc)
and reads like its preset file; random cells built without the DSL (any node order, names that
look automatic, Python keywords, helper names) round-trip up to node order.
"""
from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest

import engine
from engine.dsl_emit import emit_dsl
from engine.ops import OPS

ROOT = Path(__file__).resolve().parents[1]


def rebuild(source: str) -> engine.CellGraph:
    namespace: dict = {}
    exec(compile(source, "<emitted>", "exec"), namespace)
    cells = [v for v in namespace.values() if isinstance(v, engine.CellGraph)]
    assert len(cells) == 1, source
    return cells[0]


def canonical(graph: engine.CellGraph) -> dict:
    """to_dict with the nodes keyed by name: equal graphs up to the order of their nodes."""
    d = engine.to_dict(graph)
    d["nodes"] = {n["name"]: n for n in d["nodes"]}
    return d


def function_body(source: str, name: str) -> list[str]:
    """The statements of `def name(...)` in a module's source, unparsed (so quotes and spacing agree)."""
    tree = ast.parse(source)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return [ast.unparse(s) for s in body]


@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_every_preset_round_trips_exactly(name):
    cell = engine.preset(name).cell
    source = emit_dsl(cell)
    rebuilt = rebuild(source)
    # The same nodes, states and output, and the parameters in the same order (their order of initialization). Ops
    # may come in another order where a helper made values before their first use in the emitted lines
    # (layer_norm's normalized parts), so the node tuples are compared as sets there.
    assert rebuilt.replace(nodes=tuple(sorted(rebuilt.nodes, key=lambda n: n.name))) == \
        cell.replace(nodes=tuple(sorted(cell.nodes, key=lambda n: n.name))), source
    assert [p.name for p in rebuilt.params] == [p.name for p in cell.params]
    if "layer_norm" not in (ROOT / "presets" / f"{name}.py").read_text():
        assert rebuilt == cell, source
        assert engine.to_json(rebuilt) == engine.to_json(cell)
    assert ".named(" not in source        # presets need no forced names


@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho"])
def test_presets_are_written_as_in_their_preset_file(name):
    emitted = function_body(emit_dsl(engine.preset(name).cell), name)
    written = function_body((ROOT / "presets" / f"{name}.py").read_text(), name)
    assert emitted == written


def test_emitted_lstm_names_the_gates_and_inlines_the_rest():
    source = emit_dsl(engine.preset("lstm").cell)
    assigned = re.findall(r"^    (\w+) = ", source, flags=re.M)
    assert assigned == ["i", "f", "g", "o", "c_next", "h_next"]
    assert source.startswith("# Cell 'lstm'")
    assert "from engine.dsl import W, b, cell, sigmoid, tanh\n" in source


# ---- cells built without the DSL ---------------------------------------------------------------------

TRICKY_NAMES = ["i_pre", "z_add", "a_mul_1", "W_x", "h_next", "gate", "tanh", "lambda", "b", "dsl", "_v0",
                "sigmoid_value", "c_1_0", "n", "cell", "const"]


def random_cell(rng: random.Random) -> engine.CellGraph:
    """A random valid cell as a JSON dict (not through the DSL), nodes in shuffled order."""
    names = iter(rng.sample(TRICKY_NAMES, len(TRICKY_NAMES)) + [f"v{k}" for k in range(200)])
    nodes = [{"name": "x", "op": "input"}, {"name": "h", "op": "state"}]
    dims = {"x": "I", "h": "H"}
    computed: list[str] = []
    states = ["h"]
    if rng.random() < 0.5:
        nodes.append({"name": "c", "op": "state"})
        dims["c"] = "H"
        states.append("c")

    def leaf(op: str, **attrs) -> str:
        name = next(names)
        nodes.append({"name": name, "op": op, "attrs": attrs})
        dims[name] = {"weight": attrs.get("rows"), "const": "1"}.get(op, attrs.get("dim", "H"))
        return name

    def vector_of(dim: str) -> str:
        pool = [n for n, d in dims.items() if d == dim and nodes_by_op(n) not in ("weight", "const")]
        return rng.choice(pool)

    def nodes_by_op(name: str) -> str:
        return next(n["op"] for n in nodes if n["name"] == name)

    for _ in range(rng.randint(3, 14)):
        op = rng.choice(sorted(OPS))
        name = next(names)
        if op == "matmul":
            operand = vector_of(rng.choice(["I", "H"]))
            weight = leaf("weight", rows="H", cols=dims[operand])
            nodes.append({"name": name, "op": op, "args": [weight, operand]})
            dims[name] = "H"
        elif OPS[op].arity == 2:
            a = vector_of("H")
            roll = rng.random()
            other = (leaf("const", value=rng.choice([1.0, 0.5, -2.0, 3.25])) if roll < 0.2 else
                     leaf(rng.choice(["bias", "vector"]), dim="H") if roll < 0.5 else vector_of("H"))
            args = [a, other] if rng.random() < 0.7 else [other, a]
            nodes.append({"name": name, "op": op, "args": args})
            dims[name] = "H"
        else:
            entry = {"name": name, "op": op, "args": [vector_of("H")]}
            if op == "scale":
                entry["attrs"] = {"factor": rng.choice([0.5, -1.5, 2.0])}
            nodes.append(entry)
            dims[name] = "H"
        computed.append(name)
    for _state in states:
        if not any(dims[c] == "H" for c in computed):
            name = next(names)
            nodes.append({"name": name, "op": "tanh", "args": ["h"]})
            dims[name] = "H"
            computed.append(name)
    state_entries = [{"name": s, "next": rng.choice([c for c in computed if dims[c] == "H"])} for s in states]
    if rng.random() < 0.3:
        nodes.append({"name": next(names), "op": "bias", "attrs": {"dim": "H"}})    # a parameter nobody reads
    rng.shuffle(nodes)
    return engine.from_dict({"schema": "rnn-cell-graph", "version": 1, "name": rng.choice(["rnd", "my cell", "W"]),
                             "doc": rng.choice(["", "One line.", "Two\nlines, with 'quotes' and \\ too."]),
                             "output": rng.choice(states), "nodes": nodes, "states": state_entries})


def test_random_cells_round_trip_up_to_node_order():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for _ in range(40):
        cell = random_cell(rng)
        source = emit_dsl(cell)
        rebuilt = rebuild(source)
        assert canonical(rebuilt) == canonical(cell), f"seed {seed}\n{source}"


def test_names_that_would_shadow_python_or_the_dsl():
    d = {"schema": "rnn-cell-graph", "version": 1, "name": "lambda", "doc": "", "output": "b",
         "nodes": [{"name": "x", "op": "input"}, {"name": "b", "op": "state"},
                   {"name": "W", "op": "weight", "attrs": {"rows": "H", "cols": "I"}},
                   {"name": "tanh", "op": "matmul", "args": ["W", "x"]},
                   {"name": "for", "op": "tanh", "args": ["tanh"]},
                   {"name": "c_2", "op": "const", "attrs": {"value": 2.0}},
                   {"name": "b_next", "op": "mul", "args": ["for", "c_2"]}],
         "states": [{"name": "b", "next": "b_next"}]}
    cell = engine.from_dict(d)
    source = emit_dsl(cell)
    assert "from engine import dsl" in source          # the state 'b' shadows the bias helper
    assert '.named("for")' in source and '.named("tanh")' in source
    assert '@dsl.cell(name="lambda", output="b")' in source
    assert canonical(rebuild(source)) == canonical(cell)


def test_unused_weight_is_reported_in_a_comment():
    d = engine.to_dict(engine.preset("elman_tanh").cell)
    d["nodes"].append({"name": "W_spare", "op": "weight", "attrs": {"rows": "H", "cols": "H"}})
    source = emit_dsl(engine.from_dict(d))
    assert '# weight "W_spare" is not used' in source
    rebuilt = rebuild(source)
    assert "W_spare" not in rebuilt.by_name and len(rebuilt.nodes) == len(d["nodes"]) - 1


def test_keyword_input_cannot_be_a_function_argument():
    d = engine.to_dict(engine.preset("elman_tanh").cell)
    old = d["nodes"][0]["name"]
    d["nodes"][0]["name"] = "in"
    for n in d["nodes"]:
        n["args"] = ["in" if a == old else a for a in n.get("args", [])] or n.pop("args", None) or []
        if not n["args"]:
            del n["args"]
    with pytest.raises(engine.CellGraphError) as info:
        emit_dsl(engine.from_dict(d))
    assert info.value.node == "in" and "hint" in str(info.value)
