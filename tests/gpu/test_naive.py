"""The naive CuPy backend (one kernel per IR op per step) against the NumPy reference.

GPU tests (marked gpu, skipped with the `cupy` fixture's reason where there is no GPU): every preset,
1 and 3 layers, odd sizes (I=37, H=129, B=3, T=17), non-zero initial states, NaN-poisoned outputs,
float32 within 1e-5 relative of float64 and float64 within 1e-12 (the benchmark's GPU reference).
Structural tests of the step program and an nvcc compile of every kernel run without a GPU.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from compiler_cells import every_op

import engine
from engine.backends import naive, reference
from engine.errors import BackendError
from engine.ops import OPS

# Every preset the naive backend takes: not LSTMP (values of size P), refused by name (tests/test_projection.py).
PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)
SIZES = {"input_size": 37, "hidden_size": 129, "batch": 3, "steps": 17}


def make_case(cell_graph, num_layers, seed, sizes=SIZES):
    sizes = dict(sizes, hidden_size=cell_graph.fit_size(sizes["hidden_size"]))   # a multiple of a cell's heads
    network = engine.Network(cell_graph, sizes["input_size"], sizes["hidden_size"], num_layers)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(100 + seed)
    x = rng.standard_normal((sizes["steps"], sizes["batch"], sizes["input_size"]))
    states = {name: rng.uniform(-0.8, 0.8, (num_layers, sizes["batch"], sizes["hidden_size"]))
              for name in cell_graph.state_names}
    return network, params, x, states


def relative_error(got, want) -> float:
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def run_naive(cupy, network, params, x, states, dtype):
    program = naive.prepare(network, params, dtype=dtype)
    result = program.run(cupy.asarray(x.astype(dtype)), {k: cupy.asarray(s.astype(dtype)) for k, s in states.items()},
                         poison=True)
    return cupy.asnumpy(result.outputs), {k: cupy.asnumpy(s) for k, s in result.final_states.items()}


def assert_close(outputs, finals, want, tolerance):
    assert np.isfinite(outputs).all(), "NaN left in the poisoned output: some element was never written"
    assert relative_error(outputs, want.outputs) <= tolerance
    assert set(finals) == set(want.final_states)
    for name, value in finals.items():
        assert np.isfinite(value).all(), name
        assert relative_error(value, want.final_states[name]) <= tolerance, name


# ---- GPU: differential ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("name", PRESETS)
def test_float32_matches_the_float64_reference(cupy, name, num_layers):
    network, params, x, states = make_case(engine.preset(name).cell, num_layers, seed=num_layers)
    want = reference.run(network, params, x, states, dtype=np.float64)
    outputs, finals = run_naive(cupy, network, params, x, states, np.float32)
    assert outputs.dtype == np.float32 and outputs.shape == want.outputs.shape
    assert_close(outputs, finals, want, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", PRESETS)
def test_float64_matches_the_numpy_reference(cupy, name):
    """The benchmark's divergence reference is this path: it must agree with NumPy to rounding."""
    network, params, x, states = make_case(engine.preset(name).cell, 2, seed=5)
    want = reference.run(network, params, x, states, dtype=np.float64)
    outputs, finals = run_naive(cupy, network, params, x, states, np.float64)
    assert outputs.dtype == np.float64
    assert_close(outputs, finals, want, 1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_every_op(cupy, dtype, tolerance):
    """float64 at 1e-12 catches a float-only CUDA function left in the double spelling."""
    network, params, x, states = make_case(every_op, 2, seed=3)
    want = reference.run(network, params, x, states, dtype=np.float64)
    outputs, finals = run_naive(cupy, network, params, x, states, dtype)
    assert_close(outputs, finals, want, tolerance)


@pytest.mark.gpu
def test_differential_check_can_fail(cupy):
    """A perturbed parameter must break the 1e-5 comparison (the tests above are not vacuous)."""
    network, params, x, states = make_case(engine.preset("lstm").cell, 1, seed=4)
    want = reference.run(network, params, x, states, dtype=np.float64)
    params.layers[0]["b_hf"] = params.layers[0]["b_hf"] + 1e-3
    outputs, _ = run_naive(cupy, network, params, x, states, np.float32)
    assert relative_error(outputs, want.outputs) > 1e-5


@pytest.mark.gpu
def test_run_returns_numpy_like_the_reference(cupy):
    network, params, x, states = make_case(engine.preset("gru").cell, 2, seed=6)
    result = naive.run(network, params, x, states, dtype=np.float32)
    assert isinstance(result.outputs, np.ndarray) and result.backend == "naive"
    assert result.final_states["h"].shape == (2, SIZES["batch"], SIZES["hidden_size"])
    np.testing.assert_array_equal(result.outputs[-1], result.final_states["h"][-1])
    via_api = engine.run(network, params, x, states, backend="naive")
    np.testing.assert_allclose(via_api.outputs, result.outputs, rtol=0, atol=1e-6)


@pytest.mark.gpu
def test_zero_initial_states_by_default(cupy):
    network, params, x, _ = make_case(engine.preset("lstm").cell, 2, seed=8)
    want = reference.run(network, params, x, dtype=np.float64)
    got = naive.run(network, params, x.astype(np.float32))
    assert relative_error(got.outputs, want.outputs) <= 1e-5


# ---- GPU: bad input ------------------------------------------------------------------------------

@pytest.mark.gpu
def test_bad_input_names_the_argument(cupy):
    network, params, x, states = make_case(engine.preset("lstm").cell, 1, seed=0)
    with pytest.raises(BackendError, match="'x'"):
        naive.run(network, params, x[0], dtype=np.float32)
    with pytest.raises(BackendError, match="'x'"):
        naive.run(network, params, x[..., :5], dtype=np.float32)
    with pytest.raises(BackendError, match="'dtype'"):
        naive.run(network, params, x, dtype=np.float16)
    with pytest.raises(BackendError, match="initial_states"):
        naive.run(network, params, x, {"c": states["c"][:, :1]})
    with pytest.raises(BackendError, match="W_ii"):
        naive.run(network, engine.Params([{k: w for k, w in params[0].items() if k != "W_ii"}]), x)
    with pytest.raises(BackendError, match="'params'"):
        naive.prepare(network, params.layers, dtype=np.float32)


@pytest.mark.gpu
def test_memory_is_checked_before_allocating(cupy):
    network = engine.Network(engine.preset("lstm").cell, 1024, 16, 1)
    params = engine.init_params(network)
    huge = np.broadcast_to(np.float32(1.0), (1 << 20, 4096, 1024))   # 16 PiB as a view: no host memory
    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    with pytest.raises(BackendError, match="GPU memory"):
        naive.run(network, params, huge)
    assert pool.used_bytes() == before
    program = naive.prepare(network, params)
    before = pool.used_bytes()
    with pytest.raises(BackendError, match="GPU memory"):
        program.run(huge)
    assert pool.used_bytes() == before


# ---- no GPU: structure -------------------------------------------------------------------------------

def test_one_launch_per_op_per_step():
    """An LSTM step is 8 matmuls + 21 elementwise ops + 1 output copy: nothing grouped or fused."""
    program = naive.step_program(engine.preset("lstm").cell, np.float32)
    assert sum(i.kind == "matmul" for i in program) == 8
    assert sum(i.kind == "elementwise" for i in program) == 21
    assert naive.launches_per_step(engine.preset("lstm").cell) == 30
    assert naive.launches_per_step(engine.preset("gru").cell) == 6 + 17 + 1


def test_constants_are_folded_or_baked():
    program = {i.node: i for i in naive.step_program(every_op, np.float32)}
    folded = [i for i in program.values() if i.kind == "const"]
    assert len(folded) == 1 and abs(folded[0].value - 1 / (1 + np.exp(-0.5))) < 1e-15
    baked = [i for i in program.values() if i.kind == "elementwise" and "((float)" in i.kernel.operation]
    assert {i.kernel.name for i in baked} >= {"naive_scale_k_float32", "naive_add_k_float32"}


def test_kernel_sources_per_dtype():
    add = naive.elementwise_source("add", (None, None), None, np.float32)
    assert (add.in_params, add.out_params, add.operation) == ("float32 a, float32 b", "float32 out", "out = (a + b);")
    relu64 = naive.elementwise_source("relu", (None,), None, np.float64)
    assert relu64.operation == "out = fmax(x, 0.0);"
    tanh64 = naive.elementwise_source("tanh", (None,), None, np.float64)
    assert tanh64.operation == "out = tanh(x);"
    assert naive.elementwise_source("one_minus", (None,), None, np.float64).operation == "out = (1.0 - x);"
    assert naive.double_spelling("fmaxf(x, 0.0f) + 1e-5f + 2.5e3f") == "fmax(x, 0.0) + 1e-5 + 2.5e3"
    with pytest.raises(BackendError, match="non-finite"):
        naive.c_literal(float("inf"), np.float32)


def _cuda_source(sources) -> str:
    """The kernels as CuPy's ElementwiseKernel would wrap them: one element per thread, each
    parameter a local variable of its C type, `out` written back."""
    ctype = {"float32": "float", "float64": "double"}
    parts = [naive.preamble()]
    for k, source in enumerate(sources):
        inputs = [p.split() for p in source.in_params.split(", ") if p]
        out_type = ctype[source.out_params.split()[0]]
        args = [f"const {ctype[t]}* __restrict__ in_{n}" for t, n in inputs] + [f"{out_type}* out_ptr", "int n"]
        loads = "".join(f"  const {ctype[t]} {n} = in_{n}[i];\n" for t, n in inputs)
        parts.append(f'extern "C" __global__ void {source.name}_{k}({", ".join(args)}) {{\n'
                     f"  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i >= n) return;\n{loads}"
                     f"  {out_type} out;\n  {source.operation}\n  out_ptr[i] = out;\n}}\n")
    return "\n".join(parts)


@pytest.mark.nvcc
def test_every_kernel_compiles(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the naive kernels are not compile-checked here")
    sources = set()
    for dtype in (np.float32, np.float64):
        for cell_graph in [every_op, *(p.cell for p in engine.presets().values())]:
            sources |= {i.kernel for i in naive.step_program(cell_graph, dtype) if i.kind == "elementwise"}
        for op, spec in OPS.items():
            if spec.kind == "elementwise":
                sources.add(naive.elementwise_source(op, (None,) * spec.arity, 0.5 if spec.attrs else None, dtype))
    path = tmp_path / "naive_kernels.cu"
    path.write_text(_cuda_source(sorted(sources, key=lambda s: (s.name, s.operation))))
    done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-c", str(path), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning" not in done.stderr.lower(), done.stderr[-3000:]
