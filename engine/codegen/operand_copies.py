"""The fused kernels of a precision mode: every value a kernel stores into a step GEMM's operand buffer is also
stored rounded to the mode's format, into a copy of that buffer, so cuBLAS reads the step's operand ready and no
rounding launch runs between the kernel and the GEMM (engine/schedules/fused_modes.py).

    copies = operand_copies(program, "bfloat16", exact={"J_mean_h_gemm"})   # {kernel: {param: (copy, type, fn)}}
    source = render_copies_module(program, "bfloat16", copies)

float32x3's copy holds the operand's two 11-bit parts, hi where the value is and lo one buffer further (the copy is
twice the buffer: engine/schedules/split_products.py multiplies it as rows [hi; lo]); as fp16 values (x3_parts="fp16",
lo times 2^11) or as TF32 values in fp32.
The kernels' own math and buffers stay float32 (a mode rounds the matmuls' operands only): a cell that reads h back
(the GRU's (1 - z) h) reads the fp32 values. The roundings are kernels/tile_gemm.cuh's (rnn_tf32_bits: nearest, ties
away; rnn_bits16: nearest, ties to even), which kernels/round_operands.cu and the schedules' MMAs use, and
engine/rounding.py emulates. On an H200 (2026-11-28, ncu) the separate rounding launch it replaces took 2.7 us of a
26 us step of the blogA LSTM in bf16.
"""
from __future__ import annotations

from ..plan import Program
from .cuda import (
    CELL_HELPERS,
    RANGE_PARAM,
    SPLIT_COPY,
    SPLIT_COPY_FP16,
    SPLIT_COPY_TILES,
    TF32_FP16_COPY,
    TILE_COPIES,
    WAIT_MACRO,
    helper_source,
    module_header,
    render_kernel,
)
from .precision import precision as lookup

# a mode's copy: its C element type and the rounding (a function of tile_gemm.cuh's, or one defined below)
COPY_TYPES = {"tf32": ("float", "rnn_copy_tf32"), "float16": ("unsigned short", "rnn_bits16<RNN_FP16>"),
              "bfloat16": ("unsigned short", "rnn_bits16<RNN_BF16>"), "float32x3": ("float", SPLIT_COPY)}
SUFFIX = "_mode"
TF32_COPY = ("__device__ __forceinline__ float rnn_copy_tf32(const float v) "
             "{ return __uint_as_float(rnn_tf32_bits(v)); }\n")
# float32x3: hi = tf32(v) at element i, lo = tf32(v - hi) one buffer (`lo` elements) further: the stacked operand
# [hi; lo] (2B, K) that engine/schedules/split_products.py multiplies (v - hi is exact in fp32)
SPLIT_COPY_SOURCE = (f"__device__ __forceinline__ void {SPLIT_COPY}(float* __restrict__ copy, const long i, const long lo, "
                     "const float v)\n{\n    const float hi = __uint_as_float(rnn_tf32_bits(v));\n    copy[i] = hi;\n"
                     "    copy[lo + i] = __uint_as_float(rnn_tf32_bits(v - hi));\n}\n")
# float32x3 in fp16 parts (x3_parts="fp16"): hi = fp16(tf32(v)), lo = fp16(tf32(v - hi) * 2^11) from hi as stored (the
# same 11-bit parts, engine/rounding.py split_fp16); a value past fp16's range sets the program's flag (the kernel's
# parameter RANGE_PARAM, engine/codegen/cuda.py; the kernels call the name, a macro passes the flag), which the
# program reads after the run (engine/schedules/mode_device.py). Held as rows [hi; lo], or for the engine's own wgmma
# product (engine/schedules/wgmma_products.py) in 64 x 64 tiles: element (b, k) of a part of (B, ld)
# in the tile of row block b / 64 and column block k / 64 (each part's rows and columns padded to whole tiles), its
# 16-byte group swizzled by row (kernels/tile_gemm.cuh rnn_tile_at<2>); the lo part after the hi part's padded rows.
# The parts themselves: tile_gemm.cuh rnn_split_fp16.
SPLIT_COPY_FP16_SOURCE = (
    f"__device__ __forceinline__ void {SPLIT_COPY_FP16}_at(unsigned short* __restrict__ copy, const long i, "
    "const long lo, const float v, unsigned int* __restrict__ range)\n{\n    unsigned short h, l;\n"
    "    if (rnn_split_fp16(v, h, l)) *range = 1u;\n    copy[i] = h;\n    copy[lo + i] = l;\n}\n"
    f"__device__ __forceinline__ void {SPLIT_COPY_TILES}_at(unsigned short* __restrict__ copy, const long i, "
    "const long ld, const long B, const float v, unsigned int* __restrict__ range)\n{\n"
    "    const long b = i / ld, at = rnn_tile_at<2>(b, i - b * ld, ld);\n"
    "    unsigned short h, l;\n    if (rnn_split_fp16(v, h, l)) *range = 1u;\n    copy[at] = h;\n"
    "    copy[(B + 63) / 64 * 64 * ((ld + 63) / 64 * 64) + at] = l;\n}\n"
    f"#define {SPLIT_COPY_FP16}(...) {SPLIT_COPY_FP16}_at(__VA_ARGS__, {RANGE_PARAM})\n"
    f"#define {SPLIT_COPY_TILES}(...) {SPLIT_COPY_TILES}_at(__VA_ARGS__, {RANGE_PARAM})\n")

