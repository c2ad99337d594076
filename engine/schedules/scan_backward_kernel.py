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
from .scan_kernel import FreeKernel, Layout


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
    dtype = np.dtype(dtype)
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
    lines = [f"const {c_type} in{k} = p{k}[{_index(layout)}];" for k, layout in enumerate(layouts)]
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
    lines.append(f"const {c_type} g = pg[i]; const {c_type} prev = pprev[i];")
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
        total = " + ".join(terms.get(name, [])) or literal(0.0)
        lines.append(f"q{k}[{_index(layout) if layout.kind == 'rows' else 'i'}] = {total};")
    params = ", ".join([f"const {c_type}* __restrict__ p{k}" for k in range(len(inputs))]
                       + [f"const {c_type}* __restrict__ pg", f"const {c_type}* __restrict__ pprev"]
                       + [f"{c_type}* __restrict__ q{k}" for k in range(len(inputs))]
                       + ["long long rows", "long long n"])
    body = "\n    ".join(_used(lines))
    return (preamble() + f'\nextern "C" __global__ void scan_free_backward({params}) {{\n'
            f"  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"  if (i >= rows * n) return;\n  const long long row = i / n, j = i % n;\n    {body}\n}}\n")


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
