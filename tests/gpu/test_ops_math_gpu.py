"""The ops of cells after 2017 on the GPU (issue #33): each op's kernel, float32 and float64, against its NumPy
meaning over wide ranges inside its domain, the extremes included (softplus and log_sigmoid at +-80, exp up to
its float32 limit, silu far below 0); and check_finite naming the node that made a NaN on the GPU schedules.
The every_op cell of tests/compiler_cells.py carries the same ops through every schedule, the generated
backward and the naive backend (tests/gpu/test_schedules.py, test_fused_training_gpu.py, test_naive.py)."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends import naive
from engine.dsl import W, b, cell, sqrt, tanh
from engine.ops import OPS

pytestmark = pytest.mark.gpu

NEW_OPS = ("exp", "log", "div", "max", "min", "abs", "sqrt", "rsqrt", "softplus", "log_sigmoid", "silu", "gelu")
# float32 kernels against the float64 meaning: a few ulps of the result for the library functions (CUDA's
# expf, logf, tanhf, log1pf are within 2 ulps, rsqrtf 2 ulps; Programming Guide, "Mathematical Functions"), more where
# a helper composes several of them.
F32_RTOL = {"exp": 3e-7, "log": 3e-7, "sqrt": 2e-7, "rsqrt": 3e-7, "div": 2e-7, "max": 0, "min": 0, "abs": 0,
            "softplus": 1e-6, "log_sigmoid": 1e-6, "silu": 1e-6, "gelu": 2e-6}


def wide_operands(op: str, n: int = 20_000) -> list[np.ndarray]:
    rng = np.random.default_rng(len(op))
    spec = OPS[op]
    extremes = np.array([-80.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 80.0])
    values = [np.concatenate([rng.standard_normal(n) * 6, extremes]) for _ in spec.ports]
    if op == "exp":
        values[0] = np.clip(values[0] * 4, -87.0, 88.0)                # float32's exp stays finite up to 88.7
    if spec.domain == "positive":
        values = [np.abs(v) * 10 + 1e-3 for v in values]
    if spec.domain == "nonzero_b":
        values[1] = np.where(values[1] < 0, -1.0, 1.0) * (np.abs(values[1]) + 0.25)
    if op in ("max", "min"):
        values[1][::4] = values[0][::4]                                  # ties
    return [v.astype(np.float32).astype(np.float64) for v in values]   # the same numbers in both precisions


@pytest.mark.parametrize("op", NEW_OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_new_op_kernel_equals_its_numpy_meaning(cupy, op, dtype):
    spec = OPS[op]
    args = wide_operands(op)
    kernel = naive._kernel(naive.elementwise_source(op, (None,) * spec.arity, None, dtype))
    out = cupy.full(args[0].shape, np.nan, dtype=dtype)
    kernel(*(cupy.asarray(a, dtype=dtype) for a in args), out)
    want = spec.numpy(*args)
    got = out.get().astype(np.float64)
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(want)), op
    rtol = F32_RTOL[op] if dtype == np.float32 else 4e-15
    # A helper that adds terms of opposite sign (gelu's 1 + tanh(u) for x far below 0, softplus's max(x, 0) +
    # log1p(...)) cancels: its error is a few ulps of 1 times |x|, not of the result.
    cancels = 4 * np.finfo(dtype).eps * np.abs(args[0]) if spec.cuda_helper else 0.0
    bad = np.abs(got - want) > rtol * np.abs(want) + cancels + np.finfo(dtype).tiny
    assert not bad.any(), (op, args[0][bad][:3], got[bad][:3], want[bad][:3])


@cell
def root_of_negative(x, h):
    a = W("W") @ x + b("b")
    return {"h": tanh(sqrt(a - 50.0) + h)}


@pytest.mark.parametrize("backend", ["auto", "naive", "fused"])
def test_check_finite_names_the_node_that_made_a_nan_on_the_gpu(cupy, backend):
    network = engine.Network(root_of_negative, 3, 8, 2)
    params = engine.init_params(network, seed=0)
    x = np.random.default_rng(0).standard_normal((5, 4, 3)).astype(np.float32)
    with np.errstate(all="ignore"):
        with pytest.raises(engine.EngineError) as info:
            engine.run(network, params, x, backend=backend, check_finite=True)
    assert "(sqrt) made the first NaN of the run at layer 0, step 0" in str(info.value), str(info.value)
