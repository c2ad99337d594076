"""float32x3 in the fused backend: a step's product as two GEMMs of stacked parts, folded as the kernels read them.

    weight = stack_split(numpy, w)                 # (2N, K): [W_hi; W_lo], stored once (ModeDevice.mode_weight)
    operand: (2, R, K), [h_hi; h_lo]: the kernels write it beside h (engine/codegen/operand_copies.py)
    chunks = chunking(K, X3_CHUNK)                 # K in chunks, each product summed in an accumulator of its own
    P1 (C, 2R, N) = [h_hi; h_lo] @ W_hi^T, chunk by chunk        (one strided-batched cublasLt call)
    P2 (R, N)     = h_hi @ W_lo^T                                (one more)
    out (R, N) = (P2 + sum_c P1_c[lo rows]) + sum_c P1_c[hi rows]    (kernels/split_products.cu fold_x3)

The product is float32x3's (engine/codegen/precision.py): each operand split into hi = tf32(v) and lo = tf32(v - hi),
three of the four products of the parts summed in fp32, the small ones first. Each weight part is read once a step
(W_hi by the rows of both operand parts, W_lo by h_hi's), and no fourth product (lo W_lo) is made. Three GEMMs of
(R x K) by (K x N), as the schedules' projections do it (engine/schedules/project.py), would read W_hi twice.

The chunks: tensor cores add into their accumulator with truncation (Fasi et al. 2021, "Numerical behavior of NVIDIA
tensor cores", PeerJ CS 7:e330), so one accumulator over a long K drifts toward zero. On an H200 (2026-11-27,
benchmarks/probe_fp32x3_projection.py, K = 1024) one GEMM had 4.2x strict SGEMM's error, chunks of 256 1.1x, of 128
0.6x. Only the products by W_hi need them: W_lo's is 2^-11 of the result, and its drift with it. A chunk's P1_c is
8 R N bytes, written and read again by the fold, beside the weight's 8 N K bytes a step.

Napkin math, one step (fp32 parts, weight stored as 2N x K floats):
- blogA LSTM (B = 64, K = H = 2560, N = 4H): the parts 210 MB, 45 us at the 4.66 TB/s a read of the weight alone
  reaches on an H200 (2026-11-28, benchmarks/probe_stream_floor.py); 10 GFLOP of TF32, 20 us at the 494 TFLOPS
  dense peak. Chunks of 256: P1 52 MB (more than L2's 50 MB), written and read; of 512: 26 MB. cuDNN fp32 (TF32
  off) takes 179 us a step (35.7 ms for 200 steps, docs/performance.md).
- `large` LSTM (B = 128, K = H = 1024): the parts 33.5 MB (7 us), 3.2 GFLOP (7 us at peak), P1 17 MB in chunks of
  256; cuDNN fp32 takes 64 us a layer step (12.8 ms for 2 x 100).
So the fp32-accurate step can be 2-3x cuDNN fp32; the chunk size trades P1's bytes against the accumulators' drift,
and benchmarks/probe_fused_x3.py measures both.

fp16 parts (x3_parts="fp16", the default): a TF32 value has 11 significant bits, as an fp16 one has, so the same parts
can be held as fp16, hi = fp16(tf32(v)) and lo = fp16(tf32(v - hi) * 2^11) (engine.rounding.split_fp16; the 2^11
keeps lo in the range hi has, and lo, taken from hi as stored, carries what a subnormal hi lost). The products are
then fp16 products with fp32 accumulation of the same values, from half the bytes (the weight's parts 4 N K bytes a
step); P2 and each chunk's lo rows carry 2^11, which the fold divides out (exact: a power of two). fp16 holds
|v| <= 65504 only: FP16_LIMIT, checked for the weights at upload and flagged by the kernels for the operands (the
program then runs in TF32 parts). Ootomo and Yokota (2022, "Recovering single precision accuracy from Tensor Cores
while surpassing the FP32 theoretical peak performance", IJHPCA 36(4)) split fp32 into fp16 parts with the low part
scaled by 2^11 the same way.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..codegen.cuda import c_factor, file_entry, index_expr, round_blocks
from ..plan import FLOAT_BYTES
from ..rounding import split_fp16, split_tf32
from .cublaslt import Product
from .project import split_tf32 as split_elementwise

# K of one chunk's accumulator (the module's docstring: the drift against P's bytes). "auto": the largest power of two
# at most K / X3_ACCUMULATORS, and at least X3_CHUNK_MIN (chunk_size). On an H200 (2026-11-28, benchmarks/
# probe_fused_x3.py over the anchors and each at T = 1000) a fixed 256 kept the error within 2x cuDNN fp32's at
# `large` and blogA but not at K = 256 or 512 (lat, blogB, mid: up to 3.4x), and 512 cost blogA nothing (0.8x) and
# `large` the bound (2.3x): cuDNN's own error grows with K, so the chunk that stays within twice it does too.
X3_CHUNK = "auto"
X3_ACCUMULATORS = 4
X3_CHUNK_MIN = 64
X3_FOLDS = ("launch", "kernel")   # float32x3's P folded by a kernel of its own, or by the kernels that read it
FOLD_THREADS = 256
# How a step product's parts are held (the module's docstring, "fp16 parts"): "tf32", as fp32 values for TF32 tensor
# cores; "fp16", as fp16 values for fp16 tensor cores, the lo parts times LO_SCALE.
# fp16, the default: on an H200 (2026-11-28, benchmarks/probe_fused_x3.py --parts tf32,fp16) 1.57x / 1.61x cuDNN fp32
# (LSTM / GRU) at `large` against 1.30x / 1.26x in TF32 parts, 1.93x / 1.99x at blogA against 1.49x / 1.46x, the error
# no larger (1.22x / 0.97x and 0.77x / 0.66x cuDNN's).
X3_PARTS = ("tf32", "fp16")
X3_PARTS_DEFAULT = "fp16"
LO_SCALE = {"tf32": 1.0, "fp16": 2048.0}       # 2^11: an fp16 lo part in the range its hi has
# The W_hi product's K chunks as cublasLt's own split-K (each split an accumulator of its own, the splits summed in fp32
# in cublasLt's workspace: P1 one plane) instead of a strided batch of chunk planes: "auto" where K >= X3_SPLITK_MIN_K.
# On an H200 (2026-11-28, probe_fused_x3.py --products, fp16 parts, the product alone with its fold) split-K took
# 59.2 us against the batch's 68.4 at blogA's LSTM (K = 2560, 5 splits) and 46.0 against 53.7 at its GRU, the same
# error; at `large` (K = 1024, 4 splits) 27.4 against 22.0: slower. TF32 parts: cublasLt refused every split-K it
# offered for them (status 15, the same GPU and date), so "auto" splits fp16 parts only. In the whole run, though,
# split-K was slower (probe_fused_x3.py --splitk auto,false, the same day): blogA 1.83x / 1.82x cuDNN fp32 (LSTM / GRU)
# against 1.91x / 2.01x with the batch, at T = 1000 1.81x / 1.91x against 1.91x / 2.08x; so the default is the batch.
X3_SPLITK = False
X3_SPLITK_MIN_K = 2048
FP16_LIMIT = 65504.0                           # the largest finite fp16: a value past it has no fp16 hi part
# Below 2^-12 an fp16 lo part can be subnormal, so hi + lo / 2^11 holds v to about 2^-36 absolute, not 2^-22
# relative: a weight whose nonzero entries' mean |w| is below FP16_SMALL would lose fp32's accuracy in its dot
# products (in NumPy, K = 256: 14x strict fp32's error at a weight scale of 1e-5, 100x at 1e-6); it keeps TF32 parts.
# A step operand (h) mostly below 2^-12 loses accuracy the same way and is not caught (NOTES 2026-11-28 08:13).
FP16_SMALL = 2.0 ** -12


@dataclass(frozen=True)
class Chunks:
    """K cut into `full` chunks of `size` (one strided-batched product) and, where they do not cover it, one more of
    `rest` (a second product)."""
    size: int
    full: int
    rest: int = 0

    @property
    def count(self) -> int:
        return self.full + (1 if self.rest else 0)

    def bounds(self) -> list[tuple[int, int]]:
        """(first column, columns) of each chunk, in order."""
        found = [(c * self.size, self.size) for c in range(self.full)]
        return found + ([(self.full * self.size, self.rest)] if self.rest else [])


def chunk_size(K: int, chunk: int | str | None = X3_CHUNK) -> int | None:
    """The chunk asked for a product of K: `chunk` itself, or for "auto" the largest power of two at most
    K / X3_ACCUMULATORS and at least X3_CHUNK_MIN (K = 2560: 512; 1024: 256; 512: 128; 256 and less: 64)."""
    if chunk != "auto":
        return chunk
    return max(X3_CHUNK_MIN, 1 << max(0, (K // X3_ACCUMULATORS).bit_length() - 1))


@functools.cache      # (it and the call lists below: a direct run asks for them every step, the same each time)
def chunking(K: int, chunk: int | str | None = X3_CHUNK) -> Chunks:
    """K in chunks of at most about `chunk` ("auto": chunk_size's; None or 0: one chunk): as many as that needs, of
    even size rounded up to 4 elements (16 bytes, so each chunk's columns start where cublasLt's tensor-core kernels
    can read them)."""
    if K < 1:
        raise ValueError(f"a product's K must be positive, got {K}")
    chunk = chunk_size(K, chunk)
    if not chunk or chunk >= K:
        return Chunks(K, 1)
    count = -(-K // chunk)
    even = -(-K // count)
    size = -(-even // 4) * 4
    full = K // size
    return Chunks(size, full, K - full * size)


def uses_splitk(K: int, chunk: int | str | None = X3_CHUNK, splitk: bool | str = X3_SPLITK,
                parts: str = X3_PARTS_DEFAULT) -> bool:
    """Whether a step product of K takes its K chunks as cublasLt's split-K (splitk: True, False or "auto": fp16 parts
    where K >= X3_SPLITK_MIN_K)."""
    if chunking(K, chunk).count < 2:
        return False
    return splitk is True or (splitk == "auto" and parts == "fp16" and K >= X3_SPLITK_MIN_K)


def plane_chunks(K: int, chunk: int | str | None = X3_CHUNK, splitk: bool | str = X3_SPLITK,
                 parts: str = X3_PARTS_DEFAULT) -> Chunks:
    """The chunks whose planes a step product leaves in P: chunking's, or one where split-K sums them in cublasLt."""
    return Chunks(K, 1) if uses_splitk(K, chunk, splitk, parts) else chunking(K, chunk)


