"""The frozen cell graph: one layer of one recurrent cell, for one time step.

Values are vectors per batch row whose size is a symbolic dimension, "I" (input size), "H"
(hidden size) or "P" (projection size: a state of size P, like the h of an LSTM with a recurrent
projection, torch.nn.LSTM's proj_size; a state's size is its `dim` attribute, H unless it says P).
Leaves are the input x_t, the recurrent states (their value at step t-1), and parameters; ops
compute the step. Each state names the node holding its next value. Which weight
feeds which gate is explicit in the graph: there is no implicit gate order anywhere.

A CellGraph validates itself when built; an invalid one cannot exist. networkx is the analysis view
(`CellGraph.nx`), derived from the frozen nodes and never edited.
"""
from __future__ import annotations

import hashlib
import heapq
import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable

import networkx as nx

from .arguments import finite_float32, shown
from .dims import DIMS, SCALAR, STATE_DIMS, infer_dims
from .errors import CellGraphError, Problem
from .ops import LEAF_KINDS, OPS, PARAM_KINDS

FIXED_MATRICES = ("sum_h", "mean_h", "var_h")   # weight attr `fixed`: set by engine/dense.py only (engine.serialize refuses it)
MAX_HEADS = 4096   # a weight's block count (W("R", heads=k)); the network checks that k divides its sizes

# The cell graph's format: its name and version head every saved graph (engine.serialize) and are part of
# the structural hash. Bump VERSION when what a node means changes.
SCHEMA = "rnn-cell-graph"
VERSION = 1


