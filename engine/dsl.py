"""A small Python DSL that reads like the paper's equations.

    from engine.dsl import cell, W, b, v, sigmoid, tanh

    @cell(output="h")
    def lstm(x, h, c):
        i = sigmoid(W("W_ii") @ x + b("b_ii") + W("W_hi") @ h + b("b_hi"))
        ...
        c_next = f * c + i * g
        h_next = o * tanh(c_next)
        return {"h": h_next, "c": c_next}

The first argument is the input x_t, the others are the states (their value at t-1); the function
returns each state's next value. `W(name) @ value` is a matmul with a weight whose column count is
the operand's size; `b` is a bias, `v` an elementwise vector (peepholes, IndRNN's u). Numbers mix in
naturally: `1 - z` is one_minus, `0.5 * x` is scale, `x + 1.0` adds a const. Local variable names
become node names, so generated CUDA and equations read like the source.

The op functions (sigmoid, tanh, relu, hard_sigmoid, identity, neg, one_minus, add, sub, mul) are made
from the op table, one per elementwise op of engine.ops without attributes, named like the op: an op
added there is a DSL function here.
"""
from __future__ import annotations

import inspect
import sys
from typing import Callable

from .errors import CellGraphError, Problem
from .ir import CellGraph, Node, StateSpec, make_node
from .ops import OPS, dsl_functions, on_change

_BUILDERS: list["_Builder"] = []


class _Builder:
    def __init__(self, input_is_hidden: bool = False):
        self.input_is_hidden = input_is_hidden     # x may meet H-sized values: their sum is H-sized
        self.nodes: list[Node] = []
        self.by_name: dict[str, Node] = {}
        self.counter = 0
        self.values: list["Value"] = []
        self.forced: dict[str, str] = {}

    def temp(self) -> str:
        self.counter += 1
        return f"%{self.counter}"

    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        self.by_name[node.name] = node
        return node

    def leaf(self, name: str, op: str, **attrs) -> "Value":
        existing = self.by_name.get(name)
        if existing is not None:
            if existing.op != op:
                raise CellGraphError(Problem(f"name used for a {existing.op} and a {op}", node=name, field="name",
                                             hint="give each parameter its own name"))
            return Value(self, name)
        self.add(make_node(name, op, **attrs))
        return Value(self, name)

    def op(self, op: str, *args: "Value", **attrs) -> "Value":
        name = self.temp()
        self.add(make_node(name, op, [a.name for a in args], **attrs))
        return Value(self, name)


def _current() -> _Builder:
    if not _BUILDERS:
        raise CellGraphError("DSL helpers (W, b, v, const, sigmoid, ...) are only usable inside an @cell function",
                             hint="decorate the function with @engine.dsl.cell")
    return _BUILDERS[-1]


# The ops that Value's Python operators build (a + b, a - b, a * b, 2.0 * a, 1 - a, -a): engine/dsl_emit.py
# writes these with the operator, every other op as a call of its function.
OPERATOR_OPS = frozenset({"add", "sub", "mul", "scale", "one_minus", "neg"})


class Value:
    """A vector value in the cell being built. Supports +, -, *, unary -, and numbers."""

    __array_priority__ = 1000

    def __init__(self, builder: _Builder, name: str):
        self.builder = builder
        self.name = name

    def _lift(self, other) -> "Value":
        if isinstance(other, Value):
            return other
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return const(float(other))
        raise CellGraphError(f"cannot combine a cell value with {type(other).__name__} {other!r}",
                             hint="use cell values, numbers, or parameters created with W/b/v/const")

    def __add__(self, other):
        return self.builder.op("add", self, self._lift(other))

    def __radd__(self, other):
        return self.builder.op("add", self._lift(other), self)

    def __sub__(self, other):
        return self.builder.op("sub", self, self._lift(other))

    def __rsub__(self, other):
        if isinstance(other, (int, float)) and float(other) == 1.0:
            return self.builder.op("one_minus", self)
        return self.builder.op("sub", self._lift(other), self)

    def __mul__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return self.builder.op("scale", self, factor=float(other))
        return self.builder.op("mul", self, self._lift(other))

    def __rmul__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return self.builder.op("scale", self, factor=float(other))
        return self.builder.op("mul", self._lift(other), self)

    def __neg__(self):
        return self.builder.op("neg", self)

    def named(self, name: str) -> "Value":
        """Give this value an explicit node name (otherwise the local variable name is used)."""
        self.builder.forced[self.name] = name
        return self

    def __bool__(self):
        raise CellGraphError("a cell value has no truth value: cells are dataflow, not control flow",
                             hint="use ops such as relu or hard_sigmoid instead of if/else on values")


