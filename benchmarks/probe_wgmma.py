"""One recurrent step's GEMM on Hopper's warpgroup MMA (wgmma) against the warp MMA (mma.sync) the schedules use now,
with the same data movement (issue #34 item 1: does issuing the MMAs asynchronously by a warpgroup pay at the step's
shape, before a schedule is built on it).

Each block owns NT gate columns of a layer: its bf16 weight slice W (NT x K) stays in shared memory for the whole run,
and every step it multiplies the layer's h (B x K, bf16, from global memory / L2) by it: Y (B x NT, fp32) = h W^T.
h streams through shared memory in chunks of 128-byte rows (64 bf16 or 32 tf32 columns), each row's 16-byte groups XOR-swizzled
by row (the 128-byte swizzle both wgmma's descriptors and conflict-free ldmatrix want). STEPS steps a launch, so a
launch's time over STEPS is one step's GEMM. Both kernels:

- wgmma: a warpgroup (4 warps) a 64-row slice of the batch; per chunk 4 wgmma.m64nNTk16 with both operands read by
  the tensor cores from shared memory through matrix descriptors (start address, stride 1024 bytes between 8-row
  core-matrix groups, 128-byte swizzle), one commit and wait a chunk;
- mma.sync: a warp 16 rows of the batch; per 16 columns of a chunk, ldmatrix.x4 of its A tile, ldmatrix.x4 for each
  pair of 8-column groups of W, NT / 8 m16n8k16 MMAs.

All are checked against NumPy (the rounded operands' product summed in float64) before they are timed; medians of
CUDA-event timed launches after warm-up, with h restaged every chunk (a step as it would run) and staged once
(restage 0: every chunk multiplies chunk 0, the MMAs' time alone). The sizes, in bf16 and in tf32 (m64nNTk8, fp32
operands already rounded to tf32): `large` (K = H = 1024, B = 128, 128 blocks of NT = 64 columns, 32 in tf32) and
`blogA` (K = 2560, B = 64, 132 blocks of NT = 32, 16 in tf32), so that the weight slice fits shared memory.

    python benchmarks/probe_wgmma.py [--steps 100] [--json out.json]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_schedules import checked, finish, time_ms  # noqa: E402  (benchmarks/, the script's folder)

THREADS_PER_GROUP = 128        # a warpgroup
# Per operand kind: the element's C type, elements a 16-byte group, and the mma.sync instruction (a k step is 32
# bytes of a row in both: 16 bf16 or 8 tf32; the wgmma side is kernels/wgmma.cuh's RnnWgmma<NT, tf32>).
KINDS = {"bf16": ("unsigned short", 8, "m16n8k16.row.col.f32.bf16.bf16.f32"),
         "tf32": ("float", 4, "m16n8k8.row.col.f32.tf32.tf32.f32")}
WGMMA_HEADER = Path(__file__).resolve().parents[1] / "kernels" / "wgmma.cuh"


def chunk_columns(kind: str) -> int:
    """Columns of h a chunk: one 128-byte row per batch row (64 bf16, 32 tf32)."""
    return 8 * KINDS[kind][1]


def source(nt: int, kind: str = "bf16") -> str:
    """The kernels for NT columns a block (16, 32 or 64) and operand kind (bf16 or tf32), compiled for sm_90a
    (wgmma is arch-specific)."""
    elem, per_group, mma_shape = KINDS[kind]
    return WGMMA_HEADER.read_text() + r"""
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Copies rows [0, rows) x one chunk of columns from k0 (128 bytes a row) of a row-major matrix (row stride ld
// elements) into a swizzled tile, 16 bytes a thread at a time.
__device__ __forceinline__ void stage(unsigned char* tile, const __ELEM__* __restrict__ src, int rows, int ld, int k0)
{
    for (int i = threadIdx.x; i < rows * 8; i += blockDim.x) {
        const int r = i >> 3, g = i & 7;
        *reinterpret_cast<uint4*>(tile + rnn_swz128(r, g)) =
            *reinterpret_cast<const uint4*>(src + (long)r * ld + k0 + g * __EPG__);
    }
}

// The weight slice of this block (rows n0.. of W, NT x K) into K / CHUNK swizzled tiles, once.
__device__ __forceinline__ void load_weights(unsigned char* w_tiles, const __ELEM__* __restrict__ w, int K)
{
    const __ELEM__* mine = w + (long)blockIdx.x * __NT__ * K;
    for (int c = 0; c < K / __CHUNK__; ++c) stage(w_tiles + c * __NT__ * 128, mine, __NT__, K, c * __CHUNK__);
}

__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* raw)
{
    return raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
}

