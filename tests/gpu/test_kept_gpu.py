"""engine.run(backend="auto") on the GPU keeps the program it prepared (engine/kept.py): its later calls run it (from
the second at a shape, replayed from CUDA graphs), and still equal the float64 reference, also after a parameter is
changed in place and after the inputs change."""
import numpy as np
import pytest

import engine
from engine import kept

pytestmark = pytest.mark.gpu


def test_auto_reuses_its_program_and_follows_the_parameters(cupy):
    kept.forget()
    network = engine.Network(engine.preset("lstm").cell, 24, 40, 2)
    params = engine.init_params(network, seed=3, dtype=np.float32)
    rng = np.random.default_rng(4)
    try:
        for change in (None, None, "W_hf", None, "b_ii"):
            if change is not None:
                params.layers[1][change][...] *= 1.25                   # in place: the kept copy must notice
            x = rng.standard_normal((9, 5, 24)).astype(np.float32)
            got = engine.run(network, params, x)
            want = engine.run(network, params, x, backend="reference", dtype=np.float64)
            scale = np.abs(want.outputs).max()
            assert np.abs(got.outputs - want.outputs).max() / scale < 1e-5, (change, got.backend)
            for name, value in want.final_states.items():
                assert np.abs(got.final_states[name] - value).max() / np.abs(value).max() < 1e-5, (change, name)
        assert len(kept.PROGRAMS) == 1
    finally:
        kept.forget()
