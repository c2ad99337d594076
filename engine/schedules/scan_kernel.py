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


@lru_cache(maxsize=64)
def fused_scan_source(spec: FreeKernel, layouts: tuple[Layout, ...], dtype) -> str:
    """CUDA source of scan_chunks and scan_apply (kernels/scan.cu's passes 1 and 3) with the statements of `spec`
    (free_kernel of a cell with one scanned state and nothing wanted) computing a[t] and b[t] in place, and
    kernels/scan_carry.cuh (pass 2) as it is."""
    c_type = "double" if np.dtype(dtype) == np.dtype(np.float64) else "float"
    params = "".join(f"const {c_type}* __restrict__ p{k}, " for k in range(len(layouts)))

    def loads(row: str) -> str:
        out = []
        for k, layout in enumerate(layouts):
            index = f"{row} * {layout.ld}LL + {layout.offset} + j" if layout.kind == "rows" else "j"
            out.append(f"const {c_type} in{k} = p{k}[{index}];")
        return " ".join(out)

    coefficients = (f"{c_type} out0, out1;\n" + spec.operation)
    args = "".join(f"p{k}, " for k in range(len(layouts)))
    body = f"""
#define SCAN_T {c_type}
{unroll_defines(c_type)}__device__ __forceinline__ void coefficients(SCAN_T& a, SCAN_T& b, {params}long long row, long long j) {{
  {loads("row")}
  {coefficients}
  a = out0; b = out1;
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
"""
    return preamble() + body.replace("// @CARRY", CARRY.read_text())
