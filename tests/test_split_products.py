"""float32x3's stacked product for the fused backend (engine/schedules/split_products.py), on the CPU: the chunks
cover K, the products the GPU path issues (offsets, leading dimensions, batch strides) folded are exactly the
emulation's three products (the fourth, lo W_lo, never made), the fold's flat indices are kernels/split_products.cu's,
the kernels compile, and cublasLt is told a chunked product as a strided batch. The GPU suite runs it (tests/gpu/test_precision_fp32x3_gpu.py)."""
from __future__ import annotations

import ctypes
import dataclasses
import shutil

import numpy as np
import pytest
from nvcc_check import compile_sources
from test_cublaslt_dispatch import recording_lt

import engine
from engine.codegen.cublas_enums import CUDA_R_32F, LT_LAYOUT_BATCH_COUNT, LT_LAYOUT_STRIDED_BATCH_OFFSET
from engine.codegen.cuda import kernel_file_source
from engine.codegen.operand_copies import operand_copies, render_copies_module
from engine.codegen.programmatic import programmatic_waits
from engine.compiler import make_plan
from engine.dense import dense
from engine.plan import Access, Lin
from engine.rounding import mode_matmul, split_fp16, split_tf32
from engine.schedules.cublaslt import LtProjection, Product
from engine.schedules.fused_modes import fixed_gemms
from engine.schedules.split_products import (
    Chunks,
    Left,
    chunk_size,
    chunking,
    fold_numpy,
    fold_read,
    fp16_parts_hold,
    in_fp16_range,
    left_bytes,
    left_products,
    partial_size,
    plane_chunks,
    planes_read,
    read_places,
    run_calls_numpy,
    split_calls,
    split_into,
    splitk_calls,
    stack_split,
    stacked_calls,
    stacked_product_numpy,
    uses_splitk,
)


