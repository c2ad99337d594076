"""Cell graph -> Python source in the DSL, written the way presets/*.py are written.

    source = emit_dsl(engine.preset("gru").cell)
    # @cell
    # def gru(x, h):
    #     r = sigmoid(W("W_ir") @ x + b("b_ir") + W("W_hr") @ h + b("b_hr"))
    #     ...

Named values (gates, state next values) become one statement each; values whose names the DSL
would generate on its own (`r_pre`, `W_ir_x`, `h_next_mul`, ...) are written inline, so the code
reads like the paper's equations. Running the emitted code rebuilds the same graph: the same nodes,
names, attributes, states and output (and, for graphs built by the DSL, the same node order).

The DSL's naming rules are the single definition of which names are "automatic". Rather than copy
them here, the emitter builds its candidate source with the DSL and keeps inline only the values
that come back with their original names; the others become named statements.
"""
from __future__ import annotations

import inspect
import json
import keyword
import math
from collections import Counter

from .dsl import OPERATOR_OPS, auto_const_name
from .errors import CellGraphError, Problem
from .ir import CellGraph
from .ops import dsl_functions


def _called_ops() -> tuple[str, ...]:
    """The ops written as a call of their engine.dsl function (sigmoid(...)); the others are written with the
    Python operators that build them (engine.dsl.OPERATOR_OPS)."""
    return tuple(name for name in dsl_functions() if name not in OPERATOR_OPS)


def _helpers() -> tuple[str, ...]:
    """Everything the emitted module may take from engine.dsl. An input or state called like one of them
    would shadow it inside the function, so then the module imports `dsl` and writes `dsl.W(...)`; a
    statement called like one is written `_v3 = (...).named("tanh")`."""
    return ("W", "b", "v", "const", "cell", *_called_ops())

# Python operator precedence of the forms we write: higher binds tighter.
_SUM, _PRODUCT, _UNARY, _ATOM = 1, 2, 3, 4


# How much rebuilding the search for the most readable source may do, in nodes built (each check rebuilds the whole
# graph): a preset of 50 nodes needs about 12 checks. A larger graph is written one statement per value, which
# rebuilds the same graph by construction; the budget keeps emitting linear in the graph's size.
CHECK_BUDGET_NODES = 15_000


def emit_dsl(graph: CellGraph) -> str:
    """Python source that rebuilds `graph` through engine.dsl (see the module docstring)."""
    budget = CHECK_BUDGET_NODES // max(len(graph.nodes), 1)     # how many checks may run
    plain = _Choice(inline=set(), doc_as_docstring=_docstring(graph.doc) is not None)
    if budget < 2:
        return plain.source(graph)
    candidates = _inline_candidates(graph)
    choice = _Choice(inline=set(candidates))
    # Narrow down: each round turns the outermost misnamed values into named statements.
    for _ in range(len(graph.nodes) + 2):
        if budget == 0:
            return plain.source(graph)
        budget -= 1
        verdict = choice.check(graph)
        if verdict is None:
            break
        choice = verdict
    else:
        choice = _Choice(inline=set(), doc_as_docstring=False)
    # Widen again: a value dropped early (while a consumer above it was still misnamed) may read
    # fine inline now. Try each one back, consumers first, and keep it when nothing breaks.
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    widened = True
    while widened and budget > 0:
        widened = False
        for name in sorted(candidates - choice.inline, key=order.get, reverse=True):
            if budget == 0:
                break
            budget -= 1
            wider = _Choice(choice.inline | {name}, choice.explicit_consts, choice.doc_as_docstring)
            if wider.check(graph) is None:
                choice, widened = wider, True
    return choice.source(graph)


class _Choice:
    """Which values are written inline, which consts carry their name, whether doc is a docstring."""

    def __init__(self, inline: set[str], explicit_consts: set[str] | None = None, doc_as_docstring: bool = True):
        self.inline = inline
        self.explicit_consts = explicit_consts or set()
        self.doc_as_docstring = doc_as_docstring

    def source(self, graph: CellGraph) -> str:
        return _Writer(graph, self.inline, self.explicit_consts, self.doc_as_docstring).module()

    def check(self, graph: CellGraph) -> "_Choice | None":
        """None when the source rebuilds `graph` with every name and the doc; else a better choice."""
        try:
            rebuilt = _build(self.source(graph), graph)
        except CellGraphError:
            if not self.inline and not self.doc_as_docstring:
                raise
            return _Choice(set(), self.explicit_consts, doc_as_docstring=False)
        misnamed = _misnamed(graph, rebuilt, self.inline)
        doc_ok = rebuilt.doc == graph.doc
        if not misnamed and doc_ok:
            return None
        return _Choice(self.inline - misnamed,
                       self.explicit_consts | {n for n in misnamed if graph[n].op == "const"},
                       self.doc_as_docstring and doc_ok)


# The deepest nesting of inlined values in one statement: a longer run (10,000 adds in a row) gets a statement every
# this many levels, so the source stays readable and neither this module nor Python's compiler recurses deeply.
MAX_INLINE_DEPTH = 24


