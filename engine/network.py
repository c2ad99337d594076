"""A network: L stacked layers of one cell. Layer 0 reads the input (size I); layer l>0 reads layer
l-1's output (size H). "One layer of one cell" (CellGraph) and "a stack of layers" (Network) are
distinct concepts so that blocks of different layers (pooling, bidirectional) can come later.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import BackendError
from .ir import CellGraph, _infer_dims


def tied_node(cell: CellGraph) -> str | None:
    """The first node where a cell declared input_is_hidden combines an I-sized value with an H-sized one."""
    _, problems = _infer_dims(cell.by_name, cell.topo_order, input_is_hidden=False)
    return next((p.node for p in problems if p.node), None)


@dataclass(frozen=True)
class Network:
    cell: CellGraph
    input_size: int
    hidden_size: int
    num_layers: int = 1

    def __post_init__(self):
        for field, value, lo in (("input_size", self.input_size, 1), ("hidden_size", self.hidden_size, 1),
                                 ("num_layers", self.num_layers, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise BackendError(f"{field} must be a positive integer, got {value!r}")
            if value > 1 << 20:
                raise BackendError(f"{field}={value} is absurdly large (limit {1 << 20})",)
        if getattr(self.cell, "input_is_hidden", False) and self.input_size != self.hidden_size:
            where = tied_node(self.cell)
            raise BackendError(f"cell '{self.cell.name}' combines the input with hidden-sized values"
                               + (f" (node '{where}')" if where else "") + f", so input_size must equal hidden_size; "
                               f"got input_size={self.input_size}, hidden_size={self.hidden_size}; hint: use "
                               "input_size == hidden_size, or project x with a weight first")

    def layer_input_size(self, layer: int) -> int:
        return self.input_size if layer == 0 else self.hidden_size

    def layer_sizes(self, layer: int) -> dict[str, int]:
        return {"I": self.layer_input_size(layer), "H": self.hidden_size}

    def param_shape(self, layer: int, name: str) -> tuple[int, ...]:
        return self.cell.param_shape(name, self.layer_input_size(layer), self.hidden_size)

    def num_params(self) -> int:
        total = 0
        for layer in range(self.num_layers):
            for p in self.cell.params:
                n = 1
                for s in self.param_shape(layer, p.name):
                    n *= s
                total += n
        return total
