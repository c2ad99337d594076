"""Long sequences on the GPU (issue #10): T = 10,000 steps on the fused backend and both schedules.

LSTM and GRU, two layers, small sizes (I = 16, H = 32, B = 4). Outputs and final states stay finite, and the
device memory stays bounded: after a first run has built its buffers, a second run of the same shape allocates
from CuPy's pool only the arrays it returns (the outputs and the final states), nothing per step; the schedules'
second run also captures its replay (engine/chunk_replay.py), whose own pool holds one input-sized buffer and the
final states, and the third allocates only its results again. The memory a run holds is printed (pytest -rA) for
the README's reliability figures.
"""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends import fused
from engine.schedules import schedule_class

pytestmark = pytest.mark.gpu

STEPS = 10_000


def prepare(backend: str, network, params):
    if backend == "fused":
        return fused.prepare(network, params)
    return schedule_class(backend)(network, params)


def result_bytes(result) -> int:
    return result.outputs.nbytes + sum(v.nbytes for v in result.final_states.values())


@pytest.mark.parametrize("backend", ["fused", "graph", "persistent"])
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_ten_thousand_steps_stay_finite_without_per_step_allocations(cupy, name, backend):
    network = engine.Network(engine.preset(name).cell, input_size=16, hidden_size=32, num_layers=2)
    params = engine.init_params(network, seed=0)
    x = cupy.asarray(np.random.default_rng(0).standard_normal((STEPS, 4, 16)), dtype=cupy.float32)
    pool = cupy.get_default_memory_pool()
    program = prepare(backend, network, params)
    before = pool.used_bytes()
    first = program.run(x)
    cupy.cuda.Device().synchronize()
    held = pool.used_bytes()
    second = program.run(x)
    cupy.cuda.Device().synchronize()

    def replay_bytes():
        return sum(r.pool.total_bytes() for r in getattr(program, "_replays", {}).values())
    grown = pool.used_bytes() - held + replay_bytes()
    after_second = pool.used_bytes()
    third = program.run(x)
    cupy.cuda.Device().synchronize()
    regrown = pool.used_bytes() - after_second
    for result in (first, second, third):
        assert bool(cupy.isfinite(result.outputs).all()), f"{backend} {name}: non-finite outputs"
        assert all(bool(cupy.isfinite(v).all()) for v in result.final_states.values())
    assert bool((third.outputs == second.outputs).all())
    allowed = result_bytes(second) + (x.nbytes + 2 * result_bytes(second) if backend != "fused" else 0) + (1 << 20)
    assert grown <= allowed, (
        f"{backend} {name}: the second run of T={STEPS} allocated {grown:,} bytes; its results are "
        f"{result_bytes(second):,} bytes")
    assert regrown <= result_bytes(third) + (1 << 20), f"{backend} {name}: the third run allocated {regrown:,} bytes"
    print(f"{backend} {name} T={STEPS}: {held - before:,} bytes of device memory after the first run "
          f"(results {result_bytes(first):,}), the second run added {grown:,} (its replay: {replay_bytes():,}), "
          f"the third {regrown:,}")
