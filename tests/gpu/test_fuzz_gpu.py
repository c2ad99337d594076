"""Random valid cell graphs (tests/test_fuzz_cells.py's generator, over the whole op set) on every GPU backend and
schedule, against the float64 reference (issue #10): 25 cells a run, each on the fused backend and on both wavefront
schedules at two batch sizes (the warp GEMV of B <= 4 and the register tiles / MMA of larger batches), poisoned
buffers; a schedule may refuse a cell only with a CompileError that says why (eligibility), never compute it wrong.
Each cell that fails is printed as JSON, to paste into a regression test."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_fused import relative_error
from test_fuzz_cells import cell_designs

import engine
from engine.backends import fused, reference
from engine.errors import CompileError
from engine.schedules import schedule_class

pytestmark = pytest.mark.gpu


def check(result, ref, what: str, design: dict) -> None:
    errors = [relative_error(result.outputs, ref.outputs)]
    errors += [relative_error(result.final_states[s], ref.final_states[s]) for s in ref.final_states]
    assert max(errors) <= 1e-5, f"{what}: relative error {max(errors):.3g}\n{json.dumps(design)}"


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cell_designs())
def test_random_cells_on_every_gpu_backend(cupy, design):
    cell = engine.from_dict(design)
    for batch in (3, 19):
        network = engine.Network(cell, input_size=37, hidden_size=70, num_layers=2)
        params = engine.init_params(network, seed=batch)
        rng = np.random.default_rng(batch)
        x = rng.standard_normal((9, batch, 37))
        states = {s: rng.uniform(-0.9, 0.9, (2, batch, 70)) for s in cell.state_names}
        ref = reference.run(network, params, x, states, dtype=np.float64)
        check(fused.prepare(network, params).run(x, states, poison=True), ref, f"fused B={batch}", design)
        for name in ("graph", "persistent"):
            try:
                result = schedule_class(name)(network, params).run(x, states, poison=True)
            except CompileError as e:                  # the wavefront tiling cannot take it: said, with the cell
                from engine.compiler import compile_program
                from engine.schedules.tiling import eligibility
                why = eligibility(compile_program(cell, layout="interleaved"))
                assert why and str(e) == f"cell '{cell.name}': {why}", str(e)
                continue
            check(result, ref, f"{name} B={batch}", design)
