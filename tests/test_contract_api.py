"""The error contract for the Python API (the names in engine.__all__): a correct result, or the engine's own error
naming the argument, field or node, with a hint.

Families:
- cell dicts: valid presets' JSON mutated at random paths (any JSON value, deep nesting, long integers, inf/nan as
  strings, missing and extra keys) -> from_dict / from_json / load; what is accepted round-trips;
- arguments: a table of entries x arguments, each argument replaced by a generated bad value (wrong types, zero,
  negative, huge, NumPy scalars); where the call is valid, engine.run's result is compared with the reference run
  of the same network built from plain Python values;
- memory: sizes that would need terabytes are refused before anything is allocated, naming the figure and limit.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from contract import call, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine import memory
from engine.errors import BackendError, CellGraphError, EngineError
from engine.training import results as train_results

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PRESETS = sorted(engine.presets())
CELL = engine.preset("lstm").cell
NETWORK = engine.Network(CELL, 3, 4, 2)
PARAMS = engine.init_params(NETWORK, seed=0)
X = np.random.default_rng(0).standard_normal((5, 2, 3))


# ---- generated values -------------------------------------------------------------------------------------------

def nested(depth: int):
    value = []
    for _ in range(depth):
        value = [value]
    return value


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.integers(-(2**70), 2**70),
                      st.floats(allow_nan=False, allow_infinity=False),
                      st.sampled_from(["inf", "-inf", "nan", "NaN", "Infinity", "", "H", "I", "P", "h", "x"]),
                      st.text(max_size=8), st.just(10**4000), st.just(1e308), st.just(-1e300))
json_value = st.one_of(json_leaf, st.integers(1, 300).map(nested),   # deeper: test_contract_files
                       st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                       st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3)), max_leaves=6))


def paths(value, prefix=()):
    """Every path into a JSON value, 4 levels deep at most (a cell's JSON is 4 deep): tuples of keys and indices."""
    yield prefix
    if len(prefix) >= 4:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, prefix + (index,))


@st.composite
def mutated_cell_dict(draw):
    data = engine.to_dict(engine.preset(draw(st.sampled_from(PRESETS))).cell)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(list(paths(data))))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if not where:
            data = draw(json_value) if action == "replace" else data
            continue
        parent = data
        for step in where[:-1]:
            parent = parent[step]
        last = where[-1]
        if action == "replace":
            parent[last] = draw(json_value)
        elif action == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=6))] = draw(json_value)
        else:
            parent.insert(last, draw(json_value))
        if not isinstance(data, (dict, list)):
            break
    return data


def dumps(data) -> str | None:
    """The JSON text of a generated value, or None where the json module itself cannot write it."""
    try:
        return json.dumps(data)
    except (ValueError, RecursionError):
        return None


@settings(max_examples=examples(60), **SETTINGS)
@given(data=mutated_cell_dict())
def test_mutated_cell_dicts_load_or_are_refused_and_what_loads_round_trips(data, tmp_path):
    outcome = call(engine.from_dict, data)
    text = dumps(data)
    if text is not None:
        from_text = call(engine.from_json, text)
        assert (from_text.error is None) == (outcome.error is None) or "digits" in str(from_text.error)
        path = tmp_path / "cell.json"
        path.write_text(text)
        call(engine.load, path)
    if outcome.ok:
        cell = outcome.result
        assert engine.from_dict(engine.to_dict(cell)) == cell
        assert engine.from_json(engine.to_json(cell)) == cell
        assert isinstance(call(engine.to_latex, cell).result, str)


def const_cell(value) -> dict:
    """The lstm's JSON with its output scaled by a constant `value`."""
    data = engine.to_dict(CELL)
    nodes = data["nodes"]
    h_next = next(n for n in nodes if n["name"] == "h_next")
    h_next["name"] = "h_unscaled"
    for node in nodes:
        node["args"] = ["h_unscaled" if a == "h_next" else a for a in node.get("args", [])]
    nodes += [{"name": "k", "op": "const", "attrs": {"value": value}},
              {"name": "h_next", "op": "mul", "args": ["k", "h_unscaled"]}]
    return data


@pytest.mark.parametrize("value", [10**400, 1e308, -3.5e38, 10**4000], ids=["1e400", "1e308", "-3.5e38", "1e4000"])
def test_a_constant_beyond_float32_is_refused_at_load_naming_the_node(value):
    outcome = call(engine.from_dict, const_cell(value))
    assert isinstance(outcome.error, CellGraphError)
    assert outcome.error.node == "k" and outcome.error.field == "attrs.value"


def test_a_constant_in_range_runs():
    cell = engine.from_dict(const_cell(0.5))
    network = engine.Network(cell, 3, 4)
    result = engine.run(network, engine.init_params(network), X, backend="reference", dtype=np.float64)
    assert np.isfinite(result.outputs).all()


# ---- arguments: entries x generated bad values ----------------------------------------------------------------

