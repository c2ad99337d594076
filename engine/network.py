"""A network: L stacked layers of one cell. Layer 0 reads the input (size I); layer l>0 reads layer
l-1's output (size H, or P when the output state is a projected one: proj_size). "One layer of one
cell" (CellGraph) and "a stack of layers" (Network) are distinct concepts; networks of several blocks
(pooling over time, bidirectional layers) are engine/nets/data.py's Net.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .arguments import integer, shown
from .dims import infer_dims
from .errors import BackendError
from .ir import CellGraph


def check_cell(cell) -> None:
    """A Network's cell is a CellGraph; a preset name or a Preset is refused with the spelling that works."""
    if isinstance(cell, CellGraph):
        return
    if isinstance(cell, str):
        hint = f"pass the preset's cell: engine.Network(engine.preset({cell!r}).cell, ...)"
    elif isinstance(getattr(cell, "cell", None), CellGraph):
        hint = "pass the preset's .cell: engine.Network(preset.cell, ...)"
    else:
        hint = "a cell from engine.preset(name).cell, engine.load(path) or the @engine.cell DSL"
    raise BackendError(f"argument 'cell' of Network must be a CellGraph, got {type(cell).__name__} {shown(cell)}; "
                       f"hint: {hint}")


def check_network(network) -> "Network":
    """`network` as it is when it is a Network; anything else refused naming the argument."""
    if isinstance(network, Network):
        return network
    hint = (f"engine.Network(engine.preset({network!r}).cell, input_size, hidden_size)" if isinstance(network, str)
            else "engine.Network(cell, input_size, hidden_size, num_layers)")
    raise BackendError(f"argument 'network' must be an engine.Network, got {type(network).__name__}; hint: {hint}")


def tied_node(cell: CellGraph) -> str | None:
    """The first node where a cell declared input_is_hidden combines an I-sized value with an H-sized one."""
    _, problems = infer_dims(cell.by_name, cell.topo_order, input_is_hidden=False)
    return next((p.node for p in problems if p.node), None)


@dataclass(frozen=True)
class Network:
    cell: CellGraph
    input_size: int
    hidden_size: int
    num_layers: int = 1
    proj_size: int | None = None       # the size P of projected states (torch.nn.LSTM's proj_size); None: P = H

    def __post_init__(self):
        check_cell(self.cell)
        for field in ("input_size", "hidden_size", "num_layers"):       # np.int64 from a shape becomes an int here
            object.__setattr__(self, field, integer(getattr(self, field), field))
        if self.proj_size is not None:
            value = integer(self.proj_size, "proj_size")
            object.__setattr__(self, "proj_size", value)
            if not getattr(self.cell, "uses_projection", False):
                raise BackendError(f"proj_size={value} was given, but cell '{self.cell.name}' has no value of size P; "
                                   "hint: leave proj_size out, or give the cell a projected state (a state with dim "
                                   "'P', like the h of an LSTM with a recurrent projection)")
        if (getattr(self.cell, "input_is_hidden", False) and self.num_layers > 1
                and self.cell.output_dim == "P" and self.projection_size != self.hidden_size):
            raise BackendError(f"cell '{self.cell.name}' combines its input with hidden-sized values, but its output "
                               f"has the projection size {self.projection_size}, so layers after the first would get "
                               f"inputs of size {self.projection_size} != hidden_size={self.hidden_size}; hint: "
                               "num_layers=1, or proj_size equal to hidden_size")
        if getattr(self.cell, "input_is_hidden", False) and self.input_size != self.hidden_size:
            where = tied_node(self.cell)
            raise BackendError(f"cell '{self.cell.name}' combines the input with hidden-sized values"
                               + (f" (node '{where}')" if where else "") + f", so input_size must equal hidden_size; "
                               f"got input_size={self.input_size}, hidden_size={self.hidden_size}; hint: use "
                               "input_size == hidden_size, or project x with a weight first")

        for w in self.cell.params:
            heads = w.attr("heads", 1) if w.op == "weight" else 1
            if heads == 1:
                continue
            for layer in range(min(self.num_layers, 2)):          # every layer after the first has layer 1's sizes
                sizes = self.layer_sizes(layer)
                for side in ("rows", "cols"):
                    dim = w.attr(side)
                    if sizes[dim] % heads:
                        size_name = {"I": "input_size" if layer == 0 else "the layer input size (the output size)",
                                     "H": "hidden_size", "P": "proj_size"}[dim]
                        raise BackendError(f"weight '{w.name}' of cell '{self.cell.name}' has heads={heads}, which "
                                           f"does not divide its {side} ({size_name} = {sizes[dim]}); hint: make "
                                           f"{size_name} a multiple of {heads}, or give the weight fewer heads")

    @property
    def projection_size(self) -> int:
        """P: proj_size, or the hidden size when it is not given."""
        return self.hidden_size if self.proj_size is None else self.proj_size

    @property
    def output_size(self) -> int:
        """The size of a layer's output (its output state): H, or P for a projected output."""
        return self.projection_size if self.cell.output_dim == "P" else self.hidden_size

    def state_size(self, state: str) -> int:
        return self.projection_size if self.cell.state_dim(state) == "P" else self.hidden_size

    def layer_input_size(self, layer: int) -> int:
        return self.input_size if layer == 0 else self.output_size

    def layer_sizes(self, layer: int) -> dict[str, int]:
        return {"I": self.layer_input_size(layer), "H": self.hidden_size, "P": self.projection_size}

    def param_shape(self, layer: int, name: str) -> tuple[int, ...]:
        return self.cell.param_shape(name, self.layer_input_size(layer), self.hidden_size, self.projection_size)

    def layer_num_params(self, layer: int) -> int:
        """Parameters of one layer (every layer after the first has the same shapes)."""
        return sum(math.prod(self.param_shape(layer, p.name)) for p in self.cell.params)

    def num_params(self) -> int:
        rest = self.layer_num_params(1) * (self.num_layers - 1) if self.num_layers > 1 else 0
        return self.layer_num_params(0) + rest