@dataclass(frozen=True)
class Call:
    """One cublasLt product of float32x3's parts: `shape` with A, W and out starting `a`, `w` and `out` elements into
    their buffers (4-byte fp32 or 2-byte fp16 parts; P is fp32) (the operand's parts, the stacked weight, the output or P); accumulate: out += (beta = 1); bias:
    the projection's bias added by the epilogue."""
    shape: Product
    a: int
    w: int
    out: int
    accumulate: bool = False
    bias: bool = False


def partial_size(R: int, N: int, chunks: Chunks) -> int:
    """Floats of P: P1 (chunks, 2R, N), then P2 (R, N)."""
    return chunks.count * 2 * R * N + R * N


@functools.cache
def stacked_calls(R: int, K: int, N: int, chunks: Chunks) -> tuple[Call, ...]:
    """A step's product: the parts [h_hi; h_lo] (2R x K) by W_hi (the stacked weight's first N rows) into P1
    (count, 2R, N), the full chunks as one strided batch and a rest as one more product into the last plane; then
    h_hi by W_lo (its last N rows) into P2 (R, N) after them."""
    plane = 2 * R * N
    calls = [Call(Product(2 * R, N, chunks.size, K, K, chunks.full, (chunks.size, chunks.size, plane)), 0, 0, 0)]
    if chunks.rest:
        first = chunks.full * chunks.size
        calls.append(Call(Product(2 * R, N, chunks.rest, K, K), first, first, chunks.full * plane))
    return (*calls, Call(Product.dense(R, N, K), 0, N * K, chunks.count * plane))


