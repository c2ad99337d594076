"""The scan schedule's state-free math for the whole sequence in one launch: a CuPy ElementwiseKernel generated from
the cell (engine/schedules/scan.py, step 2).

Every elementwise value that reads no state is one statement of the kernel, in the order the cell computes them,
each spelled by its op's CUDA form (engine/ops.py) over the kernel's local variables; the kernel writes only what
the rest of the schedule reads: each scanned state's coefficients a and b, and the state-free values that the
values computed after the scan read. Its inputs are the GEMM outputs (strided column blocks of one grouped GEMM),
the parameters (broadcast over the rows) and the layer input where the cell reads it elementwise. One launch reads
each input once and writes each output once: the floor of this step is that traffic.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..backends.naive import c_literal, double_spelling, preamble
from ..ir import CellGraph
from ..ops import OPS
from ..passes.scan import Expr, ScanAnalysis, analyse_scan

CARRY = Path(__file__).resolve().parents[2] / "kernels" / "scan_carry.cuh"


@dataclass(frozen=True)
class FreeKernel:
    inputs: tuple[str, ...]        # node names, in the kernel's parameter order
    outputs: tuple[str, ...]       # "a:<state>", "b:<state>" or a node name
    in_params: str
    out_params: str
    operation: str
    name: str


def render(expr: Expr, ids: dict[str, str], dtype) -> str:
    """An affine coefficient (engine/passes/scan.py Expr) in C over the kernel's variables."""
    return expr.c(ids, lambda value: c_literal(value, dtype))


def free_kernel(cell: CellGraph, found: ScanAnalysis, wanted: tuple[str, ...], dtype) -> FreeKernel:
    """The kernel computing the state-free elementwise values of `cell` and writing the coefficients of every
    scanned state and the values `wanted` (node names)."""
    dtype = np.dtype(dtype)
    c_type = "double" if dtype == np.dtype(np.float64) else "float"
    elementwise = [n for n in cell.topo_order if n in found.free and not cell[n].is_leaf and cell[n].op != "matmul"]
    local = set(elementwise)
    ids: dict[str, str] = {}
    inputs: list[str] = []
    for name in elementwise:
        for arg in cell[name].args:
            node = cell[arg]
            if arg not in local and arg not in inputs and node.op != "const":
                inputs.append(arg)
    for affine in found.scanned.values():         # a coefficient may be a parameter or a GEMM output itself
        for expr in (affine.a, affine.b):
            for name in (expr.names if expr is not None else ()):
                if name not in local and name not in inputs:
                    inputs.append(name)
    for name in wanted:
        if name not in local and name not in inputs:
            inputs.append(name)
    for k, name in enumerate(inputs):
        ids[name] = f"in{k}"
    lines = []
    for k, name in enumerate(elementwise):
        node = cell[name]
        ids[name] = f"v{k}"
        spec = OPS[node.op]
        fields = {port: (c_literal(cell[arg].attr("value"), dtype) if cell[arg].op == "const" else ids[arg])
                  for port, arg in zip(spec.ports, node.args)}
        if "factor" in spec.attrs:
            fields["factor"] = c_literal(node.attr("factor"), dtype)
        expression = spec.cuda.format(**fields)
        lines.append(f"const {c_type} {ids[name]} = {double_spelling(expression) if c_type == 'double' else expression};")
    outputs, writes = [], []
    for state, affine in found.scanned.items():
        for part, expr in (("a", affine.a), ("b", affine.b)):
            outputs.append(f"{part}:{state}")
            value = render(expr, ids, dtype) if expr is not None else c_literal(0.0, dtype)
            writes.append(f"out{len(writes)} = {double_spelling(value) if c_type == 'double' else value};")
    for name in wanted:
        outputs.append(name)
        writes.append(f"out{len(writes)} = {ids[name]};")
    return FreeKernel(inputs=tuple(inputs), outputs=tuple(outputs),
                      in_params=", ".join(f"{dtype.name} {ids[n]}" for n in inputs),
                      out_params=", ".join(f"{dtype.name} out{k}" for k in range(len(outputs))),
                      operation="\n".join(lines + writes),
                      name=f"scan_free_{dtype.name}")


@lru_cache(maxsize=64)
def free_kernel_of(cell: CellGraph, wanted: tuple[str, ...], dtype_name: str) -> FreeKernel:
    """free_kernel, made once per cell, wanted values and dtype."""
    return free_kernel(cell, analyse_scan(cell), wanted, np.dtype(dtype_name))


@lru_cache(maxsize=64)
def compiled(spec: FreeKernel):
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    return cupy.ElementwiseKernel(spec.in_params, spec.out_params, spec.operation, name=spec.name,
                                  preamble=preamble())


