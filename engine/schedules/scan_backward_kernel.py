"""The scan's backward, state-free part, as one generated kernel (engine/schedules/scan_grad.py's fast path).

Given the reverse scan's adjoint g[t] of the one scanned state and the state's previous values s[t-1], one thread
per (row, unit) recomputes the step's state-free values from the GEMM output and the parameters (as the forward's
kernel computed them), forms da = g * s[t-1] and db = g, takes them back through the coefficients' expressions
(engine/passes/scan.py Expr.grad, run here on symbols that spell C) and then through every state-free node in
reverse order by its op's gradient rule (engine/ops.py: the rule's op's CUDA form), and writes the adjoint of each of
its inputs: a GEMM output's into the matching column block of one (rows, total) buffer, so that the weights'
gradients and the layer input's adjoint are one GEMM each, and a parameter vector's per element, to be summed over
the rows.
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from ..backends.naive import c_literal, double_spelling, preamble
from ..ir import CellGraph
from ..ops import OPS, backward_op_def
from ..passes.scan import analyse_scan
from .scan_kernel import WALK, FreeKernel, Layout, fused_scan_source


def _operator(symbol: str, reflected: bool = False):
    """Sym's method for `symbol`: (self op other), or (other op self) for the reflected one."""
    def method(self, other):
        left, right = (self._of(other), self.text) if reflected else (self.text, self._of(other))
        return Sym(f"({left} {symbol} {right})", self.literal)
    return method


class Sym:
    """A C expression that Expr.compute and Expr.grad can run on: +, -, *, / and numbers build its text."""

    def __init__(self, text: str, literal):
        self.text, self.literal = text, literal

    def _of(self, other) -> str:
        return other.text if isinstance(other, Sym) else self.literal(float(other))

    __add__, __radd__ = _operator("+"), _operator("+", reflected=True)
    __sub__, __rsub__ = _operator("-"), _operator("-", reflected=True)
    __mul__, __rmul__ = _operator("*"), _operator("*", reflected=True)
    __truediv__, __rtruediv__ = _operator("/"), _operator("/", reflected=True)

    def __neg__(self):
        return Sym(f"(-{self.text})", self.literal)


@lru_cache(maxsize=64)
def backward_source(cell: CellGraph, spec: FreeKernel, state: str, layouts: tuple[Layout, ...], dtype) -> str:
    """CUDA source of scan_free_backward for the free kernel `spec` of `cell` (one scanned state), its inputs laid
    out as `layouts`. Parameters: the inputs, g, s[t-1], then per input its adjoint's output (the GEMM output's
    buffer for a "rows" input, a (rows, n) array for a "vector" one), rows, n."""
    c_type = "double" if np.dtype(dtype) == np.dtype(np.float64) else "float"
    lines = _statements(cell, spec, state, layouts, np.dtype(dtype),
                        load=lambda k, layout: f"p{k}[{_index(layout)}]",
                        store=lambda k, layout, total: f"q{k}[{_index(layout) if layout.kind == 'rows' else 'i'}] = "
                                                       f"{total};",
                        head=[f"const {c_type} g = pg[i]; const {c_type} prev = pprev[i];"])
    params = ", ".join([f"const {c_type}* __restrict__ p{k}" for k in range(len(spec.inputs))]
                       + [f"const {c_type}* __restrict__ pg", f"const {c_type}* __restrict__ pprev"]
                       + [f"{c_type}* __restrict__ q{k}" for k in range(len(spec.inputs))]
                       + ["long long rows", "long long n"])
    body = "\n    ".join(lines)
    return (preamble() + f'\nextern "C" __global__ void scan_free_backward({params}) {{\n'
            f"  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"  if (i >= rows * n) return;\n  const long long row = i / n, j = i % n;\n    {body}\n}}\n")


def backward_step_source(cell: CellGraph, spec: FreeKernel, state: str, layouts: tuple[Layout, ...], dtype) -> str:
    """The same statements as one step's device function for the walk back (engine/schedules/scan_walk_back.py):
    backward_step(r, v, g, prev, q, row, j, dv) reads the step's inputs from scan_kernel's Raw r and Vec v, writes
    the adjoint of every "rows" input (all columns of one GEMM output) into q at the input's column, and adds the
    adjoint of every "vector" input to dv, a DVec with a field for each (the sums over the steps)."""
    c_type = "double" if np.dtype(dtype) == np.dtype(np.float64) else "float"
    vectors = [k for k, layout in enumerate(layouts) if layout.kind != "rows"]
    lines = _statements(cell, spec, state, layouts, np.dtype(dtype),
                        load=lambda k, layout: f"{'r' if layout.kind == 'rows' else 'v'}.in{k}",
                        store=lambda k, layout, total: (f"q[{_index(layout)}] = {total};" if layout.kind == "rows"
                                                        else f"dv.sum{k} += {total};"),
                        head=[])
    fields = " ".join(f"{c_type} sum{k};" for k in vectors) or "char unused;"
    body = "\n  ".join(lines)
    return (f"struct DVec {{ {fields} }};          // the vector inputs' adjoints, summed over a chain's steps\n"
            f"__device__ __forceinline__ void backward_step(const Raw& r, const Vec& v, {c_type} g, {c_type} prev, "
            f"{c_type}* __restrict__ q, long long row, long long j, DVec& dv) {{\n  {body}\n}}\n")