class WeightRef:
    """A weight matrix; `W(name) @ value` applies it. Rows default to H; columns follow the operand."""

    def __init__(self, name: str, rows: str = "H"):
        self.name, self.rows = name, rows

    def __matmul__(self, operand: Value) -> Value:
        if not isinstance(operand, Value):
            raise CellGraphError(f"W('{self.name}') @ ... needs a cell value, got {type(operand).__name__}",
                                 node=self.name)
        builder = operand.builder
        cols = _dim_of(builder, operand.name)
        existing = builder.by_name.get(self.name)
        if existing is not None and existing.op == "weight" and existing.attr("cols") != cols:
            raise CellGraphError(Problem(
                f"weight has {existing.attr('cols')} columns but is applied to a value of size {cols}",
                node=self.name, field="attrs.cols", hint="use a separate weight for each operand size"))
        w = builder.leaf(self.name, "weight", rows=self.rows, cols=cols)
        return builder.op("matmul", w, operand)


def _dim_of(builder: _Builder, name: str) -> str:
    node = builder.by_name[name]
    if node.op == "input":
        return "I"
    if node.op in ("state",):
        return node.attr("dim", "H")
    if node.op == "matmul":
        return builder.by_name[node.args[0]].attr("rows")
    if node.op in ("bias", "vector"):
        return node.attr("dim", "H")
    if node.op == "const":
        return "1"
    dims = {_dim_of(builder, a) for a in node.args} - {"1"}
    if builder.input_is_hidden and dims == {"I", "H"}:
        return "H"
    return dims.pop() if len(dims) == 1 else "1" if not dims else "?"


def W(name: str, rows: str = "H") -> WeightRef:
    return WeightRef(name, rows)


def b(name: str, dim: str = "H") -> Value:
    return _current().leaf(name, "bias", dim=dim)


def v(name: str, dim: str = "H") -> Value:
    return _current().leaf(name, "vector", dim=dim)


def const(value: float, name: str | None = None) -> Value:
    builder = _current()
    if name is None:
        text = repr(float(value)).replace("-", "m").replace(".", "_").replace("+", "")
        name = f"c_{text}"
    return builder.leaf(name, "const", value=float(value))


def op_function(op: str) -> Callable[..., Value]:
    """The DSL function of op `op` of engine.ops: it takes one cell value per port of the op."""
    def fn(*args: Value) -> Value:
        spec = OPS[op]
        if len(args) != spec.arity:
            raise CellGraphError(f"{op}() takes {spec.arity} cell value(s) ({', '.join(spec.ports)}), got {len(args)}")
        for arg in args:
            if not isinstance(arg, Value):
                raise CellGraphError(f"{op}() needs a cell value, got {type(arg).__name__}")
        return args[0].builder.op(op, *args)
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"The '{op}' op: {OPS[op].description} (see engine.ops)."
    return fn


# One function per elementwise op of the table (sigmoid, tanh, relu, hard_sigmoid, identity, neg, one_minus, add,
# ...), made here from engine.ops and made again when an op is registered or removed.
_OP_FUNCTIONS: set[str] = set()


def _make_op_functions() -> None:
    module = globals()
    wanted = set(dsl_functions())
    for name in _OP_FUNCTIONS - wanted:
        del module[name]
    for name in sorted(wanted - _OP_FUNCTIONS):
        if name in module:
            raise CellGraphError(f"op '{name}' would replace engine.dsl's own '{name}'", node=name,
                                 hint="give the op another name")
        module[name] = op_function(name)
    _OP_FUNCTIONS.clear()
    _OP_FUNCTIONS.update(wanted)


_make_op_functions()
on_change(_make_op_functions)


def _capture_locals(fn: Callable, args: list) -> tuple[object, dict]:
    """Call fn and capture its local variables at return (to name nodes after them)."""
    captured: dict = {}
    code = fn.__code__

    def profiler(frame, event, arg):
        if event == "return" and frame.f_code is code:
            captured.update(frame.f_locals)

    old = sys.getprofile()
    sys.setprofile(profiler)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(old)
    return result, captured