@functools.cache
def splitk_calls(R: int, K: int, N: int, splits: int) -> tuple[Call, ...]:
    """A step's product with the W_hi product's K chunks as cublasLt's split-K: [h_hi; h_lo] (2R x K) by W_hi into
    P1, one plane (2R, N), K in `splits` accumulators summed by cublasLt; then h_hi by W_lo into P2 after it."""
    return (Call(Product(2 * R, N, K, K, K, splits=splits), 0, 0, 0), Call(Product.dense(R, N, K), 0, N * K, 2 * R * N))


@functools.cache
def split_calls(M: int, K: int, N: int, chunks: Chunks, bias: bool) -> tuple[Call, ...]:
    """A projection's product (many rows): the parts [x_hi; x_lo] (2 x M x K) and [W_hi; W_lo] (2N x K) into out
    (M, N): x_hi W_lo^T (+ bias), then += x_lo W_hi^T, then += x_hi W_hi^T chunk by chunk."""
    x_lo, w_lo = M * K, N * K
    calls = [Call(Product.dense(M, N, K), 0, w_lo, 0, bias=bias), Call(Product.dense(M, N, K), x_lo, 0, 0, True)]
    return (*calls, *(Call(Product(M, N, n, K, K), first, first, 0, True) for first, n in chunks.bounds()))


