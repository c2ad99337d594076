"""float32x3's step product on the engine's own wgmma kernel (engine/schedules/wgmma_products.py, kernels/x3_wgmma.cu), on
the CPU: the tiles are the bulk pipeline's chunked layout with zero padding, the C index the copies write through
(tile_gemm.cuh rnn_tile_at) is that layout, what the kernel computes (promoted_numpy) is float32x3's product of
the fp16 parts within fp32's reach of float64, the choice of product and its errors, and the kernel and the copies in
tiles compile for sm_90a. tests/gpu/test_wgmma_products_gpu.py runs them."""
from __future__ import annotations

import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from nvcc_check import compile_sources

import engine
from engine.codegen.cuda import KERNELS_DIR, kernel_file_source
from engine.codegen.operand_copies import operand_copies, render_copies_module
from engine.compiler import make_plan
from engine.dense import dense
from engine.errors import BackendError
from engine.rounding import split_fp16
from engine.schedules.base import chunked
from engine.schedules.fused_modes import check_step_product, fixed_gemms
from engine.schedules.split_products import chunking, split_into, stack_split, stacked_product_numpy
from engine.schedules.wgmma_products import (
    PROMOTE,
    STEP_PRODUCTS,
    goes_wide,
    kernel_source,
    padded,
    promote_columns,
    promoted_numpy,
    resolve_product,
    smem_bytes,
    tile_weight,
    tiled,
    tiled_operand,
    x3_kernel,
)

SHARED_MEMORY_SM90 = 227 * 1024           # the opt-in dynamic shared memory of a block on an H100 / H200