# ---- the coefficients formed inside the scan: one source for the three passes ------------------------------------
#
# Where one state is scanned and nothing after the scan reads a state-free value, the scan's first and third passes
# form a[t] and b[t] themselves from the GEMM output and the parameters, so a and b are never written to memory:
# the traffic of the whole step is the GEMM output read twice and the sequence written once
# (benchmarks/results/scan-20261126-H200/README.md has the floor arithmetic). The third pass loads 16 steps before it
# uses them: one step at a time it ran at 38 % of the H200's bandwidth (104 us for 192 MiB), unrolled at 61 % (63 us).
# The first pass gained nothing from it (58 us by 1 or 4, 84 us by 16; ncu, minGRU T = 4096 with 4096 chains).

UNROLL = {"float": (1, 16), "double": (1, 8)}   # steps whose loads a thread has in flight: pass 1, pass 3


def unroll_defines(c_type: str) -> str:
    """SCAN_U1 and SCAN_U3 for the passes of both scans (this module's and kernels/scan.cu, which needs them)."""
    first, third = UNROLL[c_type]
    return f"#define SCAN_U1 {first}\n#define SCAN_U3 {third}\n"


@dataclass(frozen=True)
class Layout:
    """Where input k of the statements lives: a row-major (rows, >= n) array read at [row * ld + offset + j]
    (a GEMM output's column block, the layer input), or a vector read at [j] (a parameter)."""
    kind: str                       # "rows" or "vector"
    ld: int = 0
    offset: int = 0


WALK = (16, 16)             # scan_walk's shape: warps a block, steps a warp's slice of a tile (tile = their product)