def _inline_candidates(graph: CellGraph) -> set[str]:
    """Op values used exactly once, and not a state's next value, at most MAX_INLINE_DEPTH inlined values deep:
    these may be written inline. Decided in topological order, arguments first (no recursion)."""
    uses = Counter(a for n in graph.nodes for a in n.args)
    nexts = {s.next for s in graph.states}
    candidates: set[str] = set()
    depth: dict[str, int] = {}
    for name in graph.topo_order:
        node = graph[name]
        depth[name] = 1 + max((depth[a] for a in node.args if a in candidates), default=0)
        if not node.is_leaf and uses[name] == 1 and name not in nexts and depth[name] <= MAX_INLINE_DEPTH:
            candidates.add(name)
    return candidates


def _text(value: str) -> str:
    """A double-quoted Python string literal, as the presets write them."""
    return json.dumps(value, ensure_ascii=False)


def _number(value: float) -> str:
    value = float(value)
    return repr(value) if math.isfinite(value) else f"float({str(value)!r})"


class _Writer:
    """Writes one candidate module for a given choice of inlined values."""

    def __init__(self, graph: CellGraph, inline: set[str], explicit_consts: set[str], doc_as_docstring: bool):
        self.graph = graph
        self.inline = inline
        self.explicit_consts = explicit_consts
        self.doc_as_docstring = doc_as_docstring
        self.params = [graph.input.name] + [n.name for n in graph.nodes if n.op == "state"]
        # Only arguments can shadow a helper: statements that would are renamed (see variable_for)
        # and parameters live in strings, W("W").
        self.helpers = _helpers()
        self.qualified = bool(set(self.params) & set(self.helpers))
        self.used_helpers: set[str] = {"cell"}
        for p in self.params:
            if keyword.iskeyword(p) or (self.qualified and p == "dsl"):
                raise CellGraphError(Problem(f"'{p}' cannot be a Python function argument, so the DSL "
                                             "cannot name the input or a state like this", node=p,
                                             field="name", hint="rename the node"))
        self.variables: dict[str, str] = {}   # node name -> Python variable of its statement

    def helper(self, name: str) -> str:
        self.used_helpers.add(name)
        return f"dsl.{name}" if self.qualified else name

    # ---- expressions --------------------------------------------------------------------
    def ref(self, name: str) -> tuple[str, int]:
        """The text of a value where it is used, and its precedence."""
        node = self.graph[name]
        if node.op in ("input", "state"):
            return name, _ATOM
        if node.op in ("bias", "vector"):
            fn = self.helper("b" if node.op == "bias" else "v")
            dim = node.attr("dim", "H")
            return (f"{fn}({_text(name)})" if dim == "H" else f"{fn}({_text(name)}, dim={_text(dim)})"), _ATOM
        if node.op == "const":
            value = node.attr("value")
            fn = self.helper("const")
            if name == auto_const_name(value) and name not in self.explicit_consts:
                return f"{fn}({_number(value)})", _ATOM
            return f"{fn}({_number(value)}, {_text(name)})", _ATOM
        if name in self.variables:
            return self.variables[name], _ATOM
        return self.expr(name)

    def operand(self, name: str, parent: int, right: bool) -> str:
        text, precedence = self.ref(name)
        if precedence < parent or (right and precedence == parent):
            return f"({text})"
        return text

    def expr(self, name: str) -> tuple[str, int]:
        """The full expression computing op node `name` (its arguments inlined where allowed)."""
        node = self.graph[name]
        args = node.args
        if node.op == "matmul":
            weight = self.graph[args[0]]
            rows = weight.attr("rows")
            heads = weight.attr("heads", 1)
            w = (f"{self.helper('W')}({_text(weight.name)}" + ("" if rows == "H" else f", rows={_text(rows)}")
                 + ("" if heads == 1 else f", heads={heads}") + ")")
            return f"{w} @ {self.operand(args[1], _PRODUCT, right=True)}", _PRODUCT
        if node.op in ("add", "sub"):
            sign = "+" if node.op == "add" else "-"
            return (f"{self.operand(args[0], _SUM, right=False)} {sign} "
                    f"{self.operand(args[1], _SUM, right=True)}"), _SUM
        if node.op in ("mul", "div"):
            sign = "*" if node.op == "mul" else "/"
            return (f"{self.operand(args[0], _PRODUCT, right=False)} {sign} "
                    f"{self.operand(args[1], _PRODUCT, right=True)}"), _PRODUCT
        if node.op == "scale":
            return f"{_number(node.attr('factor'))} * {self.operand(args[0], _PRODUCT, right=True)}", _PRODUCT
        if node.op == "one_minus":
            return f"1 - {self.operand(args[0], _SUM, right=True)}", _SUM
        if node.op == "neg":
            return f"-{self.operand(args[0], _UNARY, right=True)}", _UNARY
        if node.op in _called_ops():
            return f"{self.helper(node.op)}({', '.join(self.ref(a)[0] for a in args)})", _ATOM
        raise CellGraphError(Problem(f"the DSL has no form for op '{node.op}'", node=name, field="op"))

    # ---- statements ---------------------------------------------------------------------
    def variable_for(self, name: str) -> tuple[str, bool]:
        """(Python variable, needs .named()) for the statement computing `name`."""
        shadowing = self.qualified and name == "dsl"
        if keyword.iskeyword(name) or shadowing or name in self.helpers or name.startswith("_v"):
            return f"_v{len(self.variables)}", True
        return name, False

    def body(self) -> list[str]:
        graph = self.graph
        lines: list[str] = []
        used = {a for n in graph.nodes for a in n.args}
        for name in graph.topo_order:
            node = graph[name]
            # A parameter nobody reads is never created by an expression; create it on its own, where the
            # topological order (definition order among the ready values) meets it.
            if node.op in ("bias", "vector", "const") and name not in used:
                lines.append(self.ref(name)[0])
            elif node.op == "weight" and name not in used:
                lines.append(f"# weight {_text(name)} is not used; the DSL creates weights only through @")
            if node.is_leaf or name in self.inline:
                continue
            text, precedence = self.expr(name)
            variable, forced = self.variable_for(name)
            if forced:
                text = f"{text if precedence == _ATOM else f'({text})'}.named({_text(name)})"
            self.variables[name] = variable
            lines.append(f"{variable} = {text}")
        returned = ", ".join(f"{_text(s.name)}: {self.ref(s.next)[0]}" for s in graph.states)
        lines.append(f"return {{{returned}}}")
        return lines

    def module(self) -> str:
        graph = self.graph
        body = self.body()
        function = graph.name if (graph.name.isidentifier() and not keyword.iskeyword(graph.name)
                                  and graph.name not in self.helpers and graph.name != "dsl") else "designed_cell"
        options = []
        if function != graph.name:
            options.append(f"name={_text(graph.name)}")
        if graph.output != "h":
            options.append(f"output={_text(graph.output)}")
        if graph.input_is_hidden:
            options.append("input_is_hidden=True")
        projected = {n.name: n.attr("dim") for n in graph.nodes if n.op == "state" and n.attr("dim", "H") != "H"}
        if projected:
            options.append("state_dims={" + ", ".join(f"{_text(k)}: {_text(v)}" for k, v in projected.items()) + "}")
        decorator = self.helper("cell") + (f"({', '.join(options)})" if options else "")
        docstring = _docstring(graph.doc) if self.doc_as_docstring else None
        lines = [f"# Cell {graph.name!r}, written by the designer (engine.dsl_emit)."]
        if self.qualified:
            lines.append("from engine import dsl")
        else:
            lines.append("from engine.dsl import " + ", ".join(sorted(self.used_helpers)))
        lines += ["", "", f"@{decorator}", f"def {function}({', '.join(self.params)}):"]
        if docstring:
            lines.append(docstring)
        lines += [f"    {line}" for line in body]
        if graph.doc and not docstring:
            lines += ["", "", f"{function} = {function}.replace(doc={_text(graph.doc)})"]
        return "\n".join(lines) + "\n"