@dataclass(frozen=True)
class Node:
    """One node. `op` is an op name from engine.ops or a leaf kind (input, state, weight, ...)."""

    name: str
    op: str
    args: tuple[str, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def is_leaf(self) -> bool:
        return self.op in LEAF_KINDS

    @property
    def is_param(self) -> bool:
        return self.op in PARAM_KINDS


def make_node(name: str, op: str, args: Iterable[str] = (), **attrs: Any) -> Node:
    return Node(name, op, tuple(args), tuple(sorted(attrs.items())))


def well_typed(node: Node) -> bool:
    """Node's fields have the types the checks read (strings; a tuple of names; a tuple of (name, value) pairs)."""
    return (isinstance(node.name, str) and isinstance(node.op, str) and isinstance(node.args, tuple)
            and all(isinstance(a, str) for a in node.args) and isinstance(node.attrs, tuple)
            and all(isinstance(kv, tuple) and len(kv) == 2 and isinstance(kv[0], str) for kv in node.attrs))


@dataclass(frozen=True)
class StateSpec:
    """A recurrent state: its value at t-1 is the leaf node `name`; its value at t is node `next`."""

    name: str
    next: str


@dataclass(frozen=True)
class Warning_:
    message: str
    node: str | None = None

    def __str__(self) -> str:
        return (f"node '{self.node}': " if self.node else "") + self.message


@dataclass(frozen=True)
class CellGraph:
    name: str
    nodes: tuple[Node, ...]
    states: tuple[StateSpec, ...]
    output: str = "h"          # the state whose next value is the layer's output h_t
    doc: str = ""
    input_is_hidden: bool = False   # the cell needs input size == hidden size: x may meet H-sized values elementwise

    def __post_init__(self):
        for field, kind, example in (("nodes", Node, "Node('x', 'input')"), ("states", StateSpec, "StateSpec('h', 'h_next')")):
            value = getattr(self, field)
            if not isinstance(value, (tuple, list)) or not all(isinstance(v, kind) for v in value):
                raise CellGraphError(f"'{field}' must be a tuple of {kind.__name__}, got {type(value).__name__}",
                                     field=field, hint=f"e.g. ({example}, ...), or build the cell with the "
                                                       "@engine.cell DSL or engine.from_dict")
            object.__setattr__(self, field, tuple(value))
        for n in self.nodes:
            if not well_typed(n):
                raise CellGraphError(f"node {shown(n.name)}: name and op must be strings, args a tuple of node names "
                                     "and attrs a tuple of (name, value) pairs", node=str(n.name)[:60], field="nodes",
                                     hint="make nodes with engine.ir.make_node(name, op, args, **attrs)")
        for s in self.states:
            if not isinstance(s.name, str) or not isinstance(s.next, str):
                raise CellGraphError(f"state {shown(s.name)}: name and next must be node names (strings)",
                                     field="states", hint="e.g. StateSpec('h', 'h_next')")
        for field, kind in (("name", str), ("output", str), ("doc", str), ("input_is_hidden", bool)):
            if not isinstance(getattr(self, field), kind):
                raise CellGraphError(f"'{field}' must be a {kind.__name__}, got {type(getattr(self, field)).__name__}",
                                     field=field, hint="build the cell with the @engine.cell DSL or engine.from_dict")
        problems, warnings = diagnose(self)
        if problems:
            raise CellGraphError(problems)
        object.__setattr__(self, "_warnings", tuple(warnings))

    def __hash__(self) -> int:
        """The fields' hash, as the dataclass's would be, computed once: the cell keys the caches a training step
        looks in every call (its plan, its backward graph), and hashing 50 nested nodes each time cost ~10 us."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.name, self.nodes, self.states, self.output, self.doc, self.input_is_hidden))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        """Pickled without the cached hash: another process hashes strings differently."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    # ---- lookups -------------------------------------------------------------------------
    @cached_property
    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def __getitem__(self, name: str) -> Node:
        return self.by_name[name]

    @property
    def warnings(self) -> tuple[Warning_, ...]:
        return self._warnings

    @property
    def input(self) -> Node:
        return next(n for n in self.nodes if n.op == "input")

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states)

    def next_of(self, state: str) -> str:
        return next(s.next for s in self.states if s.name == state)

    @property
    def params(self) -> tuple[Node, ...]:
        """Trainable parameters, in definition order (the order of initialization)."""
        return tuple(n for n in self.nodes if n.is_param)

    @cached_property
    def dims(self) -> dict[str, str]:
        return infer_dims(self.by_name, self.topo_order, self.input_is_hidden)[0]

    def state_dim(self, name: str) -> str:
        """The size of a state: "H", or "P" for a projected state."""
        return self[name].attr("dim", "H")

    @property
    def output_dim(self) -> str:
        """The size of the layer's output (the output state's): the next layer's input size."""
        return self.state_dim(self.output)

    @property
    def size_multiple(self) -> int:
        """What every size a weight of heads spans must be a multiple of (the lcm of the heads counts; 1 without
        heads): engine.Network refuses other sizes by name."""
        return math.lcm(1, *(n.attr("heads", 1) for n in self.nodes if n.op == "weight"))

    def fit_size(self, size: int) -> int:
        """The smallest multiple of size_multiple that is at least `size` (a size this cell's heads can take)."""
        k = self.size_multiple
        return -(-size // k) * k

    @property
    def uses_projection(self) -> bool:
        """Whether any value has size P: the network then has a projection size (Network.proj_size)."""
        return any(n.attr("dim") == "P" or "P" in (n.attr("rows"), n.attr("cols")) for n in self.nodes)

    def param_shape(self, name: str, input_size: int, hidden_size: int,
                    proj_size: int | None = None) -> tuple[int, ...]:
        node = self[name]
        size = {"I": input_size, "H": hidden_size, "P": hidden_size if proj_size is None else proj_size}
        if node.op == "weight":
            heads = node.attr("heads", 1)
            if heads > 1:                     # k blocks of (rows/k, cols/k); engine.network checks k divides both
                return (heads, size[node.attr("rows")] // heads, size[node.attr("cols")] // heads)
            return (size[node.attr("rows")], size[node.attr("cols")])
        return (size[node.attr("dim", "H")],)

    # ---- analysis view -------------------------------------------------------------------
    @cached_property
    def nx(self) -> nx.DiGraph:
        return to_networkx(self.nodes)

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """Arguments before their consumers; among the values ready at once, the one defined first."""
        return tuple(topological_order(self.nodes)[0])

    def consumers(self, name: str) -> list[str]:
        """The nodes that read `name`, in definition order (networkx's successors, without building networkx)."""
        return list(self.readers.get(name, ()))

    @cached_property
    def readers(self) -> dict[str, tuple[str, ...]]:
        """For each node, the nodes that read it, in definition order, each once."""
        found: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for a in dict.fromkeys(n.args):
                if a in found:
                    found[a].append(n.name)
        return {name: tuple(users) for name, users in found.items()}

    @cached_property
    def live_nodes(self) -> frozenset[str]:
        """Nodes that some state's next value depends on."""
        return frozenset(ancestors(self.by_name, [s.next for s in self.states]))

    # ---- identity ------------------------------------------------------------------------
    def structure(self) -> dict[str, Any]:
        """Everything that decides what the cell computes, as plain lists and dicts: the format, the output, the
        nodes and the states (not the name or doc). `args` list the op's ports in the order engine.ops gives."""
        nodes = []
        for n in self.nodes:
            entry: dict[str, Any] = {"name": n.name, "op": n.op}
            if n.args:
                entry["args"] = list(n.args)
            if n.attrs:
                entry["attrs"] = dict(n.attrs)
            nodes.append(entry)
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "version": VERSION,
            "output": self.output,
            "nodes": nodes,
            "states": [{"name": s.name, "next": s.next} for s in self.states],
        }
        if self.input_is_hidden:           # present only when set: every other cell's structure stays as it was
            out["input_is_hidden"] = True
        return out

    @cached_property
    def structural_hash(self) -> str:
        """Hash of the structure (not the name or doc): equal graphs compile to equal code. json.dumps with
        sorted keys is only the canonical byte string that is hashed."""
        return hashlib.sha256(json.dumps(self.structure(), sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **changes) -> "CellGraph":
        fields = dict(name=self.name, nodes=self.nodes, states=self.states, output=self.output, doc=self.doc,
                      input_is_hidden=self.input_is_hidden)
        fields.update(changes)
        return CellGraph(**fields)


def to_networkx(nodes: Iterable[Node]) -> nx.DiGraph:
    g = nx.DiGraph()
    for n in nodes:
        g.add_node(n.name, op=n.op)
    for n in nodes:
        spec = OPS.get(n.op)
        for i, a in enumerate(n.args):
            port = spec.ports[i] if spec and i < len(spec.ports) else str(i)
            if a in g:
                g.add_edge(a, n.name, port=port)
    return g


def topological_order(nodes: Iterable[Node]) -> tuple[list[str], list[str]]:
    """(order, cycle): every node after its arguments, the ready node defined first going first (networkx's
    lexicographical_topological_sort keyed by definition order), and, where the nodes loop, one loop as the list
    of its node names (first == last). Iterative and linear: a cell of 10,000 nodes in a row is no deep recursion."""
    nodes = list(nodes)
    index = {n.name: i for i, n in enumerate(nodes)}
    waiting = [0] * len(nodes)                       # arguments not yet placed, per node
    consumers: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for a in n.args:
            j = index.get(a)
            if j is not None:
                waiting[i] += 1
                consumers[j].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i].name)
        for j in consumers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) == len(nodes):
        return order, []
    # Every node left waits on another node left: walk back along such arguments until a node repeats.
    left = {nodes[i].name for i, count in enumerate(waiting) if count}
    by_name = {n.name: n for n in nodes}
    path, seen = [], {}
    name = min(left, key=index.get)
    while name not in seen:
        seen[name] = len(path)
        path.append(name)
        name = next(a for a in by_name[name].args if a in left)
    loop = path[seen[name]:] + [name]
    return order, loop[::-1]                          # argument -> consumer, as data flows


