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
import numbers
import sys
from typing import Callable

from .dims import SCALAR, UNKNOWN
from .dsl_checks import arguments_checked, check_dim, check_name, check_options, finite_number, is_number, shown_value
from .errors import CellGraphError, Problem
from .ir import CellGraph, Node, StateSpec, make_node
from .ops import OPS, dsl_functions, on_change

_BUILDERS: list["_Builder"] = []
MAX_HEADS = 4096


class _Builder:
    """The cell being built: its nodes in creation order, each value's size, and the frame of the cell function
    (whose local variables name the nodes when it returns)."""

    def __init__(self, code, input_is_hidden: bool = False):
        self.code = code                           # the @cell function's code: its frame holds the local names
        self.frame = None
        self.input_is_hidden = input_is_hidden     # x may meet H-sized values: their sum is H-sized
        self.nodes: list[Node] = []
        self.by_name: dict[str, Node] = {}
        self.dims: dict[str, str] = {}             # each value's size, computed once when it is made
        self.auto_consts: set[str] = set()         # consts named by the DSL from their value (`x + 0.5`)
        self.counter = 0
        self.forced: dict[str, str] = {}

    def temp(self) -> str:
        self.counter += 1
        return f"%{self.counter}"

    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        self.by_name[node.name] = node
        self.dims[node.name] = self._dim(node)
        return node

    def _dim(self, node: Node) -> str:
        """The size of a new value from its arguments' sizes (known already: arguments are made first)."""
        if node.op == "input":
            return "I"
        if node.op in ("state", "bias", "vector"):
            return node.attr("dim", "H")
        if node.op == "matmul":
            return self.by_name[node.args[0]].attr("rows")
        if node.op == "const":
            return SCALAR
        if node.op in OPS and OPS[node.op].kind == "reduction":      # a row's sum or mean, at every unit: H (ir checks the operand)
            return "H"
        dims = {self.dims[a] for a in node.args} - {SCALAR}
        if self.input_is_hidden and dims == {"I", "H"}:
            return "H"
        return dims.pop() if len(dims) == 1 else SCALAR if not dims else UNKNOWN

    def leaf(self, name: str, op: str, auto: bool = False, **attrs) -> "Value":
        existing = self.by_name.get(name)
        if existing is None:
            self.add(make_node(name, op, **attrs))
            if auto:
                self.auto_consts.add(name)
            return Value(self, name)
        wanted = make_node(name, op, **attrs)
        if existing.op == op and existing.attrs == wanted.attrs:
            return Value(self, name)
        raise self._redeclared(existing, wanted, auto)

    def _redeclared(self, existing: Node, wanted: Node, auto: bool) -> CellGraphError:
        """The error for a name declared twice with another kind or other attributes."""
        name = existing.name
        if auto or name in self.auto_consts:
            number = (wanted if auto else existing).attr("value")
            other = existing if auto else wanted
            what = (f"a const of value {other.attr('value')!r}" if other.op == "const" else
                    f"the {other.op} '{name}'")
            return CellGraphError(Problem(
                f"the DSL names the number {number!r} '{name}' on its own, and {what} has that name too",
                node=name, field="name",
                hint=f"rename the {other.op}, or name the number yourself: const({number!r}, \"another_name\")"))
        if existing.op != wanted.op:
            return CellGraphError(Problem(f"name used for a {existing.op} and a {wanted.op}", node=name,
                                          field="name", hint="give each parameter its own name"))
        old, new = existing.attr_dict, wanted.attr_dict
        key = next(k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
        return CellGraphError(Problem(
            f"{existing.op} declared again with {key}={new.get(key)!r}; it was declared with {key}={old.get(key)!r}",
            node=name, field=f"attrs.{key}",
            hint=f"declare each {existing.op} the same way every time it is used, or give the other one a new name"))

    def op(self, op: str, *args: "Value", **attrs) -> "Value":
        self.check_active(op)
        for arg in args:
            if arg.builder is not self:
                raise CellGraphError(Problem(f"'{op}' is given a value of another @cell function", node=arg.name,
                                             field="args", hint="build each cell from its own input, states "
                                                                "and parameters"))
        if self.frame is None and self.code is not None:
            self._find_frame()
        name = self.temp()
        self.add(make_node(name, op, [a.name for a in args], **attrs))
        return Value(self, name)

    def check_active(self, what: str) -> None:
        if not _BUILDERS or _BUILDERS[-1] is not self:
            raise CellGraphError(Problem(f"'{what}' on a cell value outside the @cell function that made it",
                                         field=what, hint="compute every value of a cell inside its @cell "
                                                          "function"))

    def _find_frame(self) -> None:
        """Find the cell function's frame on the stack (an op is made inside it, or in a function it calls).
        Its local variables, read after it returns, name the nodes; reading them this way leaves any profiler
        or debugger (sys.setprofile, sys.settrace) as it is."""
        frame = sys._getframe(2)
        while frame is not None and frame.f_code is not self.code:
            frame = frame.f_back
        self.frame = frame

    def local_values(self) -> dict:
        """The cell function's local variables when it returned (empty where its frame was never seen)."""
        frame, self.frame = self.frame, None
        return dict(frame.f_locals) if frame is not None else {}


def _current(what: str = "DSL helpers (W, b, v, const, sigmoid, ...)") -> _Builder:
    if not _BUILDERS:
        raise CellGraphError(f"{what} are only usable inside an @cell function",
                             hint="decorate the function with @engine.dsl.cell")
    return _BUILDERS[-1]


# The ops that Value's Python operators build (a + b, a - b, a * b, 2.0 * a, 1 - a, -a): engine/dsl_emit.py
# writes these with the operator, every other op as a call of its function.
OPERATOR_OPS = frozenset({"add", "sub", "mul", "div", "scale", "one_minus", "neg"})


class Value:
    """A vector value in the cell being built. Supports +, -, *, /, unary -, abs() and numbers."""

    __array_priority__ = 1000
    __hash__ = object.__hash__     # values stay usable as dict keys; == is refused (see __eq__)

    def __init__(self, builder: _Builder, name: str):
        self.builder = builder
        self.name = name

    def _lift(self, other, operator: str) -> "Value":
        if isinstance(other, Value):
            return other
        if is_number(other):
            return const(finite_number(other, f"the number in '{operator}'"))
        raise CellGraphError(Problem(f"cannot combine a cell value with {type(other).__name__} {other!r}"[:200],
                                     field=operator, hint="use cell values, numbers, or parameters created with "
                                                          "W/b/v/const"))

    def __add__(self, other):
        return self.builder.op("add", self, self._lift(other, "+"))

    def __radd__(self, other):
        return self.builder.op("add", self._lift(other, "+"), self)

    def __sub__(self, other):
        return self.builder.op("sub", self, self._lift(other, "-"))

    def __rsub__(self, other):
        if is_number(other) and finite_number(other, "the number in '-'") == 1.0:
            return self.builder.op("one_minus", self)
        return self.builder.op("sub", self._lift(other, "-"), self)

    def __mul__(self, other):
        if is_number(other):
            return self.builder.op("scale", self, factor=finite_number(other, "the factor in '*'"))
        return self.builder.op("mul", self, self._lift(other, "*"))

    def __rmul__(self, other):
        if is_number(other):
            return self.builder.op("scale", self, factor=finite_number(other, "the factor in '*'"))
        return self.builder.op("mul", self._lift(other, "*"), self)

    def __neg__(self):
        return self.builder.op("neg", self)

    def named(self, name: str) -> "Value":
        """Give this value an explicit node name (otherwise the local variable name is used)."""
        self.builder.forced[self.name] = check_name(name, "named")
        return self

    # ---- what a cell value refuses: control flow and operators that are no op of the cell ----
    def _refuse(self, what: str, hint: str):
        node = None if self.name.startswith("%") else self.name
        raise CellGraphError(Problem(f"{what} on a cell value: cells are dataflow, not Python values", node=node,
                                     field=what, hint=hint))

    def __bool__(self):
        self._refuse("truth value (if/while/and/or)", "use ops such as relu or hard_sigmoid instead of if/else "
                                                      "on values")

    def _compare(self, operator: str):
        self._refuse(f"'{operator}'", "a comparison of cell values has no op; use relu, hard_sigmoid or sigmoid "
                                      "for a soft choice, and compare names (value.name) in Python code")

    def __eq__(self, other):
        self._compare("==")

    def __ne__(self, other):
        self._compare("!=")

    def __lt__(self, other):
        self._compare("<")

    def __le__(self, other):
        self._compare("<=")

    def __gt__(self, other):
        self._compare(">")

    def __ge__(self, other):
        self._compare(">=")

    def __truediv__(self, other):
        return self.builder.op("div", self, self._lift(other, "/"))

    def __rtruediv__(self, other):
        return self.builder.op("div", self._lift(other, "/"), self)

    def __floordiv__(self, other):
        self._refuse("'//'", "the cell has no integer division; write a / b")

    __rfloordiv__ = __mod__ = __rmod__ = __floordiv__

    def __pow__(self, other):
        self._refuse("'**'", "the cell has no power op; write x * x, sqrt(x) or rsqrt(x)")

    __rpow__ = __pow__

    def __matmul__(self, other):
        self._refuse("'@'", "a matmul is W(\"name\") @ value: the weight comes first")

    __rmatmul__ = __matmul__

    def __float__(self):
        self._refuse("float()", "a cell value has no number while the cell is built")

    __int__ = __index__ = __complex__ = __float__

    def __abs__(self):
        return self.builder.op("abs", self)

    def __len__(self):
        self._refuse("len()", "a cell value is one vector; its size is symbolic (I, H or P)")

    def __iter__(self):
        self._refuse("iteration", "a cell value is one vector; it has no elements while the cell is built")

    def __getitem__(self, key):
        self._refuse("indexing", "a cell value is one vector; it has no elements while the cell is built")


class WeightRef:
    """A weight matrix; `W(name) @ value` applies it. Rows default to H; columns follow the operand. heads=k makes
    it block-diagonal: k independent (rows/k x cols/k) blocks, head j's block reading and writing the j-th k-th of
    the units (the multi-head recurrence of sLSTM); stored as (k, rows/k, cols/k)."""

    def __init__(self, name: str, rows: str = "H", heads: int = 1):
        self.name, self.rows, self.heads = name, rows, heads

    def __matmul__(self, operand: Value) -> Value:
        if not isinstance(operand, Value):
            raise CellGraphError(Problem(f"W('{self.name}') @ ... needs a cell value, got "
                                         f"{type(operand).__name__}", node=self.name, field="operand",
                                         hint="multiply a weight by the input, a state or a computed value"))
        builder = operand.builder
        builder.check_active("@")
        cols = builder.dims[operand.name]
        existing = builder.by_name.get(self.name)
        if existing is not None and existing.op == "weight" and existing.attr("cols") != cols:
            raise CellGraphError(Problem(
                f"weight has {existing.attr('cols')} columns but is applied to a value of size {cols}",
                node=self.name, field="attrs.cols", hint="use a separate weight for each operand size"))
        if existing is not None and existing.op == "weight" and existing.attr("heads", 1) != self.heads:
            raise CellGraphError(Problem(
                f"weight is used with heads={existing.attr('heads', 1)} and heads={self.heads}", node=self.name,
                field="attrs.heads", hint="give the weight one heads count, or use a separate weight"))
        heads = {} if self.heads == 1 else {"heads": self.heads}
        w = builder.leaf(self.name, "weight", rows=self.rows, cols=cols, **heads)
        return builder.op("matmul", w, operand)

    def __rmatmul__(self, other):
        raise CellGraphError(Problem(f"... @ W('{self.name}'): the weight comes first", node=self.name,
                                     field="operand", hint=f"write W(\"{self.name}\") @ value"))


@arguments_checked
def W(name: str, rows: str = "H", heads: int = 1) -> WeightRef:
    if isinstance(heads, bool) or not isinstance(heads, numbers.Integral) or not 1 <= heads <= MAX_HEADS:
        raise CellGraphError(Problem(f"W('{name}'): heads must be a whole number from 1 to {MAX_HEADS}, got "
                                     f"{shown_value(heads)}", node=str(name)[:60], field="heads",
                                     hint="e.g. W(\"R\", heads=4): four blocks; hidden_size must be a multiple"))
    return WeightRef(check_name(name, "W"), check_dim(rows, "W", "rows"), int(heads))


@arguments_checked
def b(name: str, dim: str = "H") -> Value:
    return _current().leaf(check_name(name, "b"), "bias", dim=check_dim(dim, "b", "dim"))


@arguments_checked
def v(name: str, dim: str = "H") -> Value:
    return _current().leaf(check_name(name, "v"), "vector", dim=check_dim(dim, "v", "dim"))


@arguments_checked
def layer_norm(value, gain=None, bias=None, eps: float = 1e-5):
    """Layer normalization over the H units of each row (Ba, Kiros & Hinton 2016): (value - mean) / sqrt(var + eps),
    times gain, plus bias (`v(...)`, `b(...)` vectors, or None). Given a list of H-sized values, it normalizes them
    jointly, as one row of len(list) * H units (the 4H gate pre-activations of Haste's LayerNormLSTM), and returns
    the list; gain and bias are then lists too. Built from mean_h, sub, mul, add and rsqrt: every backend runs it
    and its gradient follows from theirs."""
    many = isinstance(value, (list, tuple))
    values, gains, biases = ((list(a) if isinstance(a, (list, tuple)) else [a] * len(value)) if many else [a]
                             for a in (value, gain, bias))
    for label, items in (("value", values), ("gain", gains), ("bias", biases)):
        bad = [item for item in items if not (isinstance(item, Value) or (item is None and label != "value"))]
        if bad or not items or len(items) != len(values):
            got = (shown_value(bad[0]) if bad else f"a list of {len(items)}")
            raise CellGraphError(Problem(f"layer_norm(): '{label}' needs {len(values) or 1} cell value(s), got "
                                         f"{got}", field=label,
                                         hint="layer_norm(v, gain=v('g'), bias=b('beta')), or lists of equal "
                                              "length to normalize several values jointly"))
    eps = finite_number(eps, "layer_norm() argument 'eps'")
    if not eps > 0:
        raise CellGraphError(Problem(f"layer_norm(): eps must be > 0, got {eps}", field="eps",
                                     hint="a small positive number such as 1e-5 keeps rsqrt finite"))
    mean_h, rsqrt = op_function("mean_h"), op_function("rsqrt")

    def mean(parts):                  # the mean over every unit of the parts: the mean of their means
        total = mean_h(parts[0])
        for part in parts[1:]:
            total = total + mean_h(part)
        return total if len(parts) == 1 else total * (1.0 / len(parts))

    mu = mean(values)
    centred = [part - mu for part in values]
    scale = rsqrt(mean([d * d for d in centred]) + eps)
    out = []
    for d, g, beta in zip(centred, gains, biases):
        y = d * scale if g is None else d * scale * g
        out.append(y if beta is None else y + beta)
    return out if many else out[0]


def auto_const_name(value: float) -> str:
    """The name const(value) gets without an explicit name (engine.dsl_emit writes such consts without one)."""
    text = repr(float(value)).replace("-", "m").replace(".", "_").replace("+", "")
    return f"c_{text}"


@arguments_checked
def const(value: float, name: str | None = None) -> Value:
    builder = _current()
    number = finite_number(value, "const() argument 'value'")
    if name is None:
        return builder.leaf(auto_const_name(number), "const", auto=True, value=number)
    return builder.leaf(check_name(name, "const"), "const", value=number)


def op_function(op: str) -> Callable[..., Value]:
    """The DSL function of op `op` of engine.ops: it takes one cell value per port of the op."""
    def fn(*args: Value, **kwargs) -> Value:
        spec = OPS[op]
        if kwargs:
            keyword = sorted(kwargs)[0]
            raise CellGraphError(Problem(f"{op}() takes its cell values by position, got keyword '{keyword}'",
                                         field=keyword, hint=f"write {op}({', '.join(spec.ports)})"))
        if len(args) != spec.arity:
            raise CellGraphError(Problem(f"{op}() takes {spec.arity} cell value(s) ({', '.join(spec.ports)}), "
                                         f"got {len(args)}", field="args",
                                         hint=f"write {op}({', '.join(spec.ports)})"))
        for port, arg in zip(spec.ports, args):
            if not isinstance(arg, Value):
                raise CellGraphError(Problem(f"{op}() argument '{port}' needs a cell value, got "
                                             f"{type(arg).__name__} {arg!r}"[:200], field=port,
                                             hint="pass the input, a state, a parameter (b, v, const) or a "
                                                  "computed value; numbers go through const(0.5)"))
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


def build_cell(fn: Callable, name: str | None = None, output: str = "h", doc: str | None = None,
               input_is_hidden: bool = False, state_dims: dict[str, str] | None = None) -> CellGraph:
    params = check_options(fn, name, output, doc, input_is_hidden, state_dims)
    state_dims = dict(state_dims or {})
    builder = _Builder(getattr(fn, "__code__", None), input_is_hidden)
    _BUILDERS.append(builder)
    try:
        x = builder.leaf(params[0], "input")
        states = [builder.leaf(p, "state", **({"dim": state_dims[p]} if state_dims.get(p, "H") != "H" else {}))
                  for p in params[1:]]
        result = fn(x, *states)
    finally:
        _BUILDERS.pop()
    local_vars = builder.local_values()
    if isinstance(result, Value) and len(states) == 1:
        result = {params[1]: result}
    if not isinstance(result, dict):
        raise CellGraphError("an @cell function returns {state_name: next_value}", field="return",
                             hint=f"return {{'{params[1]}': ...}}")
    for key, val in result.items():
        if not isinstance(key, str) or key not in params[1:]:
            raise CellGraphError(Problem("returned a next value for an unknown state", node=str(key)[:100],
                                         field="return", hint=f"states are {params[1:]}"))
        if not isinstance(val, Value) or val.builder is not builder:
            what = "a value of another @cell function" if isinstance(val, Value) else type(val).__name__
            raise CellGraphError(Problem(f"next value must be a cell value, got {what}", node=key, field="return",
                                         hint="return a value computed from this cell's input and states"))
    names = _choose_names(builder, local_vars, result, params)
    nodes = tuple(Node(names.get(n.name, n.name), n.op, tuple(names.get(a, a) for a in n.args), n.attrs)
                  for n in builder.nodes)
    state_specs = tuple(StateSpec(k, names.get(v_.name, v_.name)) for k, v_ in result.items())
    return CellGraph(name=name or getattr(fn, "__name__", "designed_cell"), nodes=nodes, states=state_specs,
                     output=output, doc=inspect.cleandoc(doc if doc is not None else (fn.__doc__ or "")),
                     input_is_hidden=input_is_hidden)


def _choose_names(builder: _Builder, local_vars: dict, result: dict, params: list[str]) -> dict[str, str]:
    taken = {n.name for n in builder.nodes if not n.name.startswith("%")}
    names: dict[str, str] = {}

    suffix: dict[str, int] = {}      # per wanted name, the first suffix not yet known to be taken

    def claim(temp: str, wanted: str):
        base, k = wanted, suffix.get(wanted, 1)
        if k > 1:
            wanted = f"{base}_{k - 1}"
        while wanted in taken:
            wanted = f"{base}_{k}"
            k += 1
        suffix[base] = k
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