@lru_cache(maxsize=64)
def fused_scan_source(spec: FreeKernel, layouts: tuple[Layout, ...], dtype, walk: tuple[int, int] = WALK) -> str:
    """CUDA source of the scans that form a[t] and b[t] in place with the statements of `spec` (free_kernel of a cell
    with one scanned state and nothing wanted): scan_chunks and scan_apply (kernels/scan.cu's passes 1 and 3) with
    kernels/scan_carry.cuh (pass 2) as it is, and scan_walk, the one-pass form (its docstring in the source)."""
    c_type = "double" if np.dtype(dtype) == np.dtype(np.float64) else "float"
    params = "".join(f"const {c_type}* __restrict__ p{k}, " for k in range(len(layouts)))
    rows = [k for k, layout in enumerate(layouts) if layout.kind == "rows"]
    vectors = [k for k, layout in enumerate(layouts) if layout.kind != "rows"]
    raw = " ".join(f"{c_type} in{k};" for k in rows) or "char unused;"
    vec = " ".join(f"{c_type} in{k};" for k in vectors) or "char unused;"
    load_raw = " ".join(f"r.in{k} = p{k}[row * {layouts[k].ld}LL + {layouts[k].offset} + j];" for k in rows)
    load_vec = " ".join(f"v.in{k} = p{k}[j];" for k in vectors)
    unpack = " ".join([f"const {c_type} in{k} = r.in{k};" for k in rows] + [f"const {c_type} in{k} = v.in{k};"
                                                                                for k in vectors])
    args = "".join(f"p{k}, " for k in range(len(layouts)))
    warps, steps = walk
    body = f"""
#define SCAN_T {c_type}
{unroll_defines(c_type)}#define WALK_WARPS {warps}
#define WALK_U {steps}
struct Raw {{ {raw} }};          // a step's inputs read by rows (GEMM outputs, the layer input)
struct Vec {{ {vec} }};          // the inputs read by unit alone (parameters), loaded once a thread

__device__ __forceinline__ void load_raw(Raw& r, {params}long long row, long long j) {{ {load_raw} }}
__device__ __forceinline__ void load_vec(Vec& v, {params}long long j) {{ {load_vec} }}
__device__ __forceinline__ void form(SCAN_T& a, SCAN_T& b, const Raw& r, const Vec& v) {{
  {unpack}
  {c_type} out0, out1;
  {spec.operation}
  a = out0; b = out1;
}}
__device__ __forceinline__ void coefficients(SCAN_T& a, SCAN_T& b, {params}long long row, long long j) {{
  Raw r; Vec v; load_raw(r, {args}row, j); load_vec(v, {args}j); form(a, b, r, v);
}}

extern "C" __global__ void scan_chunks({params}SCAN_T* __restrict__ map_a, SCAN_T* __restrict__ map_b, int steps,
                                       int batch, long long n, int chunk) {{
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= batch * n) return;
  const long long bi = c / n, j = c % n;
  const int t0 = blockIdx.y * chunk, t1 = min(t0 + chunk, steps);
  SCAN_T pa = 1, pb = 0;
  for (int t = t0; t < t1; t += SCAN_U1) {{
    SCAN_T a[SCAN_U1], b[SCAN_U1];
#pragma unroll
    for (int i = 0; i < SCAN_U1; ++i)                    // SCAN_U1 steps' loads in flight (the index clamped)
      coefficients(a[i], b[i], {args}(long long)min(t + i, t1 - 1) * batch + bi, j);
#pragma unroll
    for (int i = 0; i < SCAN_U1; ++i)
      if (t + i < t1) {{ pb = a[i] * pb + b[i]; pa *= a[i]; }}
  }}
  map_a[blockIdx.y * batch * n + c] = pa;
  map_b[blockIdx.y * batch * n + c] = pb;
}}

// @CARRY
extern "C" __global__ void scan_apply({params}const SCAN_T* __restrict__ entering, SCAN_T* __restrict__ out,
                                      int steps, int batch, long long n, int chunk) {{
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= batch * n) return;
  const long long bi = c / n, j = c % n;
  const int t0 = blockIdx.y * chunk, t1 = min(t0 + chunk, steps);
  SCAN_T s = entering[blockIdx.y * batch * n + c];
  for (int t = t0; t < t1; t += SCAN_U3) {{
    SCAN_T a[SCAN_U3], b[SCAN_U3];
#pragma unroll
    for (int i = 0; i < SCAN_U3; ++i)
      coefficients(a[i], b[i], {args}(long long)min(t + i, t1 - 1) * batch + bi, j);
#pragma unroll
    for (int i = 0; i < SCAN_U3; ++i)
      if (t + i < t1) {{ s = a[i] * s + b[i]; out[(long long)(t + i) * batch * n + c] = s; }}
  }}
}}

// The one-pass scan: a block owns 32 chains (a lane each) for the whole sequence and walks it in tiles of
// WALK_WARPS x WALK_U steps, warp w holding the tile's steps [w U, w U + U) in registers. A tile: each warp composes
// its U steps into one map, the maps meet in shared memory, each warp enters its slice from the tile's entering state
// through the maps of the warps before it, replays its steps and writes them; the last warp's end state enters the
// next tile. The next tile's inputs are loaded while this one is worked: the GEMM output is read once and the
// sequence written once, with no second pass and no maps in global memory. It needs B n / 32 blocks to fill the GPU.
// final: the last step's state, (batch, n) like initial.
extern "C" __global__ void __launch_bounds__(WALK_WARPS * 32) scan_walk({params}const SCAN_T* __restrict__ initial,
                                                                        SCAN_T* __restrict__ out,
                                                                        SCAN_T* __restrict__ final, int steps,
                                                                        int batch, long long n) {{
  __shared__ SCAN_T map_a[WALK_WARPS][32], map_b[WALK_WARPS][32], entering[2][32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const long long chains = batch * n, c = (long long)blockIdx.x * 32 + lane;
  const bool live = c < chains;
  const long long bi = (live ? c : chains - 1) / n, j = (live ? c : chains - 1) % n;   // a dead lane reads, never writes
  Vec v;
  load_vec(v, {args}j);
  if (w == 0) entering[0][lane] = initial[live ? c : chains - 1];
  const int tile = WALK_WARPS * WALK_U, tiles = (steps + tile - 1) / tile;
  Raw cur[WALK_U], next[WALK_U];
#pragma unroll
  for (int i = 0; i < WALK_U; ++i)
    load_raw(cur[i], {args}(long long)min(w * WALK_U + i, steps - 1) * batch + bi, j);
  SCAN_T s = 0;
  for (int k = 0; k < tiles; ++k) {{
    const int t0 = k * tile + w * WALK_U;
    if (k + 1 < tiles) {{
#pragma unroll
      for (int i = 0; i < WALK_U; ++i)
        load_raw(next[i], {args}(long long)min(t0 + tile + i, steps - 1) * batch + bi, j);
    }}
    SCAN_T a[WALK_U], b[WALK_U], pa = 1, pb = 0;
#pragma unroll
    for (int i = 0; i < WALK_U; ++i) {{
      form(a[i], b[i], cur[i], v);
      if (t0 + i >= steps) {{ a[i] = 1; b[i] = 0; }}      // past the end: the identity map
      pb = a[i] * pb + b[i];
      pa *= a[i];
    }}
    map_a[w][lane] = pa;
    map_b[w][lane] = pb;
    __syncthreads();
    s = entering[k & 1][lane];
    for (int u = 0; u < w; ++u) s = map_a[u][lane] * s + map_b[u][lane];
#pragma unroll
    for (int i = 0; i < WALK_U; ++i) {{
      s = a[i] * s + b[i];
      if (live && t0 + i < steps) out[(long long)(t0 + i) * chains + c] = s;
    }}
    if (w == WALK_WARPS - 1) entering[(k + 1) & 1][lane] = s;   // the other buffer: this tile's is still being read
    __syncthreads();
#pragma unroll
    for (int i = 0; i < WALK_U; ++i) cur[i] = next[i];
  }}
  if (live && w == WALK_WARPS - 1) final[c] = s;             // past the end the maps were the identity
}}
"""
    return preamble() + body.replace("// @CARRY", CARRY.read_text())
