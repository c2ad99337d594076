"""Precision modes on the CPU: the rounding the kernels do, its emulation in the reference, the tiling of the
tensor-core path, and the refusals. (The kernels themselves: tests/gpu/test_precision.py.)"""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends import reference
from engine.codegen.precision import PRECISIONS
from engine.codegen.precision import precision as lookup
from engine.compiler import make_plan
from engine.errors import BackendError, CompileError
from engine.rounding import round_operand, weight_bits
from engine.schedules.staging import weight_floats, weight_stride
from engine.schedules.tiling import H100, TileConfig, make_tiling


def f32(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def test_tf32_rounds_to_nearest_with_ties_away_from_zero():
    one_ulp = 2.0 ** -10                                 # TF32 keeps 10 mantissa bits
    assert round_operand(1 + one_ulp / 2, "tf32") == 1 + one_ulp          # a tie: away from zero
    assert round_operand(-(1 + one_ulp / 2), "tf32") == -(1 + one_ulp)
    assert round_operand(1 + 3 * one_ulp / 2, "tf32") == 1 + 2 * one_ulp  # a tie from an odd value: away, too
    assert round_operand(1 + one_ulp * 0.49, "tf32") == 1.0
    assert round_operand(f32(0x3F800FFF), "tf32") == 1.0                 # below half an ulp
    assert np.isinf(round_operand(np.inf, "tf32")) and np.isnan(round_operand(np.nan, "tf32"))


def test_bfloat16_rounds_to_nearest_even_and_keeps_nan():
    one_ulp = 2.0 ** -7
    assert round_operand(1 + one_ulp / 2, "bfloat16") == 1.0                   # a tie: to the even 1.0
    assert round_operand(1 + 3 * one_ulp / 2, "bfloat16") == 1 + 2 * one_ulp   # a tie: to the even neighbour
    assert round_operand(1 + one_ulp * 0.51, "bfloat16") == 1 + one_ulp
    assert np.isnan(round_operand(np.nan, "bfloat16"))
    bits = weight_bits(np.array([1.0, -2.0, 0.0]), "bfloat16")
    assert bits.dtype == np.uint16 and list(bits) == [0x3F80, 0xC000, 0x0000]


def test_float16_and_float32_modes():
    values = np.random.default_rng(0).standard_normal(1000)
    assert np.array_equal(round_operand(values, "float16"), values.astype(np.float32).astype(np.float16))
    assert np.array_equal(weight_bits(values, "float16"), values.astype(np.float32).astype(np.float16).view(np.uint16))
    assert np.array_equal(round_operand(values, "float32"), values)
    rounded = round_operand(values, "tf32")
    assert np.all(rounded.astype(np.float32).view(np.uint32) & 0x1FFF == 0), "tf32 keeps 13 low bits zero"
    assert np.max(np.abs(rounded - values) / np.abs(values)) <= 2.0 ** -11


def test_names_short_and_long():
    assert {p.short for p in PRECISIONS.values()} == {"fp32", "tf32", "fp16", "bf16", "fp32x3"}
    assert lookup("bf16").name == "bfloat16" and lookup("fp16").weight_bytes == 2
    with pytest.raises(CompileError, match="float8"):
        lookup("float8")


def small_case(cell="lstm", layers=2):
    network = engine.Network(engine.preset(cell).cell, input_size=12, hidden_size=20, num_layers=layers)
    params = engine.init_params(network, seed=1)
    x = np.random.default_rng(2).standard_normal((9, 3, 12))
    return network, params, x


def test_the_reference_emulates_each_mode_by_rounding_matmul_operands():
    network, params, x = small_case()
    strict = reference.run(network, params, x).outputs
    assert np.array_equal(reference.run(network, params, x, precision="float32").outputs, strict)
    divergence = {}
    for mode in ("tf32", "float16", "bfloat16"):
        out = reference.run(network, params, x, precision=mode).outputs
        divergence[mode] = float(np.max(np.abs(out - strict)))
        assert 0 < divergence[mode] < 0.1, (mode, divergence[mode])
    # Fewer mantissa bits, more divergence: bf16 (7) > tf32 and fp16 (10).
    assert divergence["bfloat16"] > divergence["float16"] and divergence["bfloat16"] > divergence["tf32"]


def test_one_step_of_the_emulation_is_the_rounded_product():
    # A cell whose output is sigmoid(W x + U h + b): the emulated step must round W, x, U and h, nothing else.
    network, params, x = small_case("lstm", 1)
    cell = network.cell
    states = {s: np.random.default_rng(3).uniform(-1, 1, (3, 20)) for s in cell.state_names}
    _, env = reference.step(cell, params[0], x[0], states, np.float64, "bfloat16")
    for name in cell.topo_order:
        node = cell[name]
        if node.op != "matmul":
            continue
        weight, operand = (env[a] for a in node.args)
        want = round_operand(operand, "bfloat16") @ round_operand(weight, "bfloat16").T
        assert np.array_equal(env[name], want), name


def test_reference_refuses_an_unknown_precision_by_name():
    network, params, x = small_case()
    with pytest.raises(BackendError, match="'precision'.*float8"):
        reference.run(network, params, x, precision="float8")
    with pytest.raises(BackendError, match="'precision'"):
        engine.run(network, params, x, backend="reference", precision="half")
    for backend in ("scan", "persistent", "auto"):      # named before the GPU is looked for (CI has none)
        with pytest.raises(BackendError, match="'precision' is 'int8'"):
            engine.run(network, params, x, backend=backend, precision="int8")


@pytest.mark.parametrize("precision", ["tf32", "float16", "bfloat16"])
@pytest.mark.parametrize("batch", [3, 19, 64])
def test_tensor_core_tilings_fit_and_keep_16_bit_weights_half_the_size(precision, batch):
    for cell in ("lstm", "gru", "mgu"):
        for H, L in ((129, 2), (512, 4), (1024, 2)):
            network = engine.Network(engine.preset(cell).cell, input_size=37, hidden_size=H, num_layers=L)
            program = make_plan(network, 4, batch, layout="interleaved", precision=precision).program
            for persistent in (True, False):
                tiling = make_tiling(program, network, batch, TileConfig(), H100, persistent=persistent)
                where = f"{cell} H={H} L={L} B={batch} {precision} persistent={persistent}"
                assert tiling.precision == precision and 0 <= tiling.smem_bytes <= H100.smem_per_block, where
                assert tiling.mma == (batch > 4), where
                if tiling.mma:
                    wm, wn = tiling.warp_tile
                    assert wm in (1, 2) and wn in (1, 2) and tiling.k_chunk % 16 == 0, where
                    assert tiling.config.threads % 32 == 0 and 256 <= tiling.config.threads <= 512, where
                    for g in tiling.gemms:      # resident slices: whole 8-row MMA tiles, 16-byte rows
                        if g.resident:
                            rows = -(-g.terms * tiling.units_per_block // 8) * 8
                            assert g.resident_floats == weight_floats(rows, g.k_max, lookup(precision)), where
                            assert weight_stride(g.k_max, lookup(precision)) * lookup(precision).weight_bytes % 16 == 0
    # The point of 16-bit storage: the same weights take half the shared memory.
    network = engine.Network(engine.preset("lstm").cell, input_size=512, hidden_size=512, num_layers=4)
    floats = {}
    for precision in ("tf32", "bfloat16"):
        program = make_plan(network, 4, 64, layout="interleaved", precision=precision).program
        tiling = make_tiling(program, network, 64, TileConfig(), H100)
        floats[precision] = sum(g.resident_floats for g in tiling.gemms if g.resident and not g.hoisted)
    assert floats["bfloat16"] * 2 <= floats["tf32"] * 1.1, floats


def test_auto_without_a_gpu_emulates_the_mode_on_the_reference(monkeypatch):
    from engine import backends
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no CUDA device (test)"))
    network, params, x = small_case()
    result = engine.run(network, params, x, precision="bf16")
    assert result.backend == "reference" and result.info["precision"] == "bfloat16"
    want = reference.run(network, params, x, dtype=np.float32, precision="bfloat16").outputs
    assert np.array_equal(result.outputs, want)