// The warpgroup's accumulators into its 64 rows of Y (row stride N) at this block's columns (the layout of
// kernels/wgmma.cuh).
__device__ __forceinline__ void store_wgmma(float* __restrict__ y, const float (&d)[__REGS__], int N, int group)
{
    const int q = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row = group * 64 + q * 16 + g;
    float* out = y + (long)blockIdx.x * __NT__;
#pragma unroll
    for (int j = 0; j < __NT__ / 8; ++j) {
        out[(long)row * N + 8 * j + 2 * t] = d[4 * j];
        out[(long)row * N + 8 * j + 2 * t + 1] = d[4 * j + 1];
        out[(long)(row + 8) * N + 8 * j + 2 * t] = d[4 * j + 2];
        out[(long)(row + 8) * N + 8 * j + 2 * t + 1] = d[4 * j + 3];
    }
}

extern "C" __global__ void step_wgmma(const __ELEM__* __restrict__ h, const __ELEM__* __restrict__ w,
                                      float* __restrict__ y, int B, int K, int N, int steps, int restage)
{
    extern __shared__ unsigned char raw[];
    unsigned char* w_tiles = aligned_smem(raw);                    // K / CHUNK tiles of NT rows
    unsigned char* x_tile = w_tiles + (K / __CHUNK__) * __NT__ * 128;     // one chunk: B rows (a multiple of 1024 bytes)
    load_weights(w_tiles, w, K);
    const int group = threadIdx.x / 128;                           // the warpgroup: batch rows 64 * group ..
    float d[__REGS__];
    for (int step = 0; step < steps; ++step) {
        for (int c = 0; c < K / __CHUNK__; ++c) {
            if (restage || (step == 0 && c == 0)) {                // restage 0: chunk 0 for all (MMA time alone)
                __syncthreads();                                   // the chunk before is consumed
                stage(x_tile, h, B, K, c * __CHUNK__);
                rnn_fence_async_shared();              // generic writes -> the async proxy
                __syncthreads();
            }
            rnn_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                RnnWgmma<__NT__, __TF32__>::mma(d, rnn_wgmma_desc(smem_u32(x_tile + group * 64 * 128) + kk * 32),
                         rnn_wgmma_desc(smem_u32(w_tiles + c * __NT__ * 128) + kk * 32), c > 0 || kk > 0);
            rnn_wgmma_commit();
            rnn_wgmma_wait<0>();
        }
    }
    store_wgmma(y, d, N, group);
}

// The same GEMM with h's chunks double-buffered: chunk c + 1 is staged while the tensor cores multiply chunk c
// (wgmma runs asynchronously; wait_group 1 leaves only the newest group in flight, so the buffer chunk c - 1 used
// is free once every warpgroup has passed it). restage 0 is not taken: this kernel is about the overlap.
extern "C" __global__ void step_wgmma_db(const __ELEM__* __restrict__ h, const __ELEM__* __restrict__ w,
                                         float* __restrict__ y, int B, int K, int N, int steps, int restage)
{
    extern __shared__ unsigned char raw[];
    unsigned char* w_tiles = aligned_smem(raw);
    unsigned char* x_tiles = w_tiles + (K / __CHUNK__) * __NT__ * 128;   // two chunks, each B rows of 128 bytes
    const int x_bytes = B * 128;
    load_weights(w_tiles, w, K);
    const int group = threadIdx.x / 128, chunks = K / __CHUNK__;
    float d[__REGS__];
    stage(x_tiles, h, B, K, 0);
    rnn_fence_async_shared();
    __syncthreads();
    int it = 0;                                                        // chunks multiplied so far: buffer it % 2
    for (int step = 0; step < steps; ++step) {
        for (int c = 0; c < chunks; ++c, ++it) {
            unsigned char* x_tile = x_tiles + (it & 1) * x_bytes;
            rnn_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                RnnWgmma<__NT__, __TF32__>::mma(d, rnn_wgmma_desc(smem_u32(x_tile + group * 64 * 128) + kk * 32),
                         rnn_wgmma_desc(smem_u32(w_tiles + c * __NT__ * 128) + kk * 32), c > 0 || kk > 0);
            rnn_wgmma_commit();
            rnn_wgmma_wait<1>();    // chunk c - 1's products are done
            __syncthreads();                                                  // ... in every warpgroup
            const int next = c + 1 < chunks ? c + 1 : 0;                      // the next step starts at chunk 0
            if (c + 1 < chunks || step + 1 < steps) {
                stage(x_tiles + ((it + 1) & 1) * x_bytes, h, B, K, next * __CHUNK__);
                rnn_fence_async_shared();
            }
            if (c + 1 == chunks) rnn_wgmma_wait<0>();   // d is final
            __syncthreads();
        }
    }
    store_wgmma(y, d, N, group);
}

