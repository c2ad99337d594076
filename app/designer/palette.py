"""The node editor's palette: one block per leaf kind, per composite building block and per op of engine.ops,
grouped by category.

A block's type is the IR op it draws (`sigmoid`, `matmul`, `weight`, ...), so reading the canvas back
needs no lookup table. Ports are the op's named ports in engine.ops order (matmul: weight, operand);
a value block has one output, `value` (the exp gates building block has three). Names and attributes are
block options the researcher edits on the node. A state's next value is given by a `next state` sink: its
`next` port takes the value, its `state` option names the state, and one sink is ticked as the layer's output.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.dims import DIMS, STATE_DIMS
from engine.ops import OPS, activations, on_change

from .composites import CANDIDATE, EPS, EXP_GATES, GATE, LAYER_NORM, LERP, OUTPUT, outputs, ports

NEXT_STATE = "next state"        # the sink block that sets a state's next value
NEXT_PORT = "next"
CATEGORIES = ("inputs", "states", "parameters", "building blocks", "ops")


@dataclass(frozen=True)
class OptionSpec:
    """One editable field on a block. `attr` is the IR attribute it edits (None for name/state/output); the cell
    JSON leaves the attribute out where its value is `implicit` (engine.to_dict's form: a state of size H, a weight
    of one head). A `whole` number is written as an int."""

    name: str
    kind: str                          # the canvas's field type: input | select | number | checkbox
    default: object
    items: tuple[str, ...] = ()
    attr: str | None = None
    implicit: object = None
    whole: bool = False


@dataclass(frozen=True)
class BlockSpec:
    type: str
    category: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    options: tuple[OptionSpec, ...]
    description: str = ""
    extra: dict = field(default_factory=dict)

    def option(self, name: str) -> OptionSpec | None:
        return next((o for o in self.options if o.name == name), None)

    @property
    def group(self) -> str:
        """The palette category, with an op's own category after it ("ops · reduction")."""
        op_category = self.extra.get("op_category")
        return f"{self.category} · {op_category}" if op_category else self.category


NAME = OptionSpec("name", "input", "")   # empty on a new block: the reader names it after its label
HEADS = OptionSpec("heads", "number", 1, attr="heads", implicit=1, whole=True)


def _dim(attr: str, default: str) -> OptionSpec:
    # DIMS is ("I", "H", "P"); H first in the list as the usual choice
    return OptionSpec(attr, "select", default, items=tuple(sorted(DIMS, key=lambda d: d != "H")), attr=attr)


def _leaf_specs() -> list[BlockSpec]:
    return [
        BlockSpec("input", "inputs", (), (OUTPUT,), (NAME,), "the input x_t of the step (size I)"),
        BlockSpec("state", "states", (), (OUTPUT,),
                  (NAME, OptionSpec("dim", "select", "H", items=STATE_DIMS, attr="dim", implicit="H")),
                  "a recurrent state's value at t-1 (size H, or P for a projected state: the h of an LSTM with "
                  "proj_size, computed by a weight with rows P)"),
        BlockSpec(NEXT_STATE, "states", (NEXT_PORT,), (),
                  (OptionSpec("state", "input", ""), OptionSpec("layer output", "checkbox", False)),
                  "sets a state's value at t; tick 'layer output' on the state that is h_t"),
        BlockSpec("weight", "parameters", (), (OUTPUT,), (NAME, _dim("rows", "H"), _dim("cols", "H"), HEADS),
                  "a weight matrix (rows x cols); use it through matmul's weight port. 'heads' k > 1: k blocks of "
                  "rows/k x cols/k on the diagonal (sLSTM's recurrent weights; hidden_size a multiple of k)"),
        BlockSpec("bias", "parameters", (), (OUTPUT,), (NAME, _dim("dim", "H")), "a bias vector, added"),
        BlockSpec("vector", "parameters", (), (OUTPUT,), (NAME, _dim("dim", "H")),
                  "a trainable vector for elementwise products (peepholes, IndRNN's u)"),
        BlockSpec("const", "parameters", (), (OUTPUT,),
                  (NAME, OptionSpec("value", "number", 1.0, attr="value")), "a fixed number"),
    ]


def _op_specs() -> list[BlockSpec]:
    """One block per op, grouped by the op's category in the order engine.ops first names each (matmul;
    arithmetic; activations; math; reductions), so that div, max and min sit with add and mul."""
    categories = list(dict.fromkeys(op.category for op in OPS.values()))
    specs = []
    for op in sorted(OPS.values(), key=lambda op: categories.index(op.category)):
        options = (NAME,) + tuple(OptionSpec(a, "number", 0.5, attr=a) for a in op.attrs)
        specs.append(BlockSpec(op.name, "ops", op.ports, (OUTPUT,), options, op.description,
                               extra={"op_category": op.category}))
    return specs


def _composite_specs() -> list[BlockSpec]:
    """Composite blocks (app/designer/composites.py): one node on the canvas, primitives in the cell JSON."""
    def activation(default):
        return OptionSpec("activation", "select", default, items=(default,) + tuple(a for a in activations()
                                                                                    if a != default))
    x_size = OptionSpec("x size", "select", "I", items=("I", "H"))
    heads = OptionSpec("heads", "number", 1)
    return [
        BlockSpec(GATE, "building blocks", ports(GATE), outputs(GATE), (NAME, activation("sigmoid"), x_size, heads),
                  "sigmoid(W x + U h + b) as one block: its weights W_<name>, U_<name> and bias b_<name> come with "
                  "it ('x size': I for the input, H for a hidden-sized value; 'heads' k: U as k diagonal blocks; "
                  "activation identity: a pre-activation such as sLSTM's)"),
        BlockSpec(CANDIDATE, "building blocks", ports(CANDIDATE), outputs(CANDIDATE),
                  (NAME, activation("tanh"), x_size, heads),
                  "tanh(W x + U h + b) as one block, with its weights and bias"),
        BlockSpec(LERP, "building blocks", ports(LERP), outputs(LERP), (NAME,),
                  "z * a + (1 - z) * b: GRU's update h_t = lerp(z, h, n)"),
        BlockSpec(LAYER_NORM, "building blocks", ports(LAYER_NORM), outputs(LAYER_NORM),
                  (NAME, OptionSpec("eps", "number", EPS)),
                  "layer normalization over the H units: (x - mean) / sqrt(var + eps) * g_<name> + b_<name>, its "
                  "gain and bias come with it (engine.dsl.layer_norm)"),
        BlockSpec(EXP_GATES, "building blocks", ports(EXP_GATES), outputs(EXP_GATES), (NAME,),
                  "sLSTM's exponential gates with the stabilizer: from the pre-activations i_pre, f_pre and the "
                  "states m, n at t-1, m_next = max(i_pre, log sigmoid(f_pre) + m), i = exp(i_pre - m_next), "
                  "f = exp(log sigmoid(f_pre) + m - m_next) (m_next = i_pre while n < 1/2: the zero start); values "
                  "<name>_m_next, <name>_i, <name>_f"),
    ]


SPECS: dict[str, BlockSpec] = {}
COMPOSITE_TYPES = frozenset(s.type for s in _composite_specs())


def _make_specs() -> None:
    """Fill SPECS in place (its importers keep one dict): again whenever engine.ops registers or removes an op."""
    SPECS.clear()
    SPECS.update((s.type, s) for s in _leaf_specs() + _composite_specs() + _op_specs())


_make_specs()
on_change(_make_specs)


def interface_type() -> str:
    """The itype string of a port in the editor schema (barfi's form; the canvas does not check it)."""
    return f"type.{float}"