def build_cell(fn: Callable, name: str | None = None, output: str = "h", doc: str | None = None,
               input_is_hidden: bool = False, state_dims: dict[str, str] | None = None) -> CellGraph:
    params = list(inspect.signature(fn).parameters)
    if len(params) < 2:
        raise CellGraphError("an @cell function takes the input first, then one argument per state",
                             field="signature", hint="e.g. def my_cell(x, h): ...")
    builder = _Builder(input_is_hidden)
    _BUILDERS.append(builder)
    try:
        x = builder.leaf(params[0], "input")
        state_dims = dict(state_dims or {})
        unknown = sorted(set(state_dims) - set(params[1:]))
        if unknown:
            raise CellGraphError(Problem(f"state_dims names '{unknown[0]}', which is not a state of the function",
                                         node=unknown[0], field="state_dims", hint=f"states are {params[1:]}"))
        states = [builder.leaf(p, "state", **({"dim": state_dims[p]} if state_dims.get(p, "H") != "H" else {}))
                  for p in params[1:]]
        result, local_vars = _capture_locals(fn, [x, *states])
    finally:
        _BUILDERS.pop()
    if isinstance(result, Value) and len(states) == 1:
        result = {params[1]: result}
    if not isinstance(result, dict):
        raise CellGraphError("an @cell function returns {state_name: next_value}", field="return",
                             hint=f"return {{'{params[1]}': ...}}")
    for key, val in result.items():
        if key not in params[1:]:
            raise CellGraphError(Problem("returned a next value for an unknown state", node=str(key),
                                         field="return", hint=f"states are {params[1:]}"))
        if not isinstance(val, Value):
            raise CellGraphError(Problem(f"next value must be a cell value, got {type(val).__name__}",
                                         node=str(key), field="return"))
    names = _choose_names(builder, local_vars, result, params)
    nodes = tuple(Node(names.get(n.name, n.name), n.op, tuple(names.get(a, a) for a in n.args), n.attrs)
                  for n in builder.nodes)
    state_specs = tuple(StateSpec(k, names.get(v_.name, v_.name)) for k, v_ in result.items())
    return CellGraph(name=name or fn.__name__, nodes=nodes, states=state_specs, output=output,
                     doc=inspect.cleandoc(doc if doc is not None else (fn.__doc__ or "")),
                     input_is_hidden=input_is_hidden)


def _choose_names(builder: _Builder, local_vars: dict, result: dict, params: list[str]) -> dict[str, str]:
    taken = {n.name for n in builder.nodes if not n.name.startswith("%")}
    names: dict[str, str] = {}

    def claim(temp: str, wanted: str):
        base, k = wanted, 1
        while wanted in taken:
            wanted = f"{base}_{k}"
            k += 1
        taken.add(wanted)
        names[temp] = wanted

    for temp, wanted in builder.forced.items():
        if temp.startswith("%"):
            claim(temp, wanted)
    # Local variable names, in definition order; state parameters rebound to next values get "_next".
    for var, val in local_vars.items():
        if isinstance(val, Value) and val.name.startswith("%") and val.name not in names:
            claim(val.name, f"{var}_next" if var in params else var)
    for state, val in result.items():
        if val.name.startswith("%") and val.name not in names:
            claim(val.name, f"{state}_next")
    # The rest are named after their role: matmuls by weight and operand, others by their consumer.
    final = lambda n: names.get(n, n)  # noqa: E731
    by_temp = {n.name: n for n in builder.nodes}
    unnamed = lambda n: n.startswith("%") and n not in names  # noqa: E731
    for n in builder.nodes:
        if n.op == "matmul" and n.name not in names:
            weight, operand = n.args
            if unnamed(operand):
                # W @ (r * h): name the operand after its own arguments ("r_h_mul") when they are named,
                # else name the product after the weight and let the operand follow its consumer.
                args = by_temp[operand].args
                if all(not unnamed(a) for a in args):
                    claim(operand, "_".join(final(a) for a in args) + f"_{by_temp[operand].op}")
                else:
                    claim(n.name, f"{final(weight)}_prod")
                    continue
            claim(n.name, f"{final(weight)}_{final(operand)}")
    consumers: dict[str, str] = {}
    for n in builder.nodes:
        for a in n.args:
            consumers.setdefault(a, n.name)
    root: dict[str, str] = {}
    for n in reversed(builder.nodes):
        if n.name.startswith("%") and n.name not in names:
            owner = consumers.get(n.name)
            if owner is None:
                claim(n.name, f"{n.op}_value")
                continue
            base = root.get(owner, final(owner))
            root[n.name] = base
            activation = OPS[by_temp[owner].op].is_activation
            claim(n.name, f"{base}_pre" if activation else f"{base}_{n.op}")
    return names


def cell(fn: Callable | None = None, *, name: str | None = None, output: str = "h",
         input_is_hidden: bool = False, state_dims: dict[str, str] | None = None) -> Callable | CellGraph:
    """Decorator: turn a Python function into a validated CellGraph. input_is_hidden=True: the cell combines x
    with hidden-sized values (tanh(x) in a candidate, x added to h), so it runs only where input size == hidden
    size (checked when the network is built). state_dims={"h": "P"}: states of the projection size P instead of
    H (an LSTM with a recurrent projection: h = W("W_hr", rows="P") @ (o * tanh(c))); Network(proj_size=...)."""
    if fn is not None:
        return build_cell(fn, name=name, output=output, input_is_hidden=input_is_hidden, state_dims=state_dims)
    return lambda f: build_cell(f, name=name, output=output, input_is_hidden=input_is_hidden, state_dims=state_dims)