__device__ __forceinline__ void ldsm4(unsigned (&r)[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

extern "C" __global__ void step_mma(const __ELEM__* __restrict__ h, const __ELEM__* __restrict__ w,
                                    float* __restrict__ y, int B, int K, int N, int steps, int restage)
{
    extern __shared__ unsigned char raw[];
    unsigned char* w_tiles = aligned_smem(raw);
    unsigned char* x_tile = w_tiles + (K / __CHUNK__) * __NT__ * 128;
    load_weights(w_tiles, w, K);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float acc[__NT__ / 8][4];
    for (int step = 0; step < steps; ++step) {
#pragma unroll
        for (int j = 0; j < __NT__ / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        for (int c = 0; c < K / __CHUNK__; ++c) {
            if (restage || (step == 0 && c == 0)) {
                __syncthreads();
                stage(x_tile, h, B, K, c * __CHUNK__);
                __syncthreads();
            }
            const unsigned xs = smem_u32(x_tile), ws = smem_u32(w_tiles + c * __NT__ * 128);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                unsigned a[4];
                const int ar = warp * 16 + (lane % 16);              // A: rows of this warp, groups 2kk, 2kk + 1
                ldsm4(a, xs + rnn_swz128(ar, 2 * kk + lane / 16));
#pragma unroll
                for (int j = 0; j < __NT__ / 8; j += 2) {
                    unsigned b[4];                                   // B: W rows 8j.. and 8(j+1).., groups 2kk, 2kk+1
                    const int br = 8 * j + (lane % 8) + 8 * (lane / 16);
                    ldsm4(b, ws + rnn_swz128(br, 2 * kk + (lane / 8) % 2));
                    asm volatile("mma.sync.aligned.__MMA__ {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                                 : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
                    asm volatile("mma.sync.aligned.__MMA__ {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                                 : "+f"(acc[j + 1][0]), "+f"(acc[j + 1][1]), "+f"(acc[j + 1][2]), "+f"(acc[j + 1][3])
                                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[2]), "r"(b[3]));
                }
            }
        }
    }
    const int row = warp * 16 + g;
    float* out = y + (long)blockIdx.x * __NT__;
#pragma unroll
    for (int j = 0; j < __NT__ / 8; ++j) {
        out[(long)row * N + 8 * j + 2 * t] = acc[j][0];
        out[(long)row * N + 8 * j + 2 * t + 1] = acc[j][1];
        out[(long)(row + 8) * N + 8 * j + 2 * t] = acc[j][2];
        out[(long)(row + 8) * N + 8 * j + 2 * t + 1] = acc[j][3];
    }
}
""".replace("__REGS__", str(nt // 2)).replace("__NT__", str(nt)).replace("__TF32__", str(kind == "tf32").lower()) \
        .replace("__MMA__", mma_shape).replace("__ELEM__", elem).replace("__EPG__", str(per_group)) \
        .replace("__CHUNK__", str(8 * per_group))


def shared_bytes(nt: int, B: int, K: int, kind: str = "bf16") -> int:
    """The weight tiles, two chunks of h (the double-buffered kernel's; the others use one), and up to 1023 bytes
    to align them to 1024."""
    return (K // chunk_columns(kind)) * nt * 128 + 2 * B * 128 + 1024


# `large` and `blogA` per kind; tf32 takes half the columns a block (its weight slice is twice the bytes)
CASES = {"large": dict(B=128, K=1024, blocks=128, nt=64, kind="bf16"),
         "blogA": dict(B=64, K=2560, blocks=132, nt=32, kind="bf16"),
         "large-tf32": dict(B=128, K=1024, blocks=128, nt=32, kind="tf32"),
         "blogA-tf32": dict(B=64, K=2560, blocks=132, nt=16, kind="tf32")}


def operands(h: np.ndarray, w: np.ndarray, kind: str) -> tuple:
    """(h and w as the kernels read them: bf16 bit patterns, or fp32 values already rounded to tf32; their product
    in float64, the reference)."""
    from engine.rounding import round_operand, weight_bits
    mode = {"bf16": "bfloat16", "tf32": "tf32"}[kind]
    want = round_operand(h, mode) @ round_operand(w, mode).T
    if kind == "bf16":
        return weight_bits(h, mode), weight_bits(w, mode), want
    return round_operand(h, mode).astype(np.float32), round_operand(w, mode).astype(np.float32), want


def run_case(cupy, module, name: str, B: int, K: int, blocks: int, nt: int, kind: str, steps: int,
             reps: int) -> dict:
    rng = np.random.default_rng(1)
    N = blocks * nt
    h, w = rng.standard_normal((B, K)).astype(np.float32), (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    h_host, w_host, want = operands(h, w, kind)
    h_bits, w_bits = cupy.asarray(h_host), cupy.asarray(w_host)
    row = {"case": name, "kind": kind, "B": B, "K": K, "N": N, "blocks": blocks, "nt": nt, "steps": steps}
    groups = THREADS_PER_GROUP * (B // 64)
    for kernel, threads in (("step_wgmma", groups), ("step_wgmma_db", groups), ("step_mma", 32 * (B // 16))):
        function = module.get_function(kernel)
        smem = shared_bytes(nt, B, K, kind)
        function.max_dynamic_shared_size_bytes = smem
        y = cupy.full((B, N), np.nan, dtype=cupy.float32)                  # poisoned
        args = (h_bits, w_bits, y, np.int32(B), np.int32(K), np.int32(N))
        launch = lambda n, restage=1: function((blocks,), (threads,), args + (np.int32(n), np.int32(restage)),  # noqa: E731
                                               shared_mem=smem)
        launch(1)
        got = cupy.asnumpy(y).astype(np.float64)
        error = float(np.abs(got - want).max() / np.abs(want).max())
        row[kernel] = {"max_rel_error": error, "threads": threads}
        timings = (("us_per_step", 1), ("us_per_step_mma_only", 0))
        for label, restage in timings[:1] if kernel.endswith("_db") else timings:
            ms = time_ms(lambda restage=restage: launch(steps, restage), warmup=3, repeats=reps)
            row[kernel][label] = ms * 1e3 / steps
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json")
    args = parser.parse_args()
    import cupy

    from engine.codegen.nvrtc import compile_cubin
    rows, failed = [], False
    for name, case in CASES.items():
        cubin = compile_cubin(source(case["nt"], case["kind"]), "90a")
        module = _module(cupy, cubin)
        row = run_case(cupy, module, name, steps=args.steps, reps=args.reps, **case)
        rows.append(row)
        for kernel in ("step_wgmma", "step_wgmma_db", "step_mma"):
            r = row[kernel]
            once = f" ({r['us_per_step_mma_only']:.2f} with h staged once)" if "us_per_step_mma_only" in r else ""
            failed |= not checked(f"{name:10s} {kernel:13s} B={case['B']} K={case['K']} NT={case['nt']} x "
                                  f"{case['blocks']} blocks", r, digits=2, note=once)
    return finish(rows, args.json, failed)


def _module(cupy, cubin: bytes):
    """A RawModule of the CUBIN bytes (written to a temporary file: RawModule loads a path)."""
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    return cupy.RawModule(path=f.name)


if __name__ == "__main__":
    raise SystemExit(main())
