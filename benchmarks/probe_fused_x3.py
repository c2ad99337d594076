"""float32x3 on the fused backend (engine/schedules/split_products.py; issue #34's fp32-accurate target: at least 2x
cuDNN fp32 with TF32 off at `large` and blogA, its max relative error against float64 at most 2x cuDNN fp32's on the
same inputs). The K chunk of one tensor-core accumulator trades the chunks' partial products (bytes written and
folded every step) against the accumulators' drift, so each chunk size is a row: its time and its error beside
cuDNN fp32's, with the fused backend in strict fp32 and in tf32, and the persistent schedule in float32x3 beside
them.

Every row is the benchmark harness's own (engine/bench/runner.py bench_cell): a float64 reference on the GPU,
poisoned outputs checked first, CUDA-event timing after warm-up, medians; cuDNN fp32 with TF32 off.

--products first measures the step's product alone at the LSTM's and GRU's `large` and blogA shapes: strict fp32
(cublasLt, CUBLAS_COMPUTE_32F), tf32, and float32x3's stacked product folded, with the W_hi product's K chunks as a
strided batch (split_products.py's way, the engine's own calls) or as cublasLt's own split-K (each split its own
accumulator too, summed in place or in the workspace, so P1 is one plane): each its error against the float64
product (norm-relative, over strict fp32's) and its time in a chain of 50 captured into a CUDA graph (median of 11
launches). Last, the same product with the TF32 parts held as fp16 on fp16 tensor cores (fp16_parts: the same products from
half the bytes; the fused backend's x3_parts="fp16" since NOTES 2026-11-28 08:13), as a batch, on cublasLt's split-K,
and with only the big product (hi W_hi) in chunks and the two small ones as one GEMM of K whole (small_whole).

    python3 benchmarks/probe_fused_x3.py --out /tmp/probe [--configs large,blogA | a .json] [--chunks auto,none,512,256,128]
    python3 benchmarks/probe_fused_x3.py --out /tmp/probe --products
    python3 benchmarks/probe_fused_x3.py --out /tmp/probe --slices 1,2,4,5,8

--slices instead runs the fused backend in bf16 and tf32 with a step product's K in that many slices (k_slices: one
strided-batched GEMM whose planes the cell kernels sum as they read them), beside cuDNN in the same mode. The x3 rows
fold in the cell kernels (x3_fold="kernel", the default) and end with the last chunk folded by a launch of its own
(x3_fold="launch"); "auto" is the default chunk (split_products.chunk_size: by each product's K). Each row says
whether its timed runs were CUDA-graph replays, and the free device memory is printed before each row. --parts
tf32,fp16 adds the fused rows with float32x3's parts held as fp16 (x3_parts="fp16", named "-fp16"); --lean keeps
cuDNN fp32 and the fused float32x3 rows only; --splitk auto,false adds rows with the W_hi product's K chunks as a
strided batch of planes beside cublasLt's split-K (x3_splitk); --modes tf32,bf16 instead runs the reduced modes with
their step products on cuBLAS and on the engine's wgmma kernel (step_product), beside cuDNN in the same mode;
--product auto,cublaslt adds rows with the step product
on cublasLt beside the engine's own wgmma kernel that "auto" takes for fp16 parts on sm_90 (step_product, named
"-cublaslt"; engine/schedules/wgmma_products.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from probe_step_algos import CAP_REDUCTION_MASK, CAP_SPLITK_SUPPORT, REDUCTIONS, capability, configured  # noqa: E402
from step_chain import product_chain  # noqa: E402

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.bench.implementations import Cudnn, EngineBackend  # noqa: E402
from engine.bench.runner import bench_cell, environment, measure_launch, measure_sgemm, resolve_settings  # noqa: E402
from engine.codegen.cublas_enums import CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_16F, CUDA_R_32F  # noqa: E402
from engine.schedules.cublaslt import LtError, LtProjection, Product  # noqa: E402
from engine.schedules.split_products import (  # noqa: E402
    chunking,
    fold,
    partial_size,
    split_into,
    stack_split,
    stacked_calls,
)


class Variant(EngineBackend):
    """The fused backend in a mode with fused_modes.prepare options of its own, as a harness row named for them."""

    def __init__(self, precision: str, options: dict, label: str):
        super().__init__("fused", precision=precision)
        self.options = options
        self.name = f"fused-{precision}-{label}"

    def precision_options(self) -> dict:
        return {**super().precision_options(), **self.options}


def rows_of(result: dict) -> list[dict]:
    rows = []
    for entry in result["implementations"]:
        bound = entry.get("error_vs_cudnn_bound") or {}
        rows.append({"cell": result["preset"], "config": result["config"]["name"], "name": entry["name"],
                     "status": entry["status"], "reason": entry.get("reason"), "median_ms": entry.get("median_ms"),
                     "vs_cudnn_fp32": (entry.get("speedup") or {}).get("vs_cudnn_fp32"),
                     "vs_cudnn_same": (entry.get("speedup") or {}).get("vs_cudnn_same"),
                     "error_rel": (entry.get("error") or {}).get("rel"), "error_vs_cudnn": bound.get("ratio"),
                     "replayed": (entry.get("detail") or {}).get("replayed"), "peak_bytes": entry.get("peak_bytes")})
    return rows


SHAPES = [("lstm", "large", 128, 1024, 4096), ("gru", "large", 128, 1024, 3072),
          ("lstm", "blogA", 64, 2560, 10240), ("gru", "blogA", 64, 2560, 7680)]
CHAIN = 50


def products(cp, chunks) -> list[dict]:
    """The step's product alone, every variant: (cell, config, variant, error over strict fp32's, us a product)."""
    lt, rows = LtProjection.on_current_device(cp), []
    stream = cp.cuda.Stream(non_blocking=True)
    for cell, config, R, K, N in SHAPES:
        rng = np.random.default_rng(0)
        h = cp.asarray(rng.uniform(-1, 1, (R, K)).astype(np.float32))
        w = cp.asarray((rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32))
        exact = h.astype(cp.float64) @ w.astype(cp.float64).T
        stacked_w = stack_split(cp, w)
        parts = split_into(cp, h, cp.empty((2, R, K), dtype=cp.float32))
        out = cp.empty((R, N), dtype=cp.float32)
        cp.cuda.Device().synchronize()              # made on the null stream, used on `stream`

        def measure(label, issue):
            error, us = product_chain(cp, stream, out, exact, issue, CHAIN)
            rows.append({"cell": cell, "config": config, "variant": label, "error": error, "us": us})
            print(f"  {cell} {config} {label}: {us:.2f} us, error {error:.2e}", flush=True)
            return error

        def dense(compute, a=h, weight=w):
            return lambda: lt.product(Product.dense(R, N, K), a.data.ptr, weight.data.ptr, out.data.ptr, CUDA_R_32F,
                                      compute) or fail("dense")

        strict = measure("strict fp32", dense(CUBLAS_COMPUTE_32F))
        measure("tf32 (rounded by cuBLAS)", dense(CUBLAS_COMPUTE_32F_FAST_TF32))
        for chunk in chunks:
            found = chunking(K, chunk)
            partial = cp.empty(partial_size(R, N, found), dtype=cp.float32)
            cp.cuda.Device().synchronize()

            def batched(found=found, partial=partial):       # the engine's own calls (ModeDevice._stacked_product)
                for call in stacked_calls(R, K, N, found):
                    lt.product(call.shape, parts.data.ptr + 4 * call.a, stacked_w.data.ptr + 4 * call.w,
                               partial.data.ptr + 4 * call.out, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32) or fail("x3")
                fold(cp, partial, out, R, N, found.count)
            measure(f"x3 batch of {found.count} x {found.size}", batched)
        split_k(cp, lt, measure, parts, stacked_w, out, R, K, N)
        split_k(cp, lt, measure, split_into(cp, h, cp.empty((2, R, K), dtype=cp.float16), "fp16"),
                stack_split(cp, w, "fp16"), out, R, K, N, (CUDA_R_16F, CUBLAS_COMPUTE_32F), "x3 fp16 parts")
        fp16_parts(cp, lt, measure, h, w, out, R, K, N, chunks)
        for row in rows:
            if row["cell"] == cell and row["config"] == config:
                row["error_over_strict"] = row["error"] / strict
    return rows


def split_k(cp, lt, measure, parts, stacked_w, out, R, K, N, types=(CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32),
            name="x3") -> None:
    """float32x3's step product with its W_hi product on cublasLt's split-K instead of the batch of chunks (K / 512,
    K / 256, K / 128 splits, each reduction scheme it supports: each split its own accumulator, summed in place or
    in the workspace, so P1 is one plane), then h_hi W_lo and the fold as the engine makes them: the first of the
    heuristic's 8 algorithms that can split K. types: the parts' data and compute types (fp16 parts: CUDA_R_16F, fp32
    accumulation; their lo parts carry 2^11, which the fold takes off)."""
    data_type, compute = types
    item, scale = (2, 2048.0) if data_type == CUDA_R_16F else (4, 1.0)
    one_chunk = chunking(K, None)
    partial = cp.empty(partial_size(R, N, one_chunk), dtype=cp.float32)
    lo_call = stacked_calls(R, K, N, one_chunk)[-1]                     # h_hi W_lo into P2
    cp.cuda.Device().synchronize()
    # [h_hi; h_lo] by W_hi (the stacked weight's first N rows) into P1, the heuristic's first 8 algorithms kept
    bound = lt.bind(stacked_w[:N], partial[:2 * R * N].reshape(2 * R, N), data_type, compute, 8)
    if bound is None:
        fail("W_hi")
    for k, algo in enumerate(bound.plan.candidates):
        if not capability(lt.lib, algo, CAP_SPLITK_SUPPORT):
            continue
        mask = capability(lt.lib, algo, CAP_REDUCTION_MASK)
        for chunk in (512, 256, 128):
            for scheme, scheme_name in REDUCTIONS.items():
                variant = configured(lt.lib, algo, splitk=K // chunk, reduction=scheme) if mask & scheme else None
                if variant is None:
                    continue

                def issue(variant=variant):
                    bound.use(variant)
                    bound(parts.data.ptr, cp.cuda.get_current_stream().ptr)   # an error status raises LtError
                    lt.product(lo_call.shape, parts.data.ptr + item * lo_call.a, stacked_w.data.ptr + item * lo_call.w,
                               partial.data.ptr + 4 * lo_call.out, data_type, compute) or fail("h_hi W_lo")
                    fold(cp, partial, out, R, N, 1, scale)
                try:
                    measure(f"{name} algo {k} split-K {K // chunk} ({chunk}) {scheme_name}", issue)
                except (RuntimeError, LtError) as e:
                    print(f"algo {k} split {K // chunk} {scheme_name}: {e}", flush=True)
        return
    print(f"none of the heuristic's {len(bound.plan.candidates)} algorithms for ({2 * R} x {K}) @ ({K} x {N}) "
          "splits K", flush=True)


SPLIT16 = r"""
#include <cuda_fp16.h>
// x (n floats) -> dst[0 .. n) = hi = half(tf32(x)), dst[n .. 2n) = half(tf32(x - hi) * 2^11). A TF32 value has 11
// significant bits, as a half has: hi is tf32(x) exactly wherever it is in fp16's normal range, and lo, taken from hi
// as stored, carries what a subnormal hi lost; 2^11 lifts lo into the range hi has.
__device__ __forceinline__ float tf32_rna(float v) {
    unsigned u = __float_as_uint(v);
    return isfinite(v) ? __uint_as_float((u + 0x1000u) & 0xFFFFE000u) : v;
}
extern "C" __global__ void split16(const float* x, __half* dst, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const __half hi = __float2half_rn(tf32_rna(x[i]));
        dst[i] = hi;
        dst[n + i] = __float2half_rn(tf32_rna(x[i] - __half2float(hi)) * 2048.0f);
    }
}
// out (R x N) from P: P1 (count, 2R, N) of [hi rows; lo rows], then P2 (R, N): (P2 + sum lo) * 2^-11 + sum hi
extern "C" __global__ void fold16(const float* p, float* out, long rn, int count) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rn; i += (long)gridDim.x * blockDim.x) {
        float small = p[(long)count * 2 * rn + i], big = 0.0f;
        for (int c = 0; c < count; ++c) small += p[(long)c * 2 * rn + rn + i];
        for (int c = 0; c < count; ++c) big += p[(long)c * 2 * rn + i];
        out[i] = small * 0x1p-11f + big;
    }
}
// out (R x N) from P: `count` planes of hi W_hi (R, N) in K chunks, then the small products' one plane (R, N)
extern "C" __global__ void fold16s(const float* p, float* out, long rn, int count) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rn; i += (long)gridDim.x * blockDim.x) {
        float big = 0.0f;
        for (int c = 0; c < count; ++c) big += p[(long)c * rn + i];
        out[i] = p[(long)count * rn + i] * 0x1p-11f + big;
    }
}
"""


def fp16_parts(cp, lt, measure, h, w, out, R, K, N, chunks) -> None:
    """float32x3's step product with its TF32 parts held as fp16 (an idea for the fused backend, NOTES 2026-11-28
    06:18): each part has 11 significant bits, as a half has, so hi = half(tf32(v)) is exact in fp16's normal range
    and lo = half(tf32(v - hi) * 2^11), taken from hi as stored, carries what a subnormal hi lost; the two small
    products then carry 2^11 each, which the fold takes off their sum. The products are the TF32 ones (in NumPy:
    7.0e-8 from float64 at R 64, K 2560, N 1024 either way), on fp16 tensor cores from half the bytes. |v| >= 65504
    would overflow: the engine would have to catch it (NOTES)."""
    module = cp.RawModule(code=SPLIT16)
    split16, fold16 = module.get_function("split16"), module.get_function("fold16")
    parts = cp.empty((2, R, K), dtype=cp.float16)
    stacked = cp.empty((2, N, K), dtype=cp.float16)
    split16((264,), (256,), (h, parts, np.int64(R * K)))
    split16((264,), (256,), (w, stacked, np.int64(N * K)))
    cp.cuda.Device().synchronize()
    for chunk in chunks:
        found = chunking(K, chunk)
        partial = cp.empty(partial_size(R, N, found), dtype=cp.float32)
        cp.cuda.Device().synchronize()

        def issue(found=found, partial=partial):
            for call in stacked_calls(R, K, N, found):        # element offsets: 2 bytes an operand element here
                lt.product(call.shape, parts.data.ptr + 2 * call.a, stacked.data.ptr + 2 * call.w,
                           partial.data.ptr + 4 * call.out, CUDA_R_16F, CUBLAS_COMPUTE_32F) or fail("x3 fp16")
            fold16((264,), (256,), (partial, out, np.int64(R * N), np.int32(found.count)))
        measure(f"x3 fp16 parts, batch of {found.count} x {found.size}", issue)
    small_whole(cp, lt, measure, module.get_function("fold16s"), parts, stacked, out, R, K, N, chunks)


def small_whole(cp, lt, measure, fold16s, parts, stacked, out, R, K, N, chunks) -> None:
    """fp16 parts with only the big product in K chunks: hi W_hi, R rows (not 2R), a strided batch of chunk planes;
    the two small products as one GEMM of K whole, [h_lo | h_hi] (R x 2K) by [W_hi | W_lo] (N x 2K), into one plane
    (their drift is 2^-11 of the result's). P is count + 1 planes of (R, N), not 2 count + 1, and W_hi is read
    twice: from L2 where the weights fit it (`large`), from HBM at blogA. The weights and operand are laid out with
    their parts side by side in each row (K columns of W_hi, then K of W_lo)."""
    wide_w = cp.concatenate([stacked[0], stacked[1]], axis=1)            # (N, 2K): [W_hi | W_lo]
    wide_a = cp.concatenate([parts[1], parts[0]], axis=1)                # (R, 2K): [h_lo | h_hi]
    for chunk in chunks:
        found = chunking(K, chunk)
        partial = cp.empty((found.count + 1) * R * N, dtype=cp.float32)
        cp.cuda.Device().synchronize()
        big = [Product(R, N, found.size, 2 * K, 2 * K, found.full, (found.size, found.size, R * N))]
        starts = [(K, 0, 0)]
        if found.rest:
            first = found.full * found.size
            big.append(Product(R, N, found.rest, 2 * K, 2 * K))
            starts.append((K + first, first, found.full * R * N))

        def issue(found=found, partial=partial, big=big, starts=starts):
            for shape, (a, w, o) in zip(big, starts):
                lt.product(shape, wide_a.data.ptr + 2 * a, wide_w.data.ptr + 2 * w, partial.data.ptr + 4 * o,
                           CUDA_R_16F, CUBLAS_COMPUTE_32F) or fail("x3 fp16 hi W_hi")
            lt.product(Product.dense(R, N, 2 * K), wide_a.data.ptr, wide_w.data.ptr,
                       partial.data.ptr + 4 * found.count * R * N, CUDA_R_16F, CUBLAS_COMPUTE_32F) or fail("small")
            fold16s((264,), (256,), (partial, out, np.int64(R * N), np.int32(found.count)))
        measure(f"x3 fp16 parts, small products K whole, batch of {found.count} x {found.size}", issue)


def fail(what: str):
    raise RuntimeError(f"cublasLt offered no algorithm for the {what} product")


def harness_rows(implementations, configs: str, cells: str, reps: int) -> list[dict]:
    """bench_cell's rows for every config and cell, each printed as it comes."""
    settings = resolve_settings(quick=True, reps=reps, warmup=3, buffers=2, compile_budget_s=0.0, seed=0,
                                time_budget_s=None)
    measurements = {**measure_sgemm(), **measure_launch()}
    rows = []
    import cupy

    def free_memory(done, total, label):           # the device's free memory before each row (a leak shows here)
        print(f"  {label}: {cupy.cuda.runtime.memGetInfo()[0] / 2 ** 30:.1f} GiB free", flush=True)

    for config in parse_configs([configs] if configs.endswith(".json") else configs.split(",")):
        for name in cells.split(","):
            result = bench_cell(name, engine.preset(name).cell, engine.preset(name), config, implementations, settings,
                                measurements, deadline=None, progress=free_memory, done=0, total=0)
            if result["status"] != "ok":
                print(f"{name} {config.name}: {result['status']}: {result['reason']}", flush=True)
            for row in rows_of(result):
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def print_rows(rows: list[dict]) -> None:
    print("\ncell config implementation              median ms  x cuDNN fp32  x cuDNN same  error rel  x cuDNN's error")
    for r in rows:
        ms = f"{r['median_ms']:9.3f}" if r["median_ms"] else f"{'-':>9s}"
        speed = f"{r['vs_cudnn_fp32']:11.2f}x" if r["vs_cudnn_fp32"] else f"{'-':>12s}"
        same = f"{r['vs_cudnn_same']:11.2f}x" if r["vs_cudnn_same"] else f"{'-':>12s}"
        error = f"{r['error_rel']:9.2e}" if r["error_rel"] is not None else f"{'-':>9s}"
        ratio = f"{r['error_vs_cudnn']:8.2f}x" if r["error_vs_cudnn"] is not None else f"{'-':>9s}"
        replay = "" if not r.get("replayed") or r["replayed"].startswith("replayed") else "  (direct runs)"
        print(f"{r['cell']:4s} {r['config']:11s} {r['name']:28s} {ms} {speed} {same} {error} {ratio}{replay}"
              + ("" if r["status"] == "ok" else f"  {r['status']}: {str(r['reason'])[:80]}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--configs", default="large,blogA")
    parser.add_argument("--cells", default="lstm,gru")
    parser.add_argument("--chunks", default="auto,none,512,256,128")
    parser.add_argument("--splitk", default="false", help="x3_splitk values for the fused rows: auto, true, false "
                        "(e.g. auto,false)")
    parser.add_argument("--lean", action="store_true", help="cuDNN fp32 and the fused float32x3 rows only")
    parser.add_argument("--parts", default="tf32", help="float32x3's parts for the fused rows: tf32, fp16 or both "
                        "(x3_parts; e.g. tf32,fp16)")
    parser.add_argument("--product", default="auto", help="step_product values for the fused rows: auto, wgmma, "
                        "cublaslt (e.g. auto,cublaslt)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--products", action="store_true", help="the step's product alone, every variant")
    parser.add_argument("--modes", default=None, help="instead: the fused backend in these reduced modes (e.g. "
                        "tf32,bf16,fp16), its step products on cuBLAS and on the engine's wgmma kernel, beside cuDNN")
    parser.add_argument("--slices", default=None,
                        help="instead: the fused backend in bf16 and tf32 with k_slices of these (e.g. 1,2,4,5,8)")
    args = parser.parse_args()
    chunks = [None if c == "none" else c if c == "auto" else int(c) for c in args.chunks.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.products:
        import cupy
        rows = products(cupy, chunks)
        (out / "probe_fused_x3_products.json").write_text(json.dumps({"environment": environment(), "rows": rows},
                                                                     indent=1))
        print("\ncell config variant                                 us a product  error (x strict fp32's)")
        for r in rows:
            print(f"{r['cell']:4s} {r['config']:6s} {r['variant']:40s} {r['us']:9.2f}  {r['error']:.2e} "
                  f"({r['error_over_strict']:.2f}x)")
        return
    if args.modes:
        modes = args.modes.split(",")
        implementations = [impl for mode in modes for impl in (
            Cudnn(mode), Variant(mode, {"step_product": "cublaslt"}, "cublaslt"),
            Variant(mode, {"step_product": "wgmma"}, "wgmma"))]
        name = "probe_fused_modes_wgmma.json"
    elif args.slices:
        slices = [int(n) for n in args.slices.split(",")]
        implementations = [Cudnn(mode) for mode in ("bf16", "tf32")] + [
            Variant(mode, {"k_slices": n}, f"s{n}") for mode in ("bf16", "tf32") for n in slices]
        name = "probe_fused_slices.json"
    else:
        flags = {"auto": "auto", "true": True, "false": False}
        x3 = [Variant("fp32x3", {"x3_chunk": c, "x3_parts": parts, "x3_splitk": flags[splitk], "step_product": product},
                      f"k{c or 'all'}" + ("" if parts == "tf32" else f"-{parts}") + ("" if splitk == "false" else
                                                                                     f"-splitk-{splitk}")
                      + ("" if product == "auto" else f"-{product}"))
              for parts in args.parts.split(",") for c in chunks for splitk in args.splitk.split(",")
              for product in args.product.split(",")]
        implementations = [Cudnn("fp32"), *x3] if args.lean else [
            Cudnn("fp32"), EngineBackend("fused"), EngineBackend("fused", precision="tf32"), *x3,
            Variant("fp32x3", {"x3_chunk": chunks[-1], "x3_fold": "launch"}, f"k{chunks[-1] or 'all'}-fold-launch"),
            EngineBackend("persistent", precision="fp32x3")]
        name = "probe_fused_x3.json"
    rows = harness_rows(implementations, args.configs, args.cells, args.reps)
    (out / name).write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))
    print_rows(rows)


if __name__ == "__main__":
    main()