def _docstring(doc: str) -> str | None:
    """The doc as an indented docstring, or None where a docstring cannot carry it unchanged."""
    if not doc:
        return None
    if '"""' in doc or "\\" in doc or doc.endswith('"') or inspect.cleandoc(doc) != doc:
        return None
    lines = doc.split("\n")
    indented = [lines[0]] + [("    " + line) if line else line for line in lines[1:]]
    text = "\n".join(indented)
    return f'    """{text}\n    """' if len(lines) > 1 else f'    """{text}"""'


def _build(source: str, graph: CellGraph) -> CellGraph:
    namespace: dict = {}
    exec(compile(source, f"<dsl of {graph.name}>", "exec"), namespace)  # noqa: S102 - our own output
    cells = [v for v in namespace.values() if isinstance(v, CellGraph)]
    if len(cells) != 1:
        raise CellGraphError(f"the emitted DSL built {len(cells)} cells, expected 1", field="dsl")
    return cells[0]


def _misnamed(graph: CellGraph, rebuilt: CellGraph, inline: set[str]) -> set[str]:
    """Inlined values and consts that came back under another name than in `graph`.

    Statements keep their names (they are local variables), so each statement's expression tree
    is walked in both graphs side by side, argument by argument.
    """
    wrong: set[str] = set()
    seen: set[str] = set()
    for node in graph.nodes:
        if node.is_leaf or node.name in inline:
            continue
        stack = [(node.name, node.name)]          # depth first, arguments in order, without recursion
        while stack:
            original, new = stack.pop()
            if original in seen:
                continue
            seen.add(original)
            if original != new and (original in inline or graph[original].op == "const"):
                # Names of inlined values derive from their consumer's name: fix the outermost
                # misnamed value first, the ones below it may come right with it.
                wrong.add(original)
                continue
            if new in rebuilt.by_name:
                stack.extend(reversed(list(zip(graph[original].args, rebuilt[new].args))))
    return wrong
