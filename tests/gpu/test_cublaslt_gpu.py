"""The schedules' input projections through cublasLt (engine/schedules/cublaslt.py): every mode, with and without the
bias epilogue, odd shapes, on a poisoned output, against the float64 product of the operands the mode multiplies;
strict fp32 stays IEEE fp32 (no TF32); the fallback where cublasLt is not used gives the same values; and a
one-layer schedule, whose only cuBLAS call was its projection, now replays from CUDA graphs."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.rounding import round_operand, weight_bits
from engine.schedules import project as projection
from engine.schedules import schedule_class
from engine.schedules.cublaslt import LtProjection

pytestmark = pytest.mark.gpu

# the modes' error against float64 of the rounded operands (fp32 accumulation over K <= 600; tf32 operands exact)
TOLERANCE = 1e-5


@pytest.mark.parametrize("precision", ["float32", "tf32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(37, 40, 24), (300, 136, 600), (1024, 512, 64)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_each_mode_matches_float64_of_its_operands(cupy, precision, shape, with_bias):
    M, N, K = shape
    rng = np.random.default_rng(M + N + K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
    out = cupy.full((M, N), np.nan, dtype=cupy.float32)
    projection.project(cupy, cupy.asarray(x), cupy.asarray(weight_bits(w, precision)),
                       None if bias is None else cupy.asarray(bias), out, precision)
    want = (round_operand(x, precision) @ round_operand(w, precision).T
            + (0.0 if bias is None else bias.astype(np.float64)))
    got = cupy.asnumpy(out)
    assert np.isfinite(got).all()
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= TOLERANCE


def test_strict_fp32_is_not_tf32(cupy):
    """TF32 keeps 10 mantissa bits: on K = 512 its error against float64 is ~1e-3 relative, IEEE fp32's ~1e-7."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2048, 512)).astype(np.float32)
    w = rng.standard_normal((256, 512)).astype(np.float32)
    out = cupy.empty((2048, 256), dtype=cupy.float32)
    assert LtProjection.on_current_device(cupy).matmul(cupy.asarray(x), cupy.asarray(w), None, out,
                                                       *projection.LT_OPERANDS["float32"])
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.max(np.abs(cupy.asnumpy(out) - want)) / np.max(np.abs(want)) <= 1e-6


def test_a_strided_source_takes_the_fallback_with_the_same_values(cupy):
    rng = np.random.default_rng(4)
    wide = cupy.asarray(rng.standard_normal((64, 80)).astype(np.float32))
    source = wide[:, :48]                                   # rows of 80: not C-contiguous
    w = cupy.asarray(rng.standard_normal((32, 48)).astype(np.float32))
    bias = cupy.asarray(rng.standard_normal(32).astype(np.float32))
    strided, packed = (cupy.full((64, 32), np.nan, dtype=cupy.float32) for _ in range(2))
    projection.project(cupy, source, w, bias, strided, "float32")
    projection.project(cupy, cupy.ascontiguousarray(source), w, bias, packed, "float32")
    np.testing.assert_allclose(cupy.asnumpy(strided), cupy.asnumpy(packed), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_one_layer_schedule_replays_from_cuda_graphs(cupy, precision):
    """Its projection was a cuBLAS call through CuPy, which refuses capture; through cublasLt it is captured. The
    replay's input buffer is the build's own (no second copy of x), so a later x must be the one it runs on."""
    network = engine.Network(engine.preset("lstm").cell, 32, 64, 1)
    params = engine.init_params(network, seed=1)
    x = cupy.asarray(np.random.default_rng(2).standard_normal((12, 4, 32)), dtype=cupy.float32)
    program = schedule_class("persistent")(network, params, precision=precision)
    first = program.run(x)
    second = program.run(x)
    assert second.info["replayed"].startswith("replayed from CUDA graphs"), second.info["replayed"]
    np.testing.assert_array_equal(cupy.asnumpy(first.outputs), cupy.asnumpy(second.outputs))
    # the replay reads its input from the build's own buffer: a new x is the one multiplied, not the last
    other = cupy.asarray(np.random.default_rng(3).standard_normal((12, 4, 32)), dtype=cupy.float32)
    replayed = program.run(other)
    direct = schedule_class("persistent")(network, params, precision=precision).run(other)
    assert replayed.info["replayed"].startswith("replayed from CUDA graphs")
    np.testing.assert_array_equal(cupy.asnumpy(replayed.outputs), cupy.asnumpy(direct.outputs))
    assert not np.array_equal(cupy.asnumpy(replayed.outputs), cupy.asnumpy(first.outputs))