# tf32 held as fp16 (tf32_storage="fp16", engine/schedules/tf32_fp16.py): fp16(tf32(v) * 2^10); a value past the copy's
# range sets the program's flag, as float32x3's fp16 parts do.
TF32_FP16_COPY_SOURCE = (
    f"__device__ __forceinline__ unsigned short {TF32_FP16_COPY}_at(const float v, unsigned int* __restrict__ range)"
    "\n{\n    unsigned short h;\n    if (rnn_tf32_fp16(v, h)) *range = 1u;\n    return h;\n}\n"
    f"#define {TF32_FP16_COPY}(v) {TF32_FP16_COPY}_at((v), {RANGE_PARAM})\n")


# A reduced mode's copy in the wgmma products' tiles (step_product="wgmma"): element (b, k) of the (B, ld) operand at
# rnn_tile_at<bytes>(b, k, ld), rounded as COPY_TYPES' (B: the calling convention of the tiled copies, unused here).
TILE_COPY_SOURCE = "".join(
    f"__device__ __forceinline__ void {TILE_COPIES[mode]}({c_type}* __restrict__ copy, const long i, const long ld, "
    f"const long B, const float v)\n{{\n    const long b = i / ld;\n    copy[rnn_tile_at<{size}>(b, i - b * ld, ld)] = "
    f"{rounding}(v);\n}}\n"
    for mode, c_type, size, rounding in (("tf32", "float", 4, "rnn_copy_tf32"),
                                         ("float16", "unsigned short", 2, "rnn_bits16<RNN_FP16>"),
                                         ("bfloat16", "unsigned short", 2, "rnn_bits16<RNN_BF16>")))


def copy_name(name: str) -> str:
    """The copy of buffer or parameter `name` (a C identifier, as the plan's names are)."""
    return name + SUFFIX


def operand_copies(program: Program, precision: str, exact=frozenset(), x3_parts: str = "tf32",
                   tiles: bool = False, tf32_storage: str = "tf32") -> dict[str, dict]:
    """{kernel name: {param: (copy param, C type, rounding function)}} for every kernel store into the operand buffer
    of a step GEMM that is not in `exact` (a reduction's fixed matrix: its operand stays fp32); float32x3's parts held
    as `x3_parts` ("tf32" or "fp16"); tf32's operand as `tf32_storage` ("tf32", or "fp16" shifted: tf32_fp16.py); in
    the wgmma products' tiles where `tiles` (float32x3's fp16 parts, or a reduced mode's operand)."""
    name = lookup(precision).name
    fp16 = SPLIT_COPY_TILES if tiles else SPLIT_COPY_FP16
    c_type, function = ("unsigned short", fp16) if name == "float32x3" and x3_parts == "fp16" else \
        ("unsigned short", TF32_FP16_COPY) if name == "tf32" and tf32_storage == "fp16" else COPY_TYPES[name]
    if tiles and name in TILE_COPIES:
        function = TILE_COPIES[name]
    operands = {g.in_buffer for g in program.gemms if not g.hoisted and g.name not in exact}
    found = {}
    for kernel in program.kernels:
        by_name = {p.name: p for p in kernel.params}
        params = {s.access.param for s in kernel.stores if by_name[s.access.param].source in operands}
        if params:
            found[kernel.name] = {p: (copy_name(p), c_type, function) for p in sorted(params)}
    return found


def copied_buffers(program: Program, copies: dict[str, dict]) -> set[str]:
    """The buffers whose copies the kernels write."""
    sources = {(k.name, p.name): p.source for k in program.kernels for p in k.params}
    return {sources[(kernel, param)] for kernel, params in copies.items() for param in params}


def render_copies_module(program: Program, precision: str, copies: dict[str, dict], generator_version: int,
                         waits: dict | None = None, places: dict | None = None, x3_parts: str = "tf32",
                         tf32_storage: str = "tf32") -> str:
    """The fused module of `program` (float32 math) with the copies' stores and tile_gemm.cuh's roundings. waits
    ({kernel: params}, engine/codegen/programmatic.py): those kernels wait for the GEMM before them, to be launched as
    its programmatic dependents. places ({kernel: {param: f(access) -> [C expression]}}): how those params' loads
    read them (a step product left in planes, summed as the kernels read it: engine/schedules/split_products.py).
    x3_parts, tf32_storage: as operand_copies was given them."""
    fp32, waits, places = lookup("float32"), waits or {}, places or {}
    tiled = any(f in TILE_COPIES.values() for params in copies.values() for _, _, f in params.values())
    parts = [module_header(program, "", generator_version, fp32),
             f"// Operand copies in {lookup(precision).name}: engine/codegen/operand_copies.py.\n",
             helper_source(CELL_HELPERS), helper_source("tile_gemm.cuh"), TF32_COPY,
             (SPLIT_COPY_FP16_SOURCE if x3_parts == "fp16" else SPLIT_COPY_SOURCE) if lookup(precision).split
             else TILE_COPY_SOURCE if tiled else TF32_FP16_COPY_SOURCE if tf32_storage == "fp16" else "",
             WAIT_MACRO if waits else ""]
    parts += [render_kernel(k, program, fp32, copies.get(k.name), waits.get(k.name), places.get(k.name))
              for k in program.kernels]
    return "\n".join(parts)