BACK = (16, 8)             # scan_walk_back's shape: warps a block, steps a warp's slice of a tile


@lru_cache(maxsize=64)
def walk_back_source(cell: CellGraph, spec: FreeKernel, state: str, layouts: tuple[Layout, ...], dtype) -> str:
    """CUDA source of the gradients' walks (engine/schedules/scan_grad.py walk_gradients) for a cell whose scan forms
    its coefficients itself from one GEMM output and parameters: scan_kernel's fused source (scan_walk, the forward)
    and scan_walk_back, the adjoint walked from the last step to the first in the forward walk's tiles.

    A block owns 32 chains; a tile's warp w holds steps [w U, w U + U) and the step after them (for a[t + 1]). The
    adjoint g[t] = dL/dh[t] + a[t+1] g[t+1] (a[T] = 1, g[T] = the final state's adjoint) is composed per warp into
    one map, the maps meet in shared memory from the top warp down, and each warp replays its steps from the g
    entering above it, running backward_step on each: the GEMM output's adjoint written in place, the parameter
    vectors' adjoints summed in registers (one sum a chain at the end), d initial = a[0] g[0]. Reads the GEMM
    output (the step after a warp's slice a second time, mostly from L2), dL/dh, the forward's sequence shifted by
    one step; writes the GEMM output's adjoint."""
    c_type = "double" if np.dtype(dtype) == np.dtype(np.float64) else "float"
    params = "".join(f"const {c_type}* __restrict__ p{k}, " for k in range(len(layouts)))
    args = "".join(f"p{k}, " for k in range(len(layouts)))
    vectors = [k for k, layout in enumerate(layouts) if layout.kind != "rows"]
    summed = "".join(f" total.sum{k} += sums[u][lane].sum{k};" for k in vectors)
    written = "".join(f" q_vec[{m}LL * chains + c] = total.sum{k};" for m, k in enumerate(vectors))
    zero = "".join(f" acc.sum{k} = 0;" for k in vectors)
    totals = (f"""  __shared__ DVec sums[BACK_WARPS][32];
  sums[w][lane] = acc;
  __syncthreads();
  if (w == 0 && live) {{
    DVec total = sums[0][lane];
    for (int u = 1; u < BACK_WARPS; ++u) {{{summed} }}
   {written}
  }}
""" if vectors else "")
    warps, steps = BACK
    kernel = f"""
#define BACK_WARPS {warps}
#define BACK_U {steps}
// seq: the forward's states (steps, chains); initial, d_final, d_initial: (chains); q: the GEMM output's adjoint, laid
// out as the GEMM output; q_vec: (vector inputs, chains), each vector input's adjoint summed over the steps.
extern "C" __global__ void __launch_bounds__(BACK_WARPS * 32) scan_walk_back({params}const SCAN_T* __restrict__ seq,
    const SCAN_T* __restrict__ initial, const SCAN_T* __restrict__ d_out, const SCAN_T* __restrict__ d_final,
    SCAN_T* __restrict__ q, SCAN_T* __restrict__ q_vec, SCAN_T* __restrict__ d_initial, int steps, int batch,
    long long n) {{
  __shared__ SCAN_T map_a[BACK_WARPS][32], map_b[BACK_WARPS][32], entering[2][32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const long long chains = batch * n, c = (long long)blockIdx.x * 32 + lane;
  const bool live = c < chains;
  const long long cc = live ? c : chains - 1;                  // a dead lane reads a real chain, never writes
  const long long bi = cc / n, j = cc % n;
  Vec v;
  load_vec(v, {args}j);
  const int tile = BACK_WARPS * BACK_U, tiles = (steps + tile - 1) / tile;
  if (w == 0) entering[(tiles - 1) & 1][lane] = d_final[cc];    // g[T]: what the final state's adjoint adds
  DVec acc;{zero}
  for (int k = tiles - 1; k >= 0; --k) {{
    const int t0 = k * tile + w * BACK_U;
    Raw raw[BACK_U + 1];
    SCAN_T d[BACK_U], prev[BACK_U], a[BACK_U + 1];
#pragma unroll
    for (int i = 0; i <= BACK_U; ++i) load_raw(raw[i], {args}(long long)min(t0 + i, steps - 1) * batch + bi, j);
#pragma unroll
    for (int i = 0; i < BACK_U; ++i) {{
      const int t = min(t0 + i, steps - 1);
      d[i] = t0 + i < steps ? d_out[(long long)t * chains + cc] : SCAN_T(0);
      prev[i] = t == 0 ? initial[cc] : seq[(long long)(t - 1) * chains + cc];
    }}
#pragma unroll
    for (int i = 0; i <= BACK_U; ++i) {{
      SCAN_T b;
      form(a[i], b, raw[i], v);
      if (t0 + i >= steps) a[i] = 1;                      // a[T] = 1, and past the end the identity
    }}
    SCAN_T pa = 1, pb = 0;                                // the slice as one map of the g entering above it
#pragma unroll
    for (int i = BACK_U - 1; i >= 0; --i) {{ pb = d[i] + a[i + 1] * pb; pa *= a[i + 1]; }}
    map_a[w][lane] = pa;
    map_b[w][lane] = pb;
    __syncthreads();
    SCAN_T g = entering[k & 1][lane];
    for (int u = BACK_WARPS - 1; u > w; --u) g = map_a[u][lane] * g + map_b[u][lane];
#pragma unroll
    for (int i = BACK_U - 1; i >= 0; --i) {{
      g = d[i] + a[i + 1] * g;
      if (live && t0 + i < steps) backward_step(raw[i], v, g, prev[i], q, (long long)(t0 + i) * batch + bi, j, acc);
    }}
    if (w == 0) {{
      entering[(k + 1) & 1][lane] = g;                    // the other buffer: tile k - 1 reads it
      if (k == 0 && live) d_initial[c] = a[0] * g;
    }}
    __syncthreads();
  }}
{totals}}}
"""
    return (fused_scan_source(spec, layouts, np.dtype(dtype), WALK)
            + backward_step_source(cell, spec, state, layouts, dtype) + kernel)


