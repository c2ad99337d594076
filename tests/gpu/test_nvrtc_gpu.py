"""The engine's own NVRTC compile on the GPU (engine/codegen/nvrtc.py): subnormal float32 values survive its
kernels (CuPy's RawKernel would flush them: it compiles with -ftz=true), and cooperative launches of a module
loaded from its CUBIN synchronise the grid; the generated kernels keep a subnormal state that the recurrence makes."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends import reference
from engine.codegen.nvrtc import load_module

pytestmark = pytest.mark.gpu

HALVE = r'''extern "C" __global__ void halve(float* a, const float* b, const float* c)
{
    a[threadIdx.x] = fmaf(b[threadIdx.x], c[threadIdx.x], 0.0f);
}
'''

GRID = r'''#include <cooperative_groups.h>
extern "C" __global__ void grid_sum(unsigned* counter, unsigned* seen)
{
    if (threadIdx.x == 0) atomicAdd(counter, 1u);
    cooperative_groups::this_grid().sync();
    if (threadIdx.x == 0) seen[blockIdx.x] = atomicAdd(counter, 0u);
}
'''


def test_subnormal_products_are_kept(cupy):
    kernel = load_module(HALVE).get_function("halve")
    b = cupy.full(32, np.float32(1e-38), dtype=cupy.float32)      # a normal float32
    c = cupy.full(32, np.float32(0.5), dtype=cupy.float32)
    a = cupy.full(32, np.float32(np.nan), dtype=cupy.float32)
    kernel((1,), (32,), (a, b, c))
    expected = np.float32(1e-38) * np.float32(0.5)
    assert 0 < expected < np.finfo(np.float32).tiny                 # subnormal
    assert (a.get() == expected).all(), a.get()[:4]


def test_cooperative_launch_of_a_loaded_cubin_synchronises_the_grid(cupy):
    kernel = load_module(GRID, cooperative=True).get_function("grid_sum")
    blocks = cupy.cuda.Device().attributes["MultiProcessorCount"]
    counter = cupy.zeros(1, dtype=cupy.uint32)
    seen = cupy.zeros(blocks, dtype=cupy.uint32)
    kernel((blocks,), (64,), (counter, seen))
    assert (seen.get() == blocks).all()                             # every block arrived before any read


@pytest.mark.parametrize("backend", ["fused", "graph", "persistent"])
def test_a_subnormal_state_survives_the_generated_kernels(cupy, backend):
    """IndRNN, h_t = relu(W x_t + u * h_{t-1} + b), with W = 0, b = 0, u = 0.5 and h_0 = 2^-100: the state halves
    every step, exactly (a power of two), into the subnormal range after 27 steps (2^-140 after 40). The float64
    reference rounded to float32 is then exact; with subnormals flushed the engine would give zeros from there on."""
    network = engine.Network(engine.preset("indrnn").cell, input_size=4, hidden_size=32, num_layers=1)
    params = engine.init_params(network, seed=3)
    layer = params.layers[0]
    layer["W"][...] = 0.0
    layer["u"][...] = 0.5
    layer["b"][...] = 0.0
    x = np.zeros((40, 2, 4), dtype=np.float32)
    states = {"h": np.full((1, 2, 32), 2.0 ** -100, dtype=np.float32)}
    expected = np.asarray(reference.run(network, params, x, states, dtype=np.float64).outputs).astype(np.float32)
    assert (expected[-1] > 0).all() and (expected[-1] < np.finfo(np.float32).tiny).all()
    got = engine.run(network, params, x, initial_states=states, backend=backend)
    np.testing.assert_array_equal(np.asarray(got.outputs), expected)
