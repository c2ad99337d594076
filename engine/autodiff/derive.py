"""The pass backward_graph: a cell's backward step, derived from the op table's gradient rules.

Reverse-mode differentiation of one step of one layer. Forward nodes are visited in reverse topological order;
each live node that depends on something differentiable (x, a state, a parameter) gets an adjoint: the sum of
the terms its consumers' rules (engine.ops OpDef.vjp) give it, plus, for a state's next value, the adjoints that
enter the step. A term that is the consumer's adjoint unchanged (add, identity) is an alias, not a node. The pass
reads the frozen cell and returns a new frozen BackwardGraph; it never edits the cell.
"""
from __future__ import annotations

from collections import defaultdict

from ..ir import CellGraph, Node
from ..ops import OPS, Vjp, backward_op_def
from .errors import AutodiffError
from .graph import BackwardGraph, BackwardInput, BackwardNode

# Leaves whose adjoint the backward step computes (consts are fixed numbers: they get none).
DIFFERENTIABLE_LEAVES = ("input", "state", "weight", "bias", "vector")


def backward_graph(cell: CellGraph) -> BackwardGraph:
    """The backward step of `cell` (frozen data). Raises AutodiffError naming the node an op cannot be
    differentiated at."""
    if not isinstance(cell, CellGraph):
        raise AutodiffError(f"backward_graph needs a CellGraph, got {type(cell).__name__}",
                            hint="pass a cell (engine.preset('lstm').cell, or a Network's .cell)")
    active = active_nodes(cell)
    for name in cell.topo_order:
        if name in active and not cell[name].is_leaf:
            check_rule(cell[name])
    return _Derivation(cell, active).run()


def active_nodes(cell: CellGraph) -> frozenset[str]:
    """The live nodes that need an adjoint: differentiable leaves and the values computed from one. (A value of
    constants alone, the only kind of scalar, has none: nothing upstream of it can learn.)"""
    active: set[str] = set()
    for name in cell.topo_order:
        node = cell[name]
        if node.op in DIFFERENTIABLE_LEAVES or any(a in active for a in node.args):
            active.add(name)
    return frozenset(active & cell.live_nodes)


def check_rule(node: Node) -> None:
    """An op node's gradient rule exists and is well formed; AutodiffError naming the node otherwise."""
    spec = OPS.get(node.op)
    if spec is None:
        raise AutodiffError(f"op '{node.op}' is not in the op table, so it has no gradient rule", node=node.name,
                            field="op", hint="known ops: " + ", ".join(sorted(OPS)))
    if len(spec.vjp) != spec.arity:
        raise AutodiffError(f"op '{node.op}' has no gradient rule" if not spec.vjp else
                            f"op '{node.op}' has {len(spec.vjp)} gradient rule(s) for {spec.arity} port(s)",
                            node=node.name, field="op",
                            hint=f"give OpDef('{node.op}') in engine/ops.py a vjp: one Vjp per port, in port order")
    frame = {"dy", "y", *spec.ports}
    for port, rule in zip(spec.ports, spec.vjp):
        if backward_op_def(rule.op) is None:
            raise AutodiffError(f"the gradient rule of op '{node.op}' for port '{port}' uses unknown op "
                                f"'{rule.op}'", node=node.name, field="op",
                                hint="a rule's op is one of engine.ops.GRAD_OPS or a forward elementwise op")
        unknown = [a for a in rule.args if a not in frame]
        if unknown:
            raise AutodiffError(f"the gradient rule of op '{node.op}' for port '{port}' reads {unknown[0]!r}, which "
                                f"is not in its frame ({', '.join(sorted(frame))})", node=node.name, field="op",
                                hint="a rule reads 'dy', 'y' or a port name of its op")