def _statements(cell: CellGraph, spec: FreeKernel, state: str, layouts: tuple[Layout, ...], dtype, load, store,
                head: list[str]) -> list[str]:
    """The backward's statements with g and prev in scope: input k read as load(k, layout), the forward's values
    recomputed, `head` (where g and prev come from), the adjoints through the coefficients and the nodes, and each
    input's adjoint stored by store(k, layout, total). Definitions nothing reads are dropped (_used)."""
    c_type = "double" if dtype == np.dtype(np.float64) else "float"

    def literal(value: float) -> str:
        return c_literal(value, dtype)

    def spell(text: str) -> str:
        return double_spelling(text) if c_type == "double" else text

    found = analyse_scan(cell)
    affine = found.scanned[state]
    inputs = spec.inputs
    elementwise = [n for n in cell.topo_order if n in found.free and not cell[n].is_leaf and cell[n].op != "matmul"]
    ids = {name: f"in{k}" for k, name in enumerate(inputs)}
    lines = [f"const {c_type} in{k} = {load(k, layout)};" for k, layout in enumerate(layouts)]
    for k, name in enumerate(elementwise):                       # the forward values, recomputed
        node, op = cell[name], OPS[cell[name].op]
        ids[name] = f"v{k}"
        fields = {port: literal(cell[arg].attr("value")) if cell[arg].op == "const" else ids[arg]
                  for port, arg in zip(op.ports, node.args)}
        if "factor" in op.attrs:
            fields["factor"] = literal(node.attr("factor"))
        lines.append(f"const {c_type} {ids[name]} = {spell(op.cuda.format(**fields))};")
    terms: dict[str, list[str]] = {}
    env = {name: Sym(ident, literal) for name, ident in ids.items()}

    def add(name, term):
        terms.setdefault(name, []).append(term.text if isinstance(term, Sym) else literal(float(term)))

    g, previous = Sym("g", literal), Sym("prev", literal)
    lines.extend(head)
    if affine.a is not None:
        affine.a.grad(g * previous, env, add)
    if affine.b is not None:
        affine.b.grad(g, env, add)
    for k, name in reversed(list(enumerate(elementwise))):
        node, op = cell[name], OPS[cell[name].op]
        adjoint = f"d{k}"
        lines.append(f"const {c_type} {adjoint} = {' + '.join(terms.pop(name, [])) or literal(0.0)};")
        frame = {"dy": adjoint, "y": ids[name],
                 **{port: (literal(cell[arg].attr("value")) if cell[arg].op == "const" else ids[arg])
                    for port, arg in zip(op.ports, node.args)}}
        for arg, rule in zip(node.args, op.vjp):
            if cell[arg].op == "const":
                continue
            if rule.passes_through:
                add(arg, Sym(adjoint, literal))
                continue
            grad_op = backward_op_def(rule.op)
            fields = dict(zip(grad_op.ports, (frame[a] for a in rule.args)))
            if "factor" in grad_op.attrs:
                fields["factor"] = literal(node.attr("factor"))
            add(arg, Sym(spell(grad_op.cuda.format(**fields)), literal))
    for k, (name, layout) in enumerate(zip(inputs, layouts)):
        lines.append(store(k, layout, " + ".join(terms.get(name, [])) or literal(0.0)))
    return _used(lines)


def _used(lines: list[str]) -> list[str]:
    """The lines without the definitions nothing reads (a coefficient's own value is not needed backwards), so the
    source compiles without unused-variable warnings."""
    kept: list[str] = []
    for line in reversed(lines):
        defined = re.match(r"const \w+ (\w+) = ", line)
        if defined and not any(re.search(rf"\b{defined.group(1)}\b", later) for later in kept):
            continue
        kept.append(line)
    return kept[::-1]


def _index(layout: Layout) -> str:
    return f"row * {layout.ld}LL + {layout.offset} + j" if layout.kind == "rows" else "j"
