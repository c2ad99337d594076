"""Cells that combine the input with hidden-sized values (input_is_hidden) on the GPU backends, against the
float64 reference: MUT1 of Jozefowicz et al. (2015), which adds tanh(x) inside its candidate, and a residual
LSTM whose output adds x to o * tanh(c). Layer 0 reads x in its cell code, deeper layers read the output of
the layer below: both sources are checked (1 and 3 layers), with non-zero initial states and poisoned
buffers, on the fused backend and both schedules, and on the persistent schedule in bfloat16 against the
reference's emulation of that mode (a block whose bulk pipeline stages x must still read x in fp32 in its
cell code).
"""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import assert_matches, make_case
from test_input_is_hidden import mut1
from test_precision_gpu import check_mode

import engine
from engine.backends import fused, reference
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.schedules import schedule_class

pytestmark = pytest.mark.gpu

SIZES = {"input_size": 129, "hidden_size": 129, "batch": 3, "steps": 17}


def residual_lstm():
    def residual_lstm(x, h, c):
        """LSTM whose output adds the layer input (a residual connection inside the cell)."""
        i = sigmoid(W("W_i") @ x + W("U_i") @ h + b("b_i"))
        f = sigmoid(W("W_f") @ x + W("U_f") @ h + b("b_f"))
        g = tanh(W("W_g") @ x + W("U_g") @ h + b("b_g"))
        o = sigmoid(W("W_o") @ x + W("U_o") @ h + b("b_o"))
        c_next = f * c + i * g
        return {"h": o * tanh(c_next) + x, "c": c_next}
    return cell(residual_lstm, input_is_hidden=True)


CELLS = {"mut1": mut1, "residual_lstm": residual_lstm}


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("backend", ["fused", "graph", "persistent"])
def test_input_is_hidden_cells_match_the_reference(cupy, backend, name, num_layers):
    network, params, x, states = make_case(CELLS[name](), num_layers, seed=num_layers, sizes=SIZES)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    program = fused.prepare(network, params) if backend == "fused" else schedule_class(backend)(network, params)
    result = program.run(x, states, poison=True)
    assert_matches(result, ref, f"{backend} {name}, L={num_layers}")


@pytest.mark.parametrize("name", sorted(CELLS))
def test_input_is_hidden_in_bfloat16_matches_its_emulation(cupy, name):
    sizes = SIZES | {"input_size": 128, "hidden_size": 128, "batch": 16}      # K % 64 == 0: the bulk pipeline
    network, params, x, states = make_case(CELLS[name](), 2, seed=5, sizes=sizes)
    program = schedule_class("persistent")(network, params, precision="bfloat16")
    result = program.run(x, states, poison=True)
    check_mode(result, network, params, x, states, "bfloat16", f"persistent {name} bfloat16")


def test_the_auto_backend_runs_it(cupy):
    network, params, x, states = make_case(mut1(), 2, seed=3, sizes=SIZES)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    assert_matches(engine.run(network, params, x, states, backend="auto"), ref, "auto mut1")
