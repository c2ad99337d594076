"""A cell whose nodes, states, input, parameters and cell name are reserved C/CUDA names (macros such as NULL, EOF,
errno, INT_MAX, keywords, the generated code's own names, reserved spellings; tests/named_cells.py) compiles and
computes the reference on the fused backend and on both wavefront schedules (graph and persistent)."""
from __future__ import annotations

import numpy as np
import pytest
from named_cells import SPELLINGS, named_cell, reserved_list
from test_fused import relative_error

import engine
from engine.backends import fused, reference
from engine.schedules import schedule_class

pytestmark = pytest.mark.gpu

ROLES = ["errno", "NULL", "EOF", "INT_MAX", "M_PI", "assert", "signed", "min", "max", "CUDART_VERSION", "__LINE__",
         "B", "smem", "threadIdx"]


def names() -> list[str]:
    return list(dict.fromkeys(ROLES + list(SPELLINGS) + reserved_list()[::37]))


@pytest.mark.parametrize("batch", [3, 19])
def test_a_cell_of_reserved_names_runs_on_every_gpu_backend(cupy, batch):
    cell = named_cell(names(), cell_name="NULL")
    network = engine.Network(cell, input_size=11, hidden_size=24, num_layers=2)
    params = engine.init_params(network, seed=batch)
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((6, batch, 11))
    states = {s: rng.uniform(-0.9, 0.9, (2, batch, 24)) for s in cell.state_names}
    ref = reference.run(network, params, x, states, dtype=np.float64)
    results = {"fused": fused.prepare(network, params).run(x, states, poison=True)}
    for name in ("graph", "persistent"):
        results[name] = schedule_class(name)(network, params).run(x, states, poison=True)
    for what, result in results.items():
        errors = [relative_error(result.outputs, ref.outputs)]
        errors += [relative_error(result.final_states[s], ref.final_states[s]) for s in ref.final_states]
        assert max(errors) <= 1e-5, f"{what} B={batch}: relative error {max(errors):.3g}"