def tile_at(b: int, k: int, ld: int, size: int = 2) -> int:
    """kernels/tile_gemm.cuh rnn_tile_at<size>, read from the header and evaluated statement by statement (the C
    expressions, not a copy; C's / on non-negative integers is Python's //, and the two languages rank *, +, & and ^
    alike)."""
    text = (KERNELS_DIR / "tile_gemm.cuh").read_text()
    body = re.search(r"long rnn_tile_at\(const long b, const long k, const long ld\)\n\{\n(.*?)\n\}", text, re.S).group(1)
    names = {"b": b, "k": k, "ld": ld, "BYTES": size}
    code = " ".join(line.split("//")[0] for line in body.splitlines())          # the comments dropped
    for statement in (part.strip() for part in code.replace("constexpr long", "").replace("const long", "").split(";")):
        if statement.startswith("return"):
            return eval(statement[len("return"):].replace("/", "//"), {}, names)
        for assignment in statement.split(", "):
            if "=" in assignment:
                name, expression = assignment.split("=", 1)
                names[name.strip()] = eval(expression.replace("/", "//"), {}, names)
    raise AssertionError("rnn_tile_at has no return")


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize("rows, cols", [(64, 64), (19, 129), (130, 200), (5, 7)])
def test_the_c_index_is_the_tiles_layout(rows, cols, dtype):
    """Element (b, k) of each part lands where tiled() puts it (tiles of 64 columns of a 16-bit type, 32 of a 32-bit
    one), and the padding is zeros."""
    rng = np.random.default_rng(rows * cols)
    parts = rng.integers(1, 60000, (2, rows, cols)).astype(dtype)
    size = np.dtype(dtype).itemsize
    flat = tiled(np, parts, rows, cols)
    columns = -(-cols // (128 // size)) * (128 // size)
    assert flat.size == 2 * padded(rows) * columns
    lo = padded(rows) * columns
    for b, k in [(0, 0), (rows - 1, cols - 1), (rows // 2, cols // 3), (min(rows - 1, 9), min(cols - 1, 70))]:
        at = tile_at(b, k, cols, size)
        assert flat[at] == parts[0, b, k] and flat[lo + at] == parts[1, b, k], (b, k)
    assert np.count_nonzero(flat) == 2 * rows * cols                # everything else is padding, zero


def test_tiles_are_the_bulk_pipelines_chunks():
    parts = np.arange(2 * 128 * 128, dtype=np.uint16).reshape(2, 128, 128)
    np.testing.assert_array_equal(tiled(np, parts, 128, 128), chunked(np, parts.reshape(256, 128), 64, 64))


def test_a_poisoned_operand_is_nan_where_values_go_and_zero_in_the_padding():
    copy = tiled_operand(np, 19, 100, poison=True)
    assert copy.shape == (2, 64, 128)
    bits = copy.view(np.uint16).ravel()
    marks = np.zeros((2, 19, 100), np.uint16) + 0xFFFF
    np.testing.assert_array_equal(bits, tiled(np, marks, 19, 100))
    assert not tiled_operand(np, 19, 100, poison=False).view(np.uint16).any()


def test_the_weight_tiles_are_its_fp16_parts():
    w = np.random.default_rng(1).standard_normal((72, 100)).astype(np.float32)
    got = tile_weight(np, w)
    hi, lo = split_fp16(w)
    want = tiled(np, np.stack([hi, lo]).astype(np.float16), 72, 100)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("promote", [64, 128, 512])
def test_the_promoted_sums_are_float32x3s_product_of_the_fp16_parts(promote):
    rng = np.random.default_rng(promote)
    R, K, N = 48, 512, 80
    h = rng.uniform(-1, 1, (R, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32)
    got = promoted_numpy(h, w, promote)
    parts = split_into(np, h, np.empty((2, R, K), np.float16), "fp16").astype(np.float64)
    want = stacked_product_numpy(parts, stack_split(np, w, "fp16").astype(np.float64), chunking(K, promote), 2048.0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    exact = h.astype(np.float64) @ w.astype(np.float64).T
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 1e-6        # fp32's level: only lo x lo dropped


def test_promote_columns_follow_x3_chunk():
    assert promote_columns("auto", 1024) == PROMOTE == 64
    assert promote_columns(None, 1000) == 1024                # all of K, whole tiles
    assert promote_columns(100, 1024) == 128 and promote_columns(256, 1024) == 256


def test_which_product_runs():
    assert resolve_product("auto", "float32x3", "fp16", False, True) == "wgmma"
    assert resolve_product("auto", "float32x3", "fp16", False, False) == "cublaslt"      # not sm_90
    assert resolve_product("auto", "float32x3", "tf32", False, True) == "cublaslt"       # TF32 parts (a fallback too)
    assert resolve_product("wgmma", "float32x3", "tf32", False, True) == "cublaslt"
    assert resolve_product("auto", "float32x3", "fp16", "auto", True) == "cublaslt"     # split-K is cublasLt's
    assert resolve_product("cublaslt", "float32x3", "fp16", False, True) == "cublaslt"
    for mode in ("tf32", "float16", "bfloat16"):
        assert resolve_product("auto", mode, None, False, True) == "cublaslt"          # the modes: where asked
        assert resolve_product("wgmma", mode, None, False, True) == "wgmma"
        assert resolve_product("wgmma", mode, None, False, False) == "cublaslt"
    assert check_step_product("wgmma", "float32x3", "fp16", False, 1, True) == "wgmma"
    assert check_step_product("wgmma", "bfloat16", "fp16", False, 1, True) == "wgmma"
    for args, named in ((("wgmma", "float32x3", "tf32", False, 1, True), "x3_parts='fp16'"),
                        (("wgmma", "float32x3", "fp16", True, 1, True), "x3_splitk=False"),
                        (("wgmma", "float32x3", "fp16", False, 1, False), "sm_90"),
                        (("wgmma", "tf32", "fp16", False, 4, True), "k_slices=1"),
                        (("cuBLAS", "tf32", "fp16", False, 1, True), "step_product"),
                        ((None, "float32x3", "fp16", False, 1, True), "step_product")):
        with pytest.raises(BackendError, match=re.escape(named)) as caught:
            check_step_product(*args)
        assert "hint:" in str(caught.value)
    assert set(STEP_PRODUCTS) == {"auto", "wgmma", "cublaslt"}


def test_the_rings_fit_a_hopper_block():
    assert smem_bytes(4) <= SHARED_MEMORY_SM90 and 3 * smem_bytes(2) <= 228 * 1024       # three blocks an SM at 2
    assert smem_bytes(8, 2) <= SHARED_MEMORY_SM90 and 3 * smem_bytes(4, 2) <= 228 * 1024  # the modes' 16 KB slots
    assert 2 * smem_bytes(3) <= SHARED_MEMORY_SM90           # x3_wgmma_pair_3: a ring of 3 for each warpgroup


def gpu_of(sms: int, l2: int = 60 << 20):
    """A stand-in for cupy whose current device has `sms` SMs and an L2 of `l2` bytes (all x3_kernel and goes_wide
    read)."""
    device = SimpleNamespace(id=("stand-in", sms, l2), attributes={"MultiProcessorCount": sms, "L2CacheSize": l2})
    return SimpleNamespace(cuda=SimpleNamespace(Device=lambda: device))


def test_two_warpgroups_take_grids_that_fit_the_sms_once_when_every_chunk_is_promoted():
    h200 = gpu_of(132)
    assert x3_kernel(h200, 128, PROMOTE) == ("x3_wgmma_pair_2", 256, 2 * smem_bytes(2))     # `large`
    assert x3_kernel(h200, 132, 64) == ("x3_wgmma_pair_2", 256, 2 * smem_bytes(2))
    assert x3_kernel(h200, 133, 64) == ("x3_wgmma_2", 128, smem_bytes(2))                 # past one wave
    assert x3_kernel(h200, 160, 64) == ("x3_wgmma_2", 128, smem_bytes(2))                 # blogA's LSTM
    assert x3_kernel(h200, 128, 128) == ("x3_wgmma_4", 128, smem_bytes(4))                # the pair promotes each chunk
    assert x3_kernel(gpu_of(114), 128, 64) == ("x3_wgmma_2", 128, smem_bytes(2))          # an H100 PCIe's 114 SMs
    assert 2 * smem_bytes(2) <= SHARED_MEMORY_SM90


def test_a_16_bit_weight_past_the_l2_goes_wide():
    h200 = gpu_of(132)                                # it reports 60 MiB of L2, of which ~45 MB stays across steps
    assert goes_wide(h200, "bfloat16", 10240, 2560) and goes_wide(h200, "float16", 10240, 2560)   # blogA's LSTM: 52 MB
    assert not goes_wide(h200, "bfloat16", 7680, 2560)                   # its GRU, 39 MB: stays in L2 (cublasLt wins)
    assert not goes_wide(h200, "tf32", 10240, 2560)                      # no wide kernel in tf32
    assert not goes_wide(h200, "bfloat16", 10240 + 64, 2560)             # 161 tiles: no whole blocks of 2
    assert not goes_wide(h200, "bfloat16", 4096, 1024)                   # `large`
    assert goes_wide(gpu_of(132, 40 << 20), "bfloat16", 7680, 2560)      # a smaller L2
    assert not goes_wide(h200, "bfloat16", 4 * 32768, 32768)             # 8 GiB: past the policy's 32-bit sizes


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the CUDA is compiled there)")
def test_the_kernel_and_the_copies_in_tiles_compile(tmp_path):
    sources = {"x3_wgmma": kernel_source(), "mode_wgmma": kernel_source("mode_wgmma.cu"),
               "mode_stream": kernel_source("mode_stream.cu"),       # benchmarks/probe_mode_stream.py's
               "mode_wide": kernel_source("mode_wide.cu"),           # mode_product's past the L2
               "mode_persist": kernel_source("mode_persist.cu"),     # benchmarks/probe_mode_persist.py's
               "split_products": kernel_file_source("split_products.cu"), "tiles": kernel_file_source("tiles.cu")}
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in sources["x3_wgmma"]
    for name in ("lstm", "gru_cho"):
        network = engine.Network(engine.preset(name).cell, 24, 100, 2)
        program = make_plan(dense(network, engine.init_params(network, seed=0))[0], 4, 19).program
        fixed = fixed_gemms(program, program.cell)
        copies = operand_copies(program, "float32x3", {g for g, strict in fixed.items() if strict}, "fp16", True)
        assert copies and all(f == "rnn_copy_split_fp16_tiles" for c in copies.values() for _, _, f in c.values())
        source = render_copies_module(program, "float32x3", copies, 1, None, None, "fp16")
        assert "rnn_copy_split_fp16_tiles(" in source and "(long)B, " in source, name
        sources[f"copies_{name}"] = source
    for precision in ("tf32", "bfloat16", "float16"):       # a reduced mode's copies in tiles
        network = engine.Network(engine.preset("lstm").cell, 24, 100, 2)
        program = make_plan(dense(network, engine.init_params(network, seed=0))[0], 4, 19).program
        copies = operand_copies(program, precision, (), "tf32", True)
        assert copies and all(f.startswith("rnn_copy_tiles_") for c in copies.values() for _, _, f in c.values())
        source = render_copies_module(program, precision, copies, 1, None, None)
        assert f"rnn_tile_at<{4 if precision == 'tf32' else 2}>" in source and "(long)B, " in source, precision
        sources[f"copies_lstm_{precision}"] = source
    compile_sources(sources, tmp_path)