def ancestors(by_name: dict[str, Node], roots: Iterable[str]) -> set[str]:
    """The roots and every node they depend on (iteratively: no recursion limit on deep cells)."""
    found: set[str] = set()
    stack = [r for r in roots if r in by_name]
    while stack:
        name = stack.pop()
        if name in found:
            continue
        found.add(name)
        stack.extend(a for a in by_name[name].args if a in by_name and a not in found)
    return found


# ---- validation ----------------------------------------------------------------------------

def diagnose(graph: CellGraph) -> tuple[list[Problem], list[Warning_]]:
    """Every problem (errors) and every warning of a graph, without raising."""
    problems: list[Problem] = []
    warnings: list[Warning_] = []
    nodes = graph.nodes
    if not isinstance(graph.name, str) or not graph.name:
        problems.append(Problem("the cell needs a non-empty name", field="name",
                                hint="give the cell a name such as 'my_lstm'"))

    seen: dict[str, Node] = {}
    for n in nodes:
        if not isinstance(n.name, str) or not n.name.isidentifier():
            problems.append(Problem(f"name {shown(n.name)} is not a valid identifier", node=str(n.name), field="name",
                                    hint="use letters, digits and '_', not starting with a digit"))
        if n.name in seen:
            problems.append(Problem("duplicate name: two nodes are called this", node=n.name, field="name",
                                    hint="rename one of them"))
        seen[n.name] = n
    by_name = seen

    for n in nodes:
        problems += _check_node(n, by_name)

    inputs = [n for n in nodes if n.op == "input"]
    if len(inputs) != 1:
        problems.append(Problem(f"a cell has exactly one input node, found {len(inputs)}", field="nodes",
                                hint="add one node with op 'input' (x_t)" if not inputs else
                                "keep one input node"))

    state_nodes = {n.name for n in nodes if n.op == "state"}
    spec_names: set[str] = set()
    for s in graph.states:
        if s.name in spec_names:
            problems.append(Problem("state listed twice", node=s.name, field="states",
                                    hint="give each state exactly one {name, next} entry"))
        spec_names.add(s.name)
        if s.name not in state_nodes:
            problems.append(Problem("next value given for an unknown state", node=s.name, field="states",
                                    hint=f"add a node '{s.name}' with op 'state', or fix the name"))
        if not s.next:
            problems.append(Problem(f"state '{s.name}' has no next value yet", node=s.name, field="states.next",
                                    hint="wire the value that computes it into its next-state block (JSON: "
                                         "the node name in 'next')"))
        elif s.next not in by_name:
            problems.append(Problem(f"next value '{s.next}' is not a node", node=s.name, field="states.next",
                                    hint="point the state at the node that computes its new value"))
        elif by_name[s.next].is_param or by_name[s.next].op in ("input", "const"):
            problems.append(Problem(f"next value '{s.next}' is a {by_name[s.next].op}, not a computed value",
                                    node=s.name, field="states.next",
                                    hint="point the state at an op node, e.g. identity(...) of the value"))
    for name in sorted(state_nodes - spec_names):
        problems.append(Problem("state has no next value", node=name, field="states",
                                hint=f"add {{'name': '{name}', 'next': <node>}} to states"))
    if not graph.states:
        problems.append(Problem("a recurrent cell needs at least one state", field="states",
                                hint="add a state node 'h' and give it a next value"))
    if graph.output not in spec_names:
        problems.append(Problem(f"output '{graph.output}' is not a state of the cell", field="output",
                                hint="name the state that is the layer's output (usually 'h')"))
    if problems:
        return problems, warnings

    order, loop = topological_order(nodes)
    if loop:
        problems.append(Problem(f"instantaneous loop within one step: {' -> '.join(loop)}", node=loop[0],
                                hint="a value can only feed back through a state (its value at t-1); "
                                     "add a state or break the loop"))
        return problems, warnings

    if not isinstance(graph.input_is_hidden, bool):
        problems.append(Problem(f"input_is_hidden must be true or false, got {shown(graph.input_is_hidden)}",
                                field="input_is_hidden", hint="true when the cell needs input size == hidden size"))
        return problems, warnings
    dims, dim_problems = infer_dims(by_name, order, graph.input_is_hidden)
    problems += dim_problems
    for s in graph.states:
        d = dims.get(s.next)
        want = by_name[s.name].attr("dim", "H") if s.name in by_name else "H"
        if d is not None and d not in (want, SCALAR) and not problems:
            problems.append(Problem(f"next value '{s.next}' has size {d}, the state has size {want}",
                                    node=s.name, field="states.next",
                                    hint=f"project it to size {want} with a weight whose rows are '{want}'"
                                         + ("" if want == "P" else ", or give the state dim 'P' (a projected "
                                            "state)" if d == "P" else "")))
        elif d == SCALAR and not problems:
            problems.append(Problem(f"next value '{s.next}' is a scalar; the state needs a vector of size {want}",
                                    node=s.name, field="states.next",
                                    hint="combine the constant with a vector value (a state, bias or gate)"))
    if problems:
        return problems, warnings

    live = ancestors(by_name, [s.next for s in graph.states])
    for n in nodes:
        if n.op == "state" and n.name == graph.output:
            continue            # an output-only state (QRNN's h = o * c): the next layer reads it, the cell need not
        if n.name not in live:
            what = {"input": "the input is not used", "state": "state value is never read"}.get(
                n.op, "parameter is not used" if n.is_param else "value is computed but never used")
            warnings.append(Warning_(what + " by any next state", node=n.name))
    return problems, warnings