bad_value = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([10**12, 2**63, -(2**31), 10**4000]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.sampled_from(["lstm", "reference", "x"]),
    st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([np.int64(3), np.int32(4), np.float64(2.0), np.bool_(True), np.ones((2, 2)),
                     np.zeros((5, 2, 3), dtype=np.int64), np.zeros((5, 2, 3), dtype=object), CELL, NETWORK, PARAMS,
                     engine.preset("gru"), np.float16, "float16", np.complex64]))


def small_net():
    return engine.Net(3, (engine.Layers("lstm", 4), engine.Pool("max", 2, 2)))


# entry: (function, valid positional args, valid keyword args). One argument at a time is replaced.
ENTRIES = {
    "run": (engine.run, (NETWORK, PARAMS, X, None), dict(backend="reference", dtype=np.float64,
                                                         precision="float32", check_finite=False)),
    "init_params": (engine.init_params, (NETWORK, 0, np.float64), {}),
    "Network": (engine.Network, (CELL, 3, 4, 2, None), {}),
    "explain_text": (engine.explain_text, ("lstm", 3, 4, 1, 5, 2), dict(sources=False)),
    "explain_json": (engine.explain_json, ("lstm", 3, 4, 1, 5, 2), {}),
    "export_cuda": (engine.export_cuda, ("lstm", 3, 4, 1), {}),
    "to_json": (engine.to_json, (CELL,), {}),
    "to_latex": (engine.to_latex, (CELL,), {}),
    "from_dict": (engine.from_dict, (engine.to_dict(CELL),), {}),
    "from_json": (engine.from_json, (engine.to_json(CELL),), {}),
    "preset": (engine.preset, ("lstm",), {}),
    "net_preset": (engine.net_preset, ("stack",), {}),
    "Layers+Net": (lambda cell, h, layers, direction, merge: engine.Net(3, (engine.Layers(cell, h, layers, direction,
                                                                                          merge),)),
                   ("lstm", 4, 1, "forward", "concat"), {}),
    "Pool+Net": (lambda op, window, stride: engine.Net(3, (engine.Layers("lstm", 4), engine.Pool(op, window, stride))),
                 ("max", 2, 2), {}),
    "Net": (engine.Net, (3, (engine.Layers("lstm", 4),)), {}),
    "init_net_params": (engine.init_net_params, (small_net(), 0, np.float64), {}),
    "run_net": (engine.run_net, (small_net(), engine.init_net_params(small_net()), X), dict(backend="reference")),
    "net_from_dict": (engine.net_from_dict, (engine.net_to_dict(small_net()),), {}),
    "net_to_json": (engine.net_to_json, (small_net(),), {}),
    "Params": (lambda layers: engine.run(NETWORK, engine.Params(layers), X, backend="reference"), (PARAMS.layers,), {}),
    "bptt": (engine.bptt, (NETWORK, PARAMS, X), dict(backend="reference")),
    "backward_graph": (engine.backward_graph, (CELL,), {}),
    # On a GPU a valid call is a real benchmark: one tiny config, one implementation, a time budget that ends it.
    "bench": (engine.bench, (["lstm"],), dict(configs=["2,8,1,4,2"], implementations=["auto"], quick=True,
                                               time_budget_s=5.0, out_dir=None)),
}
# A replaced argument may undo what keeps a benchmark short (every anchor config, every implementation): those
# calls run until the time budget ends them, compiling what they start.
DEADLINE_S = {"bench": 240.0}


def arguments(name: str):
    fn, args, kwargs = ENTRIES[name]
    return [("arg", i) for i in range(len(args))] + [("kw", k) for k in kwargs]


@pytest.mark.parametrize("name", sorted(ENTRIES))
@settings(max_examples=examples(20, share=len(ENTRIES)), **SETTINGS)
@given(data=st.data())
def test_every_entry_answers_a_bad_argument_with_its_own_error(name, data):
    fn, args, kwargs = ENTRIES[name]
    kind, which = data.draw(st.sampled_from(arguments(name)))
    value = data.draw(bad_value)
    args, kwargs = list(args), dict(kwargs)
    if kind == "arg":
        args[which] = value
    else:
        kwargs[which] = value
    outcome = call(fn, *args, deadline_s=DEADLINE_S.get(name), **kwargs)
    if name == "run" and outcome.ok and kind == "kw":    # valid after all: the reference of the same settings
        want = engine.run(NETWORK, PARAMS, X, **dict(kwargs, backend="reference"))
        assert np.allclose(outcome.result.outputs, want.outputs, atol=1e-6)
    if name == "run" and outcome.ok and kind == "arg" and which < 2:    # an equal network or parameters
        want = engine.run(NETWORK, PARAMS, X, **kwargs)
        assert np.allclose(outcome.result.outputs, want.outputs, atol=1e-12)


@settings(max_examples=examples(20), **SETTINGS)
@given(sizes=st.tuples(*[st.sampled_from([int, np.int64, np.int32, np.uint16])] * 3),
       values=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 3)))