class _Derivation:
    """The state of one derivation: the nodes emitted so far, the adjoint terms waiting for each forward node,
    and the names taken. Used once, by backward_graph."""

    def __init__(self, cell: CellGraph, active: frozenset[str]):
        self.cell = cell
        self.active = active
        self.taken = {n.name for n in cell.nodes}       # backward names never shadow a forward value
        self.nodes: list[BackwardNode] = []
        self.terms: dict[str, list[str]] = defaultdict(list)
        self.expected = self._count_terms()
        self.state_dependent = _state_dependent(cell)

    def run(self) -> BackwardGraph:
        cell = self.cell
        inputs = self._inputs()
        adjoints: dict[str, str] = {}
        state_adjoints: dict[str, str | None] = {s: None for s in cell.state_names}
        input_adjoint = None
        for name in reversed(cell.topo_order):
            node = cell[name]
            if name not in self.active or node.op == "weight":    # a weight's gradient comes from its matmuls
                continue
            adjoint = self._adjoint(name)
            adjoints[name] = adjoint
            if node.op in OPS:
                self._apply_rule(node, adjoint)
            elif node.op in ("bias", "vector"):
                self._emit(f"grad_{name}", "batch_sum", (adjoint,), name, role="param_grad", param=name)
            elif node.op == "state":
                state_adjoints[name] = adjoint
            elif node.op == "input":
                input_adjoint = adjoint
        return BackwardGraph(cell=cell, inputs=inputs, nodes=tuple(self.nodes), adjoints=tuple(adjoints.items()),
                             state_adjoints=tuple(state_adjoints.items()), input_adjoint=input_adjoint,
                             saved=self._saved())

    # ---- names and nodes -----------------------------------------------------------------------------------
    def _fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def _emit(self, base: str, op: str, args: tuple[str, ...], of: str, **fields) -> str:
        node = BackwardNode(self._fresh(base), op, args, of, **fields)
        self.nodes.append(node)
        return node.name

    def _term_name(self, target: str, consumer: str) -> str:
        # A value with one term names it after itself; with several, each term says where it comes from.
        return f"d_{target}" if self.expected[target] == 1 else f"d_{target}_from_{consumer}"

    # ---- the derivation --------------------------------------------------------------------------------------
    def _count_terms(self) -> dict[str, int]:
        """How many adjoint terms each forward node will receive: one per (consumer, port) and per input."""
        counts: dict[str, int] = defaultdict(int)
        for name in self.active:
            node = self.cell[name]
            for a in node.args if node.op in OPS else ():
                if a in self.active and self.cell[a].op != "weight":
                    counts[a] += 1
        for s in self.cell.states:
            counts[s.next] += 2 if s.name == self.cell.output else 1
        return counts

    def _inputs(self) -> tuple[BackwardInput, ...]:
        """The adjoints entering the step, registered as the first terms of the states' next values."""
        cell = self.cell
        inputs = []
        out_next = cell.next_of(cell.output)
        inputs.append(BackwardInput(self._fresh("d_output"), "output", cell.output, out_next))
        for s in cell.states:
            inputs.append(BackwardInput(self._fresh(f"d_{s.name}_carry"), "carry", s.name, s.next))
        for i in inputs:
            self.terms[i.of].append(i.name)
        return tuple(inputs)

    def _adjoint(self, name: str) -> str:
        """The backward value holding `name`'s adjoint: its one term, or the sum of its terms."""
        terms = self.terms.pop(name, [])
        assert len(terms) == self.expected[name], (name, terms)       # every consumer was visited first
        if len(terms) == 1:
            return terms[0]
        return self._emit(f"d_{name}", "sum", tuple(terms), name)

    def _apply_rule(self, node: Node, adjoint: str) -> None:
        spec = OPS[node.op]
        frame = {"dy": adjoint, "y": node.name, **dict(zip(spec.ports, node.args))}
        for arg, rule in zip(node.args, spec.vjp):
            if arg not in self.active:
                continue
            if rule.role == "weight_grad":      # a weight of heads keeps its blocks' gradient only
                heads = self.cell[arg].attr("heads", 1)
                self._emit(f"grad_{arg}", rule.op, _frame_args(rule, frame), node.name, role="weight_grad",
                           param=arg, attrs=(("heads", heads),) if heads > 1 else ())
            elif rule.passes_through:
                self.terms[arg].append(adjoint)
            else:
                self.terms[arg].append(self._term(node, arg, rule, frame))

    def _term(self, node: Node, arg: str, rule: Vjp, frame: dict[str, str]) -> str:
        fields: dict = {}
        if rule.role == "operand_grad":
            kind = self.cell[arg].op
            fields = dict(role="operand_grad", flows_to={"input": "input", "state": "state"}.get(kind, "internal"),
                          recurrent=arg in self.state_dependent)
        attrs = tuple((k, node.attr(k)) for k in backward_op_def(rule.op).attrs)
        return self._emit(self._term_name(arg, node.name), rule.op, _frame_args(rule, frame), arg, attrs=attrs,
                          **fields)

    def _saved(self) -> tuple[str, ...]:
        read = {a for n in self.nodes for a in n.args if a in self.cell.by_name}
        return tuple(name for name in self.cell.topo_order if name in read)


def _frame_args(rule: Vjp, frame: dict[str, str]) -> tuple[str, ...]:
    return tuple(frame[a] for a in rule.args)


def _state_dependent(cell: CellGraph) -> frozenset[str]:
    """States and the values computed from one: what the recurrence runs through."""
    dependent: set[str] = set()
    for name in cell.topo_order:
        node = cell[name]
        if node.op == "state" or any(a in dependent for a in node.args):
            dependent.add(name)
    return frozenset(dependent)