@pytest.mark.parametrize("K", [1, 3, 7, 12, 50, 98, 256, 300, 1024, 2560, 2561])
@pytest.mark.parametrize("chunk", [None, 4, 32, 48, 256])
def test_the_chunks_cover_k_once_in_16_byte_steps(K, chunk):
    found = chunking(K, chunk)
    bounds = found.bounds()
    assert bounds[0][0] == 0 and sum(n for _, n in bounds) == K
    assert all(first + n == after for (first, n), (after, _) in zip(bounds, bounds[1:]))
    assert len(bounds) == found.count
    if chunk and chunk < K:
        assert found.size % 4 == 0 and found.size <= chunk + 3, found
        assert found.count <= -(-K // chunk) + 1, found
    else:
        assert found == Chunks(K, 1)
    with pytest.raises(ValueError):
        chunking(0, chunk)


@pytest.mark.parametrize("K, size, count", [(16, 64, 1), (64, 64, 1), (256, 64, 4), (511, 64, 8), (512, 128, 4),
                                            (1024, 256, 4), (2560, 512, 5), (4096, 1024, 4)])
def test_auto_chunks_a_product_into_at_least_four_accumulators_of_a_power_of_two(K, size, count):
    assert chunk_size(K, "auto") == size and chunk_size(K, 100) == 100 and chunk_size(K, None) is None
    found = chunking(K, "auto")
    assert (found.size, found.count) == ((K, 1) if K <= 64 else (size, count))
    assert chunking(K) == found                                        # the default


@pytest.mark.parametrize("rows, cols, K, chunk", [(3, 5, 37, None), (3, 5, 37, 8), (4, 6, 98, 32), (2, 3, 50, 48)])
def test_the_folded_products_are_the_three_products_of_the_parts(rows, cols, K, chunk):
    rng = np.random.default_rng(K)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    w = (rng.standard_normal((cols, K)) * 10.0 ** rng.integers(-3, 3, (cols, K))).astype(np.float32)
    stacked = stack_split(np, w)
    assert stacked.shape == (2 * cols, K) and stacked.dtype == np.float32
    w_hi, w_lo = split_tf32(w)
    np.testing.assert_array_equal(stacked, np.concatenate([w_hi, w_lo]))
    parts = split_into(np, x, np.full((2, rows, K), np.nan, np.float32))
    got = stacked_product_numpy(parts, stacked, chunking(K, chunk))
    emulated = mode_matmul(w.astype(np.float64), x.astype(np.float64), "float32x3", lambda a, b: b @ a.T)
    np.testing.assert_allclose(got, emulated, rtol=1e-13, atol=1e-13)
    x_hi, x_lo = split_tf32(x)
    lo_lo = x_lo @ w_lo.T                                  # the fourth product, never made
    assert np.abs(lo_lo).max() > 0
    np.testing.assert_allclose(got + lo_lo, (x_hi + x_lo) @ (w_hi + w_lo).T, rtol=1e-13, atol=1e-13)
    # and at fp32's level from the exact product (hi + lo is v to within 2^-22 of it)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(got - exact).max() <= 2.0 ** -20 * (np.abs(x).astype(np.float64) @ np.abs(w).T).max()


@pytest.mark.parametrize("R, K, N, chunk", [(3, 37, 5, None), (3, 37, 5, 8), (4, 98, 6, 32), (2, 50, 3, 48),
                                            (5, 12, 7, 4)])
def test_the_products_issued_are_the_emulations(R, K, N, chunk):
    """The offsets, leading dimensions and batch strides the GPU path gives cublasLt (stacked_calls, split_calls),
    run as Product defines them on flat buffers (each read checked to stay inside its buffer): the step's P folded,
    and the projection's three products (the bias on the first, added by cublasLt's epilogue), are the float32x3
    emulation; every float of P is written, and W_hi and W_lo are each read by one product of the step."""
    rng = np.random.default_rng(R * K)
    x = rng.standard_normal((R, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    emulated = mode_matmul(w.astype(np.float64), x.astype(np.float64), "float32x3", lambda a, b: b @ a.T)
    chunks = chunking(K, chunk)
    parts = split_into(np, x, np.empty((2, R, K), np.float32)).ravel().astype(np.float64)
    stacked = stack_split(np, w).ravel().astype(np.float64)
    partial = np.full(partial_size(R, N, chunks), np.nan)
    calls = stacked_calls(R, K, N, chunks)
    run_calls_numpy(calls, parts, stacked, partial)
    assert not np.isnan(partial).any(), "every chunk's plane and P2 written"
    np.testing.assert_allclose(fold_numpy(partial, R, N, chunks.count), emulated, rtol=1e-13, atol=1e-13)
    assert [c.w < N * K for c in calls] == [True] * (len(calls) - 1) + [False]       # W_hi by the chunks, W_lo once
    out = np.full(R * N, np.nan)
    calls = split_calls(R, K, N, chunks, bias=True)
    assert [c.bias for c in calls] == [True] + [False] * (len(calls) - 1)
    assert not calls[0].accumulate and all(c.accumulate for c in calls[1:])
    run_calls_numpy(calls, parts, stacked, out)
    np.testing.assert_allclose(out.reshape(R, N), emulated, rtol=1e-13, atol=1e-13)    # the bias: the epilogue's


def test_a_projection_in_fp16_parts_scales_its_two_small_products():
    """ModeDevice._split_products in fp16 parts: the first two of split_calls (x_hi W_lo, x_lo W_hi: each with one
    lo part, which carries 2^11) scaled by 2^-11 (cublasLt's alpha), the chunks of x_hi W_hi not: float32x3's product
    of the fp16 parts, within fp32's reach of float64."""
    rng = np.random.default_rng(4)
    R, K, N = 6, 100, 9
    x = rng.standard_normal((R, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    parts = split_into(np, x, np.empty((2, R, K), np.float16), "fp16").ravel().astype(np.float64)
    stacked = stack_split(np, w, "fp16").ravel().astype(np.float64)
    out = np.zeros(R * N)
    for i, call in enumerate(split_calls(R, K, N, chunking(K, 32), bias=False)):
        alone = np.zeros(R * N)
        run_calls_numpy([dataclasses.replace(call, accumulate=False)], parts, stacked, alone)
        out += alone / (2048.0 if i < 2 else 1.0)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.linalg.norm(out.reshape(R, N) - exact) / np.linalg.norm(exact) < 1e-6


def test_a_product_past_its_buffer_is_caught():
    call = stacked_calls(2, 8, 3, Chunks(4, 2))[0]
    with pytest.raises(ValueError, match="reads A past its"):
        run_calls_numpy([call], np.zeros(2 * 2 * 8 - 1), np.zeros(2 * 3 * 8), np.zeros(partial_size(2, 3, Chunks(4, 2))))


def test_the_fold_reads_the_kernels_flat_indices():
    """fold_x3's loop, index for index (kernels/split_products.cu), on a flat P: the same as fold_numpy's slices."""
    rng = np.random.default_rng(3)
    R, N, C = 3, 4, 2
    flat, out = rng.standard_normal(partial_size(R, N, Chunks(8, C))), np.empty(R * N)
    total, chunk = R * N, 2 * R * N
    for idx in range(total):
        p = idx
        small, big = flat[C * chunk + idx], 0.0
        for _ in range(C):
            small += flat[p + total]
            big += flat[p]
            p += chunk
        out[idx] = small + big
    np.testing.assert_allclose(out.reshape(R, N), fold_numpy(flat, R, N, C), rtol=1e-15)


def evaluate(expression: str, arrays: dict, **names) -> float:
    """A generated load expression evaluated in Python (its C casts dropped): arrays by param name, b, j, B, H."""
    return eval(expression.replace("(long)", ""), {}, {**arrays, **names})  # noqa: S307 - the engine's own text


def test_a_kernel_reads_the_planes_summed_and_the_fold_in_its_order():
    """The loads planes_read and fold_read generate, evaluated at every (b, j): the planes' sum, and the fold kernel's
    value (fold_numpy) of float32x3's P. The access is a GEMM output's (rows of H floats)."""
    access = Access("g_out", "batch", ld=Lin(h=1))
    B, H = 3, 5
    rng = np.random.default_rng(4)
    planes = rng.standard_normal(4 * B * H)
    (text,) = planes_read(4)(access)
    assert text.startswith("(g_out[b * H + j] + g_out[b * H + j + 1 * (long)B * H]")
    for b in range(B):
        for j in range(H):
            want = sum(planes[s * B * H + b * H + j] for s in range(4))
            assert evaluate(text, {"g_out": planes}, b=b, j=j, B=B, H=H) == pytest.approx(want, rel=1e-15)
    count = 3
    partial = rng.standard_normal(Left("fold", count).floats(B, H))
    for scale in (1.0, 2048.0):                    # fp16 parts: the small products' sum over 2^11
        (text,) = fold_read(count, scale)(access)
        assert ("0.00048828125f" in text) == (scale != 1.0)
        folded = fold_numpy(partial, B, H, count, scale)
        for b in range(B):
            for j in range(H):
                got = evaluate(text.replace("0.00048828125f", "0.00048828125"), {"g_out": partial}, b=b, j=j, B=B, H=H)
                assert got == pytest.approx(folded[b, j], rel=1e-15)


def test_which_step_products_are_left_for_the_kernels():
    network = engine.Network(engine.preset("gru_cho").cell, 24, 64, 2)
    plan = make_plan(network, 4, 2)
    program = plan.program
    fixed = {g.name: False for g in program.gemms}
    copied = {g.in_buffer for g in program.gemms if not g.hoisted}
    steps = sorted(g.name for g in program.gemms if not g.hoisted)
    assert left_products(plan, "bfloat16", copied, fixed) == {}                      # k_slices=1: one product
    assert left_products(plan, "bfloat16", copied, fixed, k_slices=4) == {g: Left("planes", 4) for g in steps}
    assert left_products(plan, "bfloat16", copied, fixed, k_slices=16) == {}         # 64 / 16 = 4 columns: no
    assert left_products(plan, "float32x3", copied, fixed, k_slices=4, x3_fold="launch") == {}   # a fold launch
    assert left_products(plan, "float32x3", copied, fixed, x3_parts="tf32") == {
        g: Left("fold", 1) for g in steps}                                          # K=64: 1 chunk
    assert left_products(plan, "float32x3", copied, fixed, x3_chunk=16, x3_fold="kernel", x3_parts="tf32") == {
        g: Left("fold", 4) for g in steps}
    assert left_products(plan, "float32x3", copied, fixed, x3_parts="fp16") == {g: Left("fold", 1, 2048.0)
                                                                               for g in steps}
    assert left_products(plan, "bfloat16", set(), fixed, k_slices=4) == {}           # no copy: gemm() rounds it
    n = next(g for g in program.gemms if g.name == steps[0]).n(plan.layer_sizes(0))
    assert left_bytes(plan, {steps[0]: Left("planes", 4)}) == 2 * 3 * 2 * n * 4    # 3 more planes of (B, N), 2 layers


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the CUDA is compiled there)")
def test_modules_that_sum_the_products_as_they_read_them_compile(tmp_path):
    sources = {}
    for name, precision, left, parts in (("gru_cho", "bfloat16", Left("planes", 4), "tf32"),
                                         ("lstm", "float32x3", Left("fold", 3), "tf32"),
                                         ("gru_cho", "float32x3", Left("fold", 2, 2048.0), "fp16"),
                                         ("ln_lstm", "tf32", Left("planes", 2), "tf32")):
        network = engine.Network(engine.preset(name).cell, 24, 64, 2)
        program = make_plan(dense(network, engine.init_params(network, seed=0))[0], 4, 2).program
        fixed = fixed_gemms(program, program.cell)
        copies = operand_copies(program, precision, {g for g, strict in fixed.items() if strict}, parts)
        readers = {g.out_buffer: left.reader() for g in program.gemms if not g.hoisted and not fixed[g.name]}
        places = read_places(program, readers)
        assert places, name
        source = render_copies_module(program, precision, copies, 1, programmatic_waits(program), places, parts)
        assert "_gemm_out[b * " in source and " * (long)B * " in source, name          # the loads sum what is left
        assert ("rnn_copy_split" in source) == (precision == "float32x3")
        # fp16 parts: the copies write halves and flag values past fp16's range, the loads take 2^11 off
        assert ("rnn_copy_split_fp16(" in source and "*range = 1u" in source
                and "unsigned int* __restrict__ rnn_fp16_range," in source
                and "0.00048828125f" in source) == (parts == "fp16"), name
        sources[f"{name}_{precision}_{parts}"] = source
    compile_sources(sources, tmp_path)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the CUDA is compiled there)")
def test_the_split_and_fold_kernels_compile(tmp_path):
    source = kernel_file_source("split_products.cu")
    compile_sources({"split_products": source}, tmp_path)


def test_a_chunked_product_is_a_strided_batch_of_k_slices():
    lt = recording_lt()
    shape = Product(2 * 64, 2 * 10240, 256, 2560, 2560, 10, (256, 256, 4 * 64 * 10240))
    plan = lt.plan(shape, CUDA_R_32F, 77, 0)
    layouts = [args for name, args in lt.lib.calls if name == "cublasLtMatrixLayoutCreate"]
    # W (K slice x 2N, ld K), A (K slice x 2R, ld K), out (2N x 2R): column-major, as cublasLt reads row-major ones
    assert [tuple(a.value for a in args[2:]) for args in layouts] == [(256, 20480, 2560), (256, 128, 2560),
                                                                      (20480, 128, 20480)]
    sets = [(args[0].value, args[1].value, args[2]._obj.value) for name, args in lt.lib.calls
            if name == "cublasLtMatrixLayoutSetAttribute"]
    w, a, c = (layout.value for layout in plan.layouts)
    assert sorted(sets) == sorted([(x, LT_LAYOUT_BATCH_COUNT, 10) for x in (a, w, c)] + [
        (a, LT_LAYOUT_STRIDED_BATCH_OFFSET, 256), (w, LT_LAYOUT_STRIDED_BATCH_OFFSET, 256),
        (c, LT_LAYOUT_STRIDED_BATCH_OFFSET, 4 * 64 * 10240)])
    # a dense product sets no batch
    lt.lib.calls.clear()
    lt.plan(Product.dense(64, 512, 256), CUDA_R_32F, 77, 0)
    assert not [name for name, _ in lt.lib.calls if name == "cublasLtMatrixLayoutSetAttribute"]


def test_the_heuristic_is_told_each_k_slices_alignment():
    # a dense product: each address's own (as before); a K slice: its rows and batch members start at most that
    # aligned (rows of 98 floats start 8-byte aligned; out's rows of 196 floats 16-byte)
    assert LtProjection._aligned(Product.dense(8, 16, 32), 0x1000, 0x2000, 0x3000, CUDA_R_32F) == (256, 256, 256)
    chunk = Product(32, 196, 14, 98, 98)
    assert LtProjection._aligned(chunk, 0x1000 + 4 * 84, 0x2000 + 4 * 84, 0x3000, CUDA_R_32F) == (8, 8, 16)
    assert LtProjection._aligned(Product(32, 192, 32, 128, 128), 0x1000 + 4 * 32, 0x2000, 0x3000,
                                 CUDA_R_32F) == (256, 128, 256)
    batch = Product(32, 196, 28, 98, 98, 3, (28, 28, 32 * 196))
    assert LtProjection._aligned(batch, 0x1000, 0x2000, 0x3000, CUDA_R_32F) == (8, 8, 16)


def test_accumulate_passes_beta_one():
    lt = recording_lt()
    lt.lib.cublasLtMatmulAlgoGetHeuristic = lambda *args: (args[-1]._obj.__setattr__("value", 1), 0)[1]

    class Stream:
        ptr = 0

    class Cuda:
        @staticmethod
        def get_current_stream():
            return Stream()

    class Cupy:
        cuda = Cuda

    class Workspace:
        class data:
            ptr = 0x9000
    lt.cupy, lt.workspace = Cupy, Workspace
    for accumulate, beta in ((False, 0.0), (True, 1.0)):
        lt.lib.calls.clear()
        assert lt.product(Product.dense(4, 8, 16), 0x1000, 0x2000, 0x3000, CUDA_R_32F, 77, accumulate=accumulate)
        (args,) = [args for name, args in lt.lib.calls if name == "cublasLtMatmul"]
        assert ctypes.cast(args[7], ctypes.POINTER(ctypes.c_float)).contents.value == beta


def test_fp16_parts_are_the_tf32_parts_held_in_half_the_bytes():
    """engine.rounding.split_fp16 (the kernels' rnn_copy_split_fp16 and split_contiguous_fp16): in fp16's normal range
    hi is split_tf32's hi and lo its lo times 2^11, exactly; below it (a subnormal hi) lo carries what hi lost, so
    hi + lo / 2^11 stays within 2^-22 of the value; past 65504 hi is infinite, which in_fp16_range refuses first."""
    rng = np.random.default_rng(11)
    normal = (rng.standard_normal(20000) * 30).astype(np.float32)
    normal = normal[np.abs(normal) >= 2.0 ** -12]      # below it lo can be subnormal
    normal = np.concatenate([normal, np.float32(2.0 ** -12) * (1 + np.arange(2000, dtype=np.float32) / 1000)])
    hi, lo = split_fp16(normal)
    hi32, lo32 = split_tf32(normal)
    np.testing.assert_array_equal(hi, hi32)
    np.testing.assert_array_equal(lo, lo32 * 2048)
    w = np.random.default_rng(2).standard_normal((64, 32))
    assert fp16_parts_hold(w * 1e-3) and not fp16_parts_hold(w * 1e-5) and fp16_parts_hold(np.zeros((3, 3)))
    assert fp16_parts_hold(np.kron(np.eye(4), w[:8, :8] * 1e-3))      # a block-diagonal weight's zeros do not count
    tiny = (rng.standard_normal(5000) * 1e-6).astype(np.float32)
    hi, lo = split_fp16(tiny)
    assert np.abs(hi + lo / 2048 - tiny).max() <= 2.0 ** -22 * 2.0 ** -13
    assert in_fp16_range(np.array([65504.0, -65504.0, np.nan])) and not in_fp16_range(np.array([1.0, -65520.0]))
    assert np.isinf(split_fp16(np.array([70000.0]))[0]).all()
    stacked = stack_split(np, normal.reshape(-1, 4)[:6], "fp16")
    assert stacked.dtype == np.float16 and stacked.shape == (12, 4)


def test_split_k_takes_the_chunks_where_k_is_long_and_leaves_one_plane():
    """x3_splitk "auto" (the default is False, the batch: split-K was slower in the whole run): cublasLt's split-K for the W_hi product where K >= X3_SPLITK_MIN_K and it has chunks (blogA's
    2560 in 5) in fp16 parts, a strided batch elsewhere (`large`'s 1024, TF32 parts); its calls compute the same product, into one plane of P1
    and P2 after it."""
    assert not uses_splitk(2560) and plane_chunks(2560) == chunking(2560)       # the default: the batch
    assert uses_splitk(2560, splitk="auto") and plane_chunks(2560, splitk="auto") == Chunks(2560, 1)
    assert not uses_splitk(1024, splitk="auto") and plane_chunks(1024, splitk="auto") == chunking(1024)
    assert uses_splitk(1024, splitk=True) and not uses_splitk(2560, splitk=False)
    assert not uses_splitk(4096, chunk=None, splitk=True)              # one chunk: nothing to split
    assert not uses_splitk(2560, splitk="auto", parts="tf32") and uses_splitk(2560, splitk=True, parts="tf32")
    R, K, N = 3, 40, 5
    calls = splitk_calls(R, K, N, 4)
    assert [(c.shape.M, c.shape.K, c.shape.splits, c.w, c.out) for c in calls] == [(2 * R, K, 4, 0, 0),
                                                                                     (R, K, 1, N * K, 2 * R * N)]
    rng = np.random.default_rng(3)
    h, w = rng.standard_normal((R, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)
    parts = split_into(np, h, np.empty((2, R, K), np.float32))
    partial = np.full(partial_size(R, N, Chunks(K, 1)), np.nan)
    run_calls_numpy(calls, parts.astype(np.float64).ravel(), stack_split(np, w).astype(np.float64).ravel(), partial)
    np.testing.assert_allclose(fold_numpy(partial, R, N, 1), stacked_product_numpy(parts, stack_split(np, w),
                                                                                    chunking(K, 8)), rtol=1e-12)
    network = engine.Network(engine.preset("lstm").cell, 64, 2560, 1)
    plan = make_plan(network, 4, 2)
    fixed = {g.name: False for g in plan.program.gemms}
    copied = {g.in_buffer for g in plan.program.gemms if not g.hoisted}
    left = left_products(plan, "float32x3", copied, fixed, x3_splitk="auto")
    assert set(left.values()) == {Left("fold", 1, 2048.0)}
    assert set(left_products(plan, "float32x3", copied, fixed, x3_parts="tf32", x3_splitk="auto").values()) == {
        Left("fold", 5)}
    assert set(left_products(plan, "float32x3", copied, fixed).values()) == {Left("fold", 5, 2048.0)}