def test_numpy_integer_sizes_are_the_same_network_as_python_ints(sizes, values):
    plain = engine.Network(CELL, *values)
    made = call(engine.Network, CELL, *(kind(v) for kind, v in zip(sizes, values))).result
    assert made == plain and all(type(getattr(made, f)) is int for f in ("input_size", "hidden_size", "num_layers"))
    x = np.random.default_rng(1).standard_normal((3, 2, values[0]))
    params = engine.init_params(plain, seed=1)
    got = call(engine.run, made, params, x, backend="reference", dtype=np.float64).result
    want = engine.run(plain, params, x, backend="reference", dtype=np.float64)
    assert np.array_equal(got.outputs, want.outputs)


@pytest.mark.parametrize("size", [True, 3.0, "3", None, [3], np.float64(3.0)])
def test_a_size_that_is_not_an_integer_is_refused_naming_the_argument(size):
    outcome = call(engine.Network, CELL, 3, size)
    assert "hidden_size must be a positive integer" in str(outcome.error)


def test_a_preset_name_where_a_cell_is_expected_points_at_engine_preset():
    assert "engine.preset('lstm').cell" in str(call(engine.Network, "lstm", 3, 4).error)
    assert "engine.preset('lstm').cell" in str(call(engine.to_json, "lstm").error)
    assert "argument 'params' must be engine.Params" in str(call(engine.run, NETWORK, {"W": 1}, X).error)
    assert "Params takes a list" in str(call(engine.Params, {"W_ii": np.zeros(3)}).error)


@pytest.mark.parametrize("dtype", [",", ",,"])
def test_a_dtype_string_numpy_parses_as_python_is_refused_naming_it(dtype):
    # np.dtype(",") hands the string to ast.literal_eval and raises SyntaxError (found with CONTRACT_EXAMPLES=20000)
    assert "argument 'dtype'" in str(call(engine.run, NETWORK, engine.init_params(NETWORK, seed=0), X,
                                          backend="reference", dtype=dtype).error)
    assert "argument 'dtype'" in str(call(engine.init_params, NETWORK, 0, dtype).error)
    assert "argument 'dtype'" in str(call(engine.bptt, NETWORK, engine.init_params(NETWORK, seed=0), X,
                                          dtype=dtype).error)


@pytest.mark.parametrize("backend", [np.ones((2, 2)), ["fused"], None, 3])
def test_a_backend_that_is_not_a_name_is_refused_naming_it(backend):
    # engine.run compared backend with "fused" before naming it: an array answered with NumPy's ValueError
    # (found by the entry test above with more examples)
    outcome = call(engine.run, NETWORK, engine.init_params(NETWORK, seed=0), X, backend=backend, precision="tf32")
    assert "unknown backend" in str(outcome.error)


def test_a_net_block_whose_kind_is_a_list_is_refused():
    data = engine.net_to_dict(small_net())
    data["blocks"][0]["kind"] = ["layers"]
    assert "blocks[0].kind" in str(call(engine.net_from_dict, data).error)


def test_a_training_result_with_a_wrong_field_is_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": train_results.FORMAT, "results": 5}))
    assert "results" in str(call(train_results.load_results, path).error)
    path.write_text(json.dumps({"format": train_results.FORMAT, "results": [{"cell": 5}]}))
    assert "field 'cell'" in str(call(train_results.load_results, path).error)


# ---- memory: refused before allocating ---------------------------------------------------------------------------

def test_parameters_that_need_terabytes_are_refused_before_allocating():
    network = engine.Network(CELL, 3, 2**20)
    outcome = call(engine.init_params, network, deadline_s=5)
    assert isinstance(outcome.error, BackendError)
    assert "TiB, the limit is" in str(outcome.error) and "hidden_size" in str(outcome.error)
    many = engine.Network(CELL, 1024, 1024, 2**20)
    assert "TiB, the limit is" in str(call(engine.init_params, many, deadline_s=5).error)


@pytest.mark.parametrize("shape", [(10**12, 1, 3), (1, 10**12, 3)], ids=["steps", "batch"])
def test_a_run_that_needs_terabytes_is_refused_before_allocating(shape):
    x = np.broadcast_to(np.zeros(3), shape)          # no memory: a view with zero strides
    outcome = call(engine.run, NETWORK, PARAMS, x, backend="reference", deadline_s=5)
    assert "the limit is" in str(outcome.error) and "steps and batch" in str(outcome.error)


def test_the_estimate_the_app_sizes_its_limits_with():
    found = memory.estimate(NETWORK, steps=5, batch=2, dtype=np.float64, backend="reference")
    assert found.parameters == sum(v.nbytes for layer in PARAMS.layers for v in layer.values())
    assert found.run > 0 and found.on == "host" and found.fits
    huge = memory.estimate(engine.Network(CELL, 3, 2**20), dtype=np.float32)
    assert huge.parameters > 2**40 and (huge.limit is None or not huge.fits)
    with pytest.raises(EngineError, match=r"needs 8.0 TiB, the limit is 1.0 GiB"):
        memory.check_fits(8 << 40, "the test", "hidden_size", limit=1 << 30)