def sliceable(K: int, slices: int) -> bool:
    """Whether a product's K cuts into `slices` slices of whole 16-byte groups (8 columns of a 16-bit mode)."""
    return slices > 1 and K % slices == 0 and (K // slices) % 8 == 0


@functools.cache
def slice_calls(R: int, K: int, N: int, slices: int) -> tuple[Call, ...]:
    """A reduced mode's step product with K in `slices` slices, one strided batch: plane s of out (slices, R, N) is
    the product over columns s K / slices .. (s + 1) K / slices; the kernels that read the product sum the planes
    (planes_read)."""
    width = K // slices
    return (Call(Product(R, N, width, K, K, slices, (width, width, R * N)), 0, 0, 0),)


def planes_read(planes: int):
    """A kernel's load of a product left in `planes` planes (slice_calls): their sum, plane 0 first, each plane
    B rows of the buffer's width after the one before (a C expression; fused kernels know B)."""
    def place(access) -> list[str]:
        index, plane = index_expr(access), f"(long)B * {c_factor(access.ld)}"
        terms = [f"{access.param}[{index}]"] + [f"{access.param}[{index} + {s} * {plane}]" for s in range(1, planes)]
        return ["(" + " + ".join(terms) + ")"]
    return place


def fold_read(count: int, scale: float = 1.0):
    """A kernel's load of float32x3's product left as P (stacked_calls, `count` chunks): fold_x3's sum, in its order
    (hi W_lo, then each chunk's lo W_hi, then each chunk's hi W_hi), so it is the fold kernel's value bit for bit;
    scale: the lo parts' LO_SCALE (fp16 parts), whose products' sum is divided by it (exactly: a power of two)."""
    def place(access) -> list[str]:
        index, plane = index_expr(access), f"(long)B * {c_factor(access.ld)}"
        at = lambda offset: f"{access.param}[{index} + {offset}]" if offset else f"{access.param}[{index}]"  # noqa: E731
        small = [at(f"{2 * count} * {plane}")] + [at(f"{2 * c + 1} * {plane}") for c in range(count)]
        big = [at(f"{2 * c} * {plane}" if c else "") for c in range(count)]
        if scale == 1.0:
            return [f"(({' + '.join(small)}) + ({' + '.join(big)}))"]
        return [f"(({' + '.join(small)}) * {1.0 / scale!r}f + ({' + '.join(big)}))"]
    return place


@dataclass(frozen=True)
class Left:
    """How a step's product is left for the kernels that read it: "planes" (a reduced mode's K slices, slice_calls:
    `count` planes) or "fold" (float32x3's P, stacked_calls: `count` chunks; `scale`, the lo parts' LO_SCALE), summed
    as they are read."""
    kind: str
    count: int
    scale: float = 1.0

    def floats(self, R: int, N: int) -> int:
        """The product's buffer: count planes of (R, N), or P1 (count, 2R, N) and P2 (R, N)."""
        return self.count * R * N if self.kind == "planes" else (2 * self.count + 1) * R * N

    def reader(self):
        return planes_read(self.count) if self.kind == "planes" else fold_read(self.count, self.scale)


def read_places(program, readers: dict) -> dict:
    """{kernel: {param: place}} for every kernel param that reads a buffer in `readers` ({buffer: place}): the step
    products left in planes or as float32x3's P, summed where the kernels read them."""
    found = {}
    for kernel in program.kernels:
        places = {p.name: readers[p.source] for p in kernel.params if p.kind == "buffer" and p.source in readers}
        if places:
            found[kernel.name] = places
    return found


def run_calls_numpy(calls, a, w, out) -> None:
    """What cublasLt computes for `calls` on flat float arrays a, w and out (float64 products), bias aside: the
    meaning of Product (row-major A and W with leading dimensions lda and ldw, out rows of N, batch members
    `strides` apart), for the CPU tests of the offsets the GPU path issues."""
    for call in calls:
        s = call.shape
        for i in range(s.batch):
            da, dw, do = (i * stride for stride in s.strides) if s.batch > 1 else (0, 0, 0)
            for name, flat, start, rows, ld, cols in (("A", a, call.a + da, s.M, s.lda, s.K),
                                                      ("W", w, call.w + dw, s.N, s.ldw, s.K),
                                                      ("out", out, call.out + do, s.M, s.N, s.N)):
                if start < 0 or cols > ld or start + (rows - 1) * ld + cols > flat.size:
                    raise ValueError(f"{call}: batch member {i} reads {name} past its {flat.size} elements")
            rows_a = np.lib.stride_tricks.as_strided(a[call.a + da:], (s.M, s.K), (s.lda * a.itemsize, a.itemsize))
            rows_w = np.lib.stride_tricks.as_strided(w[call.w + dw:], (s.N, s.K), (s.ldw * w.itemsize, w.itemsize))
            product = rows_a.astype(np.float64) @ rows_w.astype(np.float64).T
            target = out[call.out + do:call.out + do + s.M * s.N].reshape(s.M, s.N)
            target[...] = target + product if call.accumulate else product


def part_dtype(xp, parts: str):
    """The array type of float32x3's parts: float32 (TF32 values) or float16."""
    return xp.float16 if parts == "fp16" else xp.float32


def stack_split(xp, weight, parts: str = "tf32"):
    """(N, K) float32 -> (2N, K): [tf32(w); tf32(w - tf32(w))], the parts a TF32 GEMM multiplies exactly; parts
    "fp16": the same as fp16 values, the lo part times 2^11 (engine.rounding.split_fp16); the caller checks the range
    first (in_fp16_range)."""
    if xp is np:
        hi, lo = split_fp16(weight) if parts == "fp16" else split_tf32(weight)
        return np.concatenate([hi, lo]).astype(part_dtype(np, parts))
    out = xp.empty((2 * weight.shape[0], weight.shape[1]), dtype=part_dtype(xp, parts))
    return split_into(xp, xp.ascontiguousarray(weight, dtype=xp.float32), out, parts)


def fp16_parts_hold(values) -> bool:
    """Whether fp16 parts hold a weight to fp32's accuracy in its products: the mean |w| of its nonzero entries (a
    block-diagonal weight's zeros aside) at least FP16_SMALL."""
    values = np.abs(np.asarray(values, dtype=np.float64))
    nonzero = values[values > 0]
    return not nonzero.size or float(nonzero.mean()) >= FP16_SMALL


def in_fp16_range(values) -> bool:
    """Whether every value has fp16 parts (|v| <= FP16_LIMIT; NaN aside: a NaN stays one in any parts)."""
    values = np.asarray(values)
    return not values.size or not bool((np.abs(values) > FP16_LIMIT).any())


def split_into(xp, source, out, parts: str = "tf32", flag=None):
    """source (float32, C-contiguous) -> out (2, *source's shape, or as many elements): [hi; lo] in `parts` (float32 for
    "tf32", float16 for "fp16"), what the kernels write as a step operand's copy (engine/codegen/operand_copies.py).
    flag (fp16 parts, a uint32 device array of one): set to 1 where a value is past fp16's range. Returns out."""
    if xp is np:
        hi, lo = split_fp16(source) if parts == "fp16" else split_tf32(source)
        out.reshape(2, -1)[...] = np.stack([hi.ravel(), lo.ravel()])
        return out
    if parts == "fp16":
        n = source.size
        if flag is None:
            flag = xp.zeros(1, dtype=xp.uint32)
        file_entry(xp, "split_products.cu", "split_contiguous_fp16")((round_blocks(xp, n),), (FOLD_THREADS,),
                                                                    (xp.ascontiguousarray(source), out, np.int64(n), flag))
        return out
    n = source.size
    if n % 4 or source.data.ptr % 16 or out.data.ptr % 16 or not source.flags.c_contiguous:
        parts = out.reshape((2, *source.shape))
        split_elementwise(xp, source, parts[0], parts[1])            # into out itself: nothing allocated
        return out
    file_entry(xp, "split_products.cu", "split_contiguous_tf32")((round_blocks(xp, n // 4),), (FOLD_THREADS,),
                                                                (source, out, np.int64(n // 4)))
    return out


def fold(cupy, partial, out, R: int, N: int, count: int, scale: float = 1.0) -> None:
    """out (R, N) from P (partial_size floats: P1 of `count` chunks, then P2; the lo parts times `scale`), on the
    current stream (kernels/split_products.cu)."""
    file_entry(cupy, "split_products.cu", "fold_x3")((round_blocks(cupy, R * N),), (FOLD_THREADS,),
                           (partial, out, np.int32(R), np.int32(N), np.int32(count), np.float32(1.0 / scale)))


def stacked_product_numpy(parts, stacked, chunks: Chunks, scale: float = 1.0):
    """What the GPU's step product computes, in float64: the stacked_calls on parts (2, R, K) and the stacked weight
    (2N, K), folded (fold_numpy; scale: the lo parts' LO_SCALE): out (R, N)."""
    _, R, K = parts.shape
    N = stacked.shape[0] // 2
    partial = np.full(partial_size(R, N, chunks), np.nan)
    run_calls_numpy(stacked_calls(R, K, N, chunks), np.asarray(parts, np.float64).ravel(),
                    np.asarray(stacked, np.float64).ravel(), partial)
    return fold_numpy(partial, R, N, chunks.count, scale)


def fold_numpy(partial, R: int, N: int, count: int, scale: float = 1.0):
    """kernels/split_products.cu's fold_x3 in NumPy: out (R, N) from the flat P (P1 of `count` chunks, then P2; the lo
    parts times `scale`)."""
    p1 = partial[:count * 2 * R * N].reshape(count, 2 * R, N)
    p2 = partial[count * 2 * R * N:count * 2 * R * N + R * N].reshape(R, N)
    return (p2 + p1[:, R:].sum(axis=0)) / scale + p1[:, :R].sum(axis=0)


def left_products(plan, precision: str, copied: set, fixed: dict, k_slices: int = 1, x3_chunk: int | str | None = X3_CHUNK,
                  x3_fold: str = "kernel", x3_parts: str = X3_PARTS_DEFAULT,
                  x3_splitk: bool | str = X3_SPLITK) -> dict[str, Left]:
    """{step GEMM: how its product is left for the kernels} (split_products.Left) for the step GEMMs whose operand the
    kernels copy: float32x3's P when x3_fold is "kernel" (the kernels fold it as they read it, no fold launch), a
    reduced mode's K in k_slices planes (one strided-batched GEMM, the planes summed as they are read) where K cuts
    into them in every layer. The others leave one (B, N) product."""
    program, found = plan.program, {}
    for gemm in program.gemms:
        if gemm.hoisted or fixed.get(gemm.name) or gemm.in_buffer not in copied:
            continue
        ks = {gemm.k(plan.layer_sizes(layer)) for layer in range(plan.network.num_layers)}
        if len(ks) != 1:
            continue
        (K,) = ks
        if precision == "float32x3":
            if x3_fold == "kernel":
                found[gemm.name] = Left("fold", plane_chunks(K, x3_chunk, x3_splitk, x3_parts).count,
                                        LO_SCALE[x3_parts])
        elif sliceable(K, k_slices):
            found[gemm.name] = Left("planes", k_slices)
    return found


def split_bytes(plan, chunk: int | str | None, tiles: bool = False) -> int:
    """float32x3's device memory beyond the plan's (backends/fused.py plan_bytes): each weight's lo part, a step
    GEMM's chunks' products P and its operand's two parts (a set a layer: the layers run on streams of their own),
    and a projection's split input (2 x its rows x K). With fp16 parts a step GEMM's stacked weight and operand parts
    take half the floats (counted whole here: an upper bound). On the wgmma step product (tiles) there is no P, and
    a step GEMM's weight and operand parts are fp16 padded to whole tiles of 64 (wgmma_products.py): their padded
    sizes in floats (two fp16 parts a float)."""
    program, network = plan.program, plan.network
    tile = lambda n: -(-n // 64) * 64  # noqa: E731
    total = 0
    for layer in range(network.num_layers):
        sizes = network.layer_sizes(layer)
        for gemm in program.gemms:
            n, k = gemm.n(sizes), gemm.k(sizes)
            if gemm.hoisted:
                total += n * k + 2 * plan.steps * plan.batch * k
            elif tiles:
                total += tile(n) * tile(k) + tile(plan.batch) * tile(k)
            else:
                total += n * k + partial_size(plan.batch, n, chunking(k, chunk)) + 2 * plan.batch * k
    return total * FLOAT_BYTES


def left_bytes(plan, left: dict) -> int:
    """The device memory the products left in planes take beyond one (B, N) product each (left_products)."""
    total = 0
    for layer in range(plan.network.num_layers):
        sizes = plan.layer_sizes(layer)
        for gemm in plan.program.gemms:
            if gemm.name in left:
                n = gemm.n(sizes)
                total += left[gemm.name].floats(plan.batch, n) - plan.batch * n
    return total * FLOAT_BYTES
