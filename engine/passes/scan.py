"""Which cells are a linear recurrence: the analysis behind the scan schedule (engine/schedules/scan.py).

A state s qualifies when its next value is affine in s itself, elementwise,

    s_t = a_t * s_{t-1} + b_t,

with a_t and b_t computed from no state that the cell reads (the input, parameters and constants only). Then the
whole sequence is one associative scan over time, (a, b) o (a', b') = (a a', a' b + b'), instead of T dependent
steps: minGRU, minLSTM, QRNN's fo-pooling, a diagonal linear RNN. A cell qualifies when every state it reads
does; a state nothing reads (QRNN's h = o * c) is computed afterwards for all steps at once, from the scanned
sequences.

The walk goes over the graph once, in topological order, and gives each value one of three forms: free (reads no
state), affine in one state (a and b as expressions over free values), or neither, which stops the analysis at
that node with the reason (a nonlinear op of the state, a matrix mixing its units, a product of two state terms,
two states coupled). The coefficients keep the cell's own operations: for minGRU (1 - z) * h + z * h_tilde gives
a = 1 - z and b = z * h_tilde, the same products the step computes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

from ..ir import CellGraph

# An expression over the free values of one step: its text (for explain), how to compute it from an environment of
# arrays (NumPy or CuPy alike: only +, -, *, / and numbers), and its C spelling over a kernel's variables
# (engine/schedules/scan_kernel.py: c(ids, literal), ids naming each value's variable, literal spelling a number).
Compute = Callable[[dict], object]
Spell = Callable[[dict, Callable[[float], str]], str]


@dataclass(frozen=True)
class Expr:
    text: str
    compute: Compute
    precedence: int = 3              # 1: a sum, 2: a product, 3: a name or a number
    c: Spell = lambda ids, literal: ""
    names: frozenset = frozenset()   # the values it reads
    # its reverse mode: grad(adjoint, env, add) calls add(value, term) for each value it reads (the scan's backward,
    # engine/schedules/scan_grad.py)
    grad: Callable[[object, dict, Callable], None] = lambda adjoint, env, add: None
    size: int = 1                    # its terms, a shared one counted each time it is read: bounded by MAX_TERMS


ONE = Expr("1", lambda env: 1.0, c=lambda ids, literal: literal(1.0))
# The largest coefficient expression the analysis builds. A state read at many places of a deep cell (a value read
# twice at each of n levels) would give coefficients of 2^n terms; such a cell is refused, naming the node, instead
# of the analysis growing without bound.
MAX_TERMS = 256


def _wrap(e: Expr, level: int) -> str:
    return f"({e.text})" if e.precedence < level else e.text


def _sum(x: Expr | None, y: Expr | None, sign: float = 1.0) -> Expr | None:
    if y is None:
        return x
    if x is None:
        return y if sign > 0 else _neg(y)
    op = "+" if sign > 0 else "-"
    def grad(adjoint, env, add):
        x.grad(adjoint, env, add)
        y.grad(adjoint if sign > 0 else -adjoint, env, add)
    return Expr(f"{x.text} {op} {_wrap(y, 2)}",
                (lambda env: x.compute(env) + y.compute(env)) if sign > 0 else
                (lambda env: x.compute(env) - y.compute(env)), 1,
                lambda ids, literal: f"({x.c(ids, literal)} {op} {y.c(ids, literal)})", x.names | y.names, grad,
                x.size + y.size + 1)


def _neg(x: Expr | None) -> Expr | None:
    return None if x is None else Expr(f"-{_wrap(x, 3)}", lambda env: -x.compute(env), 2,
                                       lambda ids, literal: f"(-{x.c(ids, literal)})", x.names,
                                       lambda adjoint, env, add: x.grad(-adjoint, env, add), x.size + 1)


def _product(x: Expr | None, y: Expr) -> Expr | None:
    if x is None:
        return None
    if x is ONE:
        return y
    if y is ONE:
        return x
    def grad(adjoint, env, add):
        x.grad(adjoint * y.compute(env), env, add)
        y.grad(adjoint * x.compute(env), env, add)
    return Expr(f"{_wrap(x, 2)} * {_wrap(y, 3)}", lambda env: x.compute(env) * y.compute(env), 2,
                lambda ids, literal: f"({x.c(ids, literal)} * {y.c(ids, literal)})", x.names | y.names, grad,
                x.size + y.size + 1)


def _quotient(x: Expr | None, y: Expr) -> Expr | None:
    if x is None:
        return None
    def grad(adjoint, env, add):
        yv = y.compute(env)
        x.grad(adjoint / yv, env, add)
        y.grad(-adjoint * x.compute(env) / (yv * yv), env, add)
    return Expr(f"{_wrap(x, 2)} / {_wrap(y, 3)}", lambda env: x.compute(env) / y.compute(env), 2,
                lambda ids, literal: f"({x.c(ids, literal)} / {y.c(ids, literal)})", x.names | y.names, grad,
                x.size + y.size + 1)


def _scaled(x: Expr | None, factor: float) -> Expr | None:
    if x is None:
        return None
    return Expr(f"{factor:g} * {_wrap(x, 3)}", lambda env: factor * x.compute(env), 2,
                lambda ids, literal: f"({literal(factor)} * {x.c(ids, literal)})", x.names,
                lambda adjoint, env, add: x.grad(factor * adjoint, env, add), x.size + 1)


def _value(name: str) -> Expr:
    return Expr(name, lambda env: env[name], c=lambda ids, literal: ids[name], names=frozenset({name}),
                grad=lambda adjoint, env, add: add(name, adjoint))


@dataclass(frozen=True)
class Affine:
    """A value as a * s + b in state s (a or b None: zero)."""
    state: str
    a: Expr | None
    b: Expr | None


@dataclass(frozen=True)
class ScanAnalysis:
    qualifies: bool
    reason: str                                       # why it qualifies, or what stops it
    node: str | None = None                           # the node that stops it
    scanned: dict[str, Affine] = field(default_factory=dict)     # read state -> its next value as a * s + b
    after: tuple[str, ...] = ()                        # states nothing reads: computed from the scanned sequences
    free: frozenset[str] = frozenset()                 # values that read no state (the whole sequence at once)

    def describe(self) -> str:
        if not self.qualifies:
            return f"scan: no: {self.reason}"
        lines = [f"scan: yes: {self.reason}"]
        for state, affine in self.scanned.items():
            a = affine.a.text if affine.a is not None else "0"
            b = affine.b.text if affine.b is not None else "0"
            lines.append(f"  {state}[t] = a[t] * {state}[t-1] + b[t], a = {a}, b = {b}")
        if self.after:
            lines.append(f"  after the scan, for every step at once: {', '.join(self.after)}")
        return "\n".join(lines)


class _Stop(Exception):
    def __init__(self, node: str, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


@lru_cache(maxsize=128)
def analyse_scan(cell: CellGraph) -> ScanAnalysis:
    """Whether `cell` runs as a scan over time (see the module docstring), and why or why not. Made once per cell
    (explain, the autotuner's candidates, the schedule and its gradients all ask)."""
    live = cell.live_nodes
    read = tuple(s.name for s in cell.states if s.name in live)
    after = tuple(s.name for s in cell.states if s.name not in live)
    if not read:
        return ScanAnalysis(False, "the cell reads no state: there is no recurrence to scan", after=after)
    forms: dict[str, Affine | None] = {}          # None: free
    try:
        for name in cell.topo_order:
            if name not in live:
                continue
            form = forms[name] = _form(cell, name, forms, read)
            if form is not None and max(e.size if e is not None else 0 for e in (form.a, form.b)) > MAX_TERMS:
                raise _Stop(name, f"makes the coefficients of state '{form.state}' longer than {MAX_TERMS} terms (a "
                                  "state read at many places): the scan takes cells whose update stays short")
    except _Stop as stop:
        return ScanAnalysis(False, f"node '{stop.node}' {stop.reason}", node=stop.node)
    scanned = {}
    for spec in cell.states:
        if spec.name not in read:
            continue
        form = forms[spec.next]
        if form is None:
            form = Affine(spec.name, None, _value(spec.next))
        elif form.state != spec.name:
            return ScanAnalysis(False, f"node '{spec.next}' (the next value of state '{spec.name}') depends on state "
                                       f"'{form.state}': the states are coupled, so no state is a recurrence of "
                                       "its own", node=spec.next)
        scanned[spec.name] = form
    states = ", ".join(f"'{s}'" for s in scanned)
    reason = (f"the next value of {'state' if len(scanned) == 1 else 'states'} {states} is affine in "
              f"{'it' if len(scanned) == 1 else 'each'} (s[t] = a[t] * s[t-1] + b[t]), with a and b computed from "
              "the input and the parameters alone")
    free = frozenset(n for n, f in forms.items() if f is None)
    return ScanAnalysis(True, reason, scanned=scanned, after=after, free=free)


def _form(cell: CellGraph, name: str, forms: dict, read: tuple) -> Affine | None:
    node = cell[name]
    if node.is_leaf:
        return Affine(name, ONE, None) if node.op == "state" and name in read else None
    args = [forms[a] for a in node.args]
    if all(f is None for f in args):
        return None
    states = {f.state for f in args if f is not None}
    if len(states) > 1:
        raise _Stop(name, f"({node.op}) combines states {', '.join(sorted(repr(s) for s in states))}: each state's "
                          "recurrence must read only itself")
    (state,) = states
    if node.op == "matmul":
        raise _Stop(name, f"multiplies state '{state}' by the matrix '{node.args[0]}': a matrix mixes the hidden "
                          "units, so the recurrence is not elementwise (a diagonal weight, v(...) * s, is)")
    if node.op in ("add", "sub"):
        x, y = (f if f is not None else Affine(state, None, _value(a)) for f, a in zip(args, node.args))
        sign = 1.0 if node.op == "add" else -1.0
        return Affine(state, _sum(x.a, y.a, sign), _sum(x.b, y.b, sign))
    if node.op in ("mul", "div"):
        k = 0 if args[0] is not None else 1
        if args[1 - k] is not None:
            raise _Stop(name, f"({node.op}) multiplies two values that depend on state '{state}': the update is "
                              "not affine in it")
        if node.op == "div" and k == 1:
            raise _Stop(name, f"(div) divides by a value that depends on state '{state}': the update is not "
                              "affine in it")
        other = _value(node.args[1 - k])
        combine = _product if node.op == "mul" else _quotient
        return Affine(state, combine(args[k].a, other), combine(args[k].b, other))
    form = args[0]
    if node.op == "neg":
        return Affine(state, _neg(form.a), _neg(form.b))
    if node.op == "identity":
        return form
    if node.op == "scale":
        factor = float(node.attr("factor"))
        return Affine(state, _scaled(form.a, factor), _scaled(form.b, factor))
    if node.op == "one_minus":
        return Affine(state, _neg(form.a), _sum(ONE, form.b, -1.0))
    raise _Stop(name, f"applies {node.op} to a value that depends on state '{state}': the update is not affine in "
                      "it (a scan needs s[t] = a[t] * s[t-1] + b[t])")