# The attributes each leaf kind reads; an op reads the ones its OpDef lists.
LEAF_ATTRS = {"input": (), "state": ("dim",), "weight": ("rows", "cols", "heads", "fixed", "diagonal"), "bias": ("dim",),
              "vector": ("dim",), "const": ("value",)}


def _check_node(n: Node, by_name: dict[str, Node]) -> list[Problem]:
    out: list[Problem] = []
    known = LEAF_ATTRS.get(n.op, OPS[n.op].attrs if n.op in OPS else None)
    if known is not None:
        for key, _ in n.attrs:
            if key not in known:
                out.append(Problem(f"unknown attribute '{key}' for op '{n.op}'", node=n.name, field=f"attrs.{key}",
                                   hint=f"'{n.op}' takes " + (f"the attribute(s) {', '.join(known)}" if known
                                                              else "no attributes")))
    if n.op in LEAF_KINDS:
        if n.args:
            out.append(Problem(f"a {n.op} node takes no arguments, got {len(n.args)}", node=n.name, field="args",
                               hint=f"remove 'args', or use an op instead of '{n.op}'"))
        if n.op == "weight":
            for key in ("rows", "cols"):
                if n.attr(key) not in DIMS:
                    out.append(Problem(f"weight {key} must be one of {DIMS}, got {shown(n.attr(key))}", node=n.name,
                                       field=f"attrs.{key}", hint="rows is usually 'H'; cols is the size of the "
                                       "value it multiplies"))
            heads = n.attr("heads", 1)
            if isinstance(heads, bool) or not isinstance(heads, int) or not 1 <= heads <= MAX_HEADS:
                out.append(Problem(f"weight heads must be a whole number from 1 to {MAX_HEADS}, got {shown(heads)}",
                                   node=n.name, field="attrs.heads",
                                   hint="1 for a dense weight; k for k independent blocks (hidden_size a multiple "
                                        "of k)"))
            diagonal = n.attr("diagonal", 1)    # the dense form of a heads weight: its k diagonal blocks (engine/dense.py)
            if (isinstance(diagonal, bool) or not isinstance(diagonal, int) or not 1 <= diagonal <= MAX_HEADS
                    or (diagonal > 1 and heads > 1)):
                out.append(Problem(f"a diagonal weight is the dense form of a weight of k heads (k from 2 to "
                                   f"{MAX_HEADS}, no heads of its own), got diagonal={shown(diagonal)}", node=n.name,
                                   field="attrs.diagonal",
                                   hint="leave 'diagonal' out: the engine's dense form sets it; write heads=k"))
            fixed = n.attr("fixed")             # the dense form's matrix of a reduction (engine/dense.py)
            if fixed is not None and (fixed not in FIXED_MATRICES or n.attr("rows") != "H" or n.attr("cols") != "H"):
                out.append(Problem(f"a fixed weight is the H x H matrix of one of {', '.join(FIXED_MATRICES)}, got "
                                   f"fixed={shown(fixed)} on a ({shown(n.attr('rows'))}, {shown(n.attr('cols'))}) "
                                   "weight", node=n.name, field="attrs.fixed",
                                   hint="leave 'fixed' out: the engine's dense form sets it; write sum_h(v) or "
                                        "mean_h(v) for a reduction"))
        if n.op == "state" and n.attr("dim", "H") not in STATE_DIMS:
            out.append(Problem(f"a state's dim must be one of {STATE_DIMS}, got {shown(n.attr('dim'))}", node=n.name,
                               field="attrs.dim", hint="'H' (the default), or 'P' for a projected state such as "
                                                       "the h of an LSTM with proj_size"))
        if n.op in ("bias", "vector") and n.attr("dim", "H") not in DIMS:
            out.append(Problem(f"dim must be one of {DIMS}, got {shown(n.attr('dim'))}", node=n.name, field="attrs.dim",
                               hint="'H' for hidden-size vectors (almost always), 'I' for input-size ones"))
        if n.op == "const":
            v = n.attr("value")
            if not finite_float32(v):
                out.append(Problem(f"const needs a finite number 'value' within float32 range (|value| <= 3.4e38), "
                                   f"got {shown(v)}", node=n.name,
                                   field="attrs.value", hint="e.g. \"attrs\": {\"value\": 1.0}"))
        return out
    spec = OPS.get(n.op)
    if spec is None:
        out.append(Problem(f"unknown op '{n.op}'", node=n.name, field="op",
                           hint="known ops: " + ", ".join(sorted(OPS)) + "; leaves: " + ", ".join(LEAF_KINDS)))
        return out
    if len(n.args) != spec.arity:
        out.append(Problem(f"op '{n.op}' takes {spec.arity} argument(s) ({', '.join(spec.ports)}), "
                           f"got {len(n.args)}", node=n.name, field="args",
                           hint=f"give exactly {spec.arity} node name(s) in 'args', in port order"))
        return out
    for port, a in zip(spec.ports, n.args):
        if a not in by_name:
            out.append(Problem(f"argument '{port}' refers to unknown node '{a}'", node=n.name, field=f"args.{port}",
                               hint="connect the port to an existing node"))
    for key in spec.attrs:
        v = n.attr(key)
        if not finite_float32(v):
            out.append(Problem(f"op '{n.op}' needs a finite number attribute '{key}' within float32 range "
                               f"(|{key}| <= 3.4e38), got {shown(v)}", node=n.name,
                               field=f"attrs.{key}", hint=f"e.g. \"attrs\": {{\"{key}\": 0.5}}"))
    if out:
        return out
    if n.op == "matmul":
        w, operand = (by_name[a] for a in n.args)
        if w.op != "weight":
            out.append(Problem(f"the 'weight' port of a matmul must be a weight parameter, got '{w.name}' "
                               f"({w.op})", node=n.name, field="args.weight",
                               hint="connect a weight node to the 'weight' port and the vector to 'operand'"))
        if operand.op == "weight":
            out.append(Problem(f"the 'operand' port must be a vector value, got weight '{operand.name}'",
                               node=n.name, field="args.operand",
                               hint="a product of two weights is not a cell op; multiply the vector by each in turn"))
    else:
        for port, a in zip(spec.ports, n.args):
            if by_name[a].op == "weight":
                out.append(Problem(f"weight '{a}' can only be used through matmul, not '{n.op}'", node=n.name,
                                   field=f"args.{port}", hint="use matmul(weight, value), or a 'vector' "
                                   "parameter for an elementwise product"))
    return out
