"""Cells that combine the input with hidden-sized values (issue #9, expressivity): MUT1 of Jozefowicz et al. (2015)
adds tanh(x) inside its candidate; residual and highway cells add x to h. Such a cell declares input_is_hidden
(DSL, JSON), its sizes check with I = H, a network with input_size != hidden_size is refused naming the node and
the sizes, and the reference and the compiled plan (NumPy) compute it (the GPU backends: tests/gpu/
test_input_is_hidden_gpu.py).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine.backends import plan_numpy
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.dsl_emit import emit_dsl
from engine.errors import BackendError, CellGraphError


def mut1_body(x, h):
    z = sigmoid(W("W_z") @ x + b("b_z"))
    r = sigmoid(W("W_r") @ x + W("U_r") @ h + b("b_r"))
    h_next = tanh(W("U_h") @ (r * h) + tanh(x) + b("b_h")) * z + h * (1 - z)
    return {"h": h_next}


def mut1():
    def mut1(x, h):
        """MUT1 of R. Jozefowicz, W. Zaremba, I. Sutskever, An Empirical Exploration of Recurrent Network
        Architectures, ICML 2015."""
        return mut1_body(x, h)
    return cell(mut1, input_is_hidden=True)


def test_without_the_declaration_the_cell_is_a_shape_mismatch_with_a_hint():
    def mut1(x, h):
        return mut1_body(x, h)
    with pytest.raises(CellGraphError) as e:
        cell(mut1)
    assert "shape mismatch" in str(e.value) and "input_is_hidden" in str(e.value)


def test_the_declared_cell_checks_with_i_equal_to_h_and_round_trips():
    graph = mut1()
    assert graph.input_is_hidden and graph.dims["x"] == "H" and graph.dims["h_next"] == "H"
    data = engine.to_dict(graph)
    assert data["input_is_hidden"] is True
    assert engine.from_json(json.dumps(data)) == graph
    assert "input_is_hidden" not in engine.to_dict(engine.preset("lstm").cell)     # other cells' JSON unchanged
    namespace: dict = {}
    exec(compile(emit_dsl(graph), "<emitted>", "exec"), namespace)                   # noqa: S102 - our own source
    (rebuilt,) = [v for v in namespace.values() if isinstance(v, engine.CellGraph)]
    assert rebuilt == graph and "@cell(input_is_hidden=True)" in emit_dsl(graph)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_declaration_names_the_field(value):
    data = engine.to_dict(mut1())
    data["input_is_hidden"] = value
    with pytest.raises(CellGraphError) as e:
        engine.from_dict(data)
    assert e.value.field == "input_is_hidden"


def test_a_network_with_other_sizes_is_refused_naming_the_node_and_the_sizes():
    with pytest.raises(BackendError) as e:
        engine.Network(mut1(), input_size=5, hidden_size=6)
    text = str(e.value)
    assert "node 'h_next_add'" in text and "input_size=5, hidden_size=6" in text and "hint:" in text
    engine.Network(mut1(), input_size=6, hidden_size=6, num_layers=3)             # equal sizes are fine


def test_reference_and_plan_compute_mut1():
    network = engine.Network(mut1(), input_size=6, hidden_size=6, num_layers=2)
    params = engine.init_params(network, seed=0)
    x = np.random.default_rng(0).standard_normal((5, 3, 6))
    ref = engine.run(network, params, x, backend="reference", dtype=np.float64)
    # Layer 0 by hand: z = s(W_z x + b_z), r = s(W_r x + U_r h + b_r), h' = tanh(U_h (r h) + tanh(x) + b_h) z + h (1 - z)
    sig = lambda v: 1 / (1 + np.exp(-v))                                                       # noqa: E731
    p, h, layer0 = params[0], np.zeros((3, 6)), []
    for t in range(5):
        z = sig(x[t] @ p["W_z"].T + p["b_z"])
        r = sig(x[t] @ p["W_r"].T + h @ p["U_r"].T + p["b_r"])
        h = np.tanh((r * h) @ p["U_h"].T + np.tanh(x[t]) + p["b_h"]) * z + h * (1 - z)
        layer0.append(h)
    one = engine.run(engine.Network(mut1(), 6, 6, 1), engine.Params([params[0]]), x, backend="reference",
                     dtype=np.float64)
    assert np.allclose(one.outputs, np.stack(layer0), atol=1e-12)
    for layout in ("blocked", "interleaved"):
        got = plan_numpy.run(network, params, x, None, layout=layout, chunk_steps=2)
        assert np.abs(got.outputs - ref.outputs).max() < 1e-10, layout
