"""Networks of blocks (issue #11): cell layers, bidirectional or not, and pooling over time, in sequence.

    net = engine.Net(input_size=512, blocks=(engine.Layers("lstm", 512, num_layers=4), engine.Pool("max", 2, 2),
                                             engine.Layers("lstm", 512, num_layers=4)))
    params = engine.init_net_params(net, seed=0)

A `Network` (engine/network.py) is one block: L stacked layers of one cell, which every backend runs. A `Net` is the
sequence: block k reads what block k-1 produced. `Layers` runs a cell forward, or in both directions
(direction="bidirectional": layer l of the backward direction reads the sequence reversed in time, and the two
directions' outputs are concatenated feature-wise (merge="concat", torch.nn.LSTM(bidirectional=True)) or added
(merge="sum") before layer l + 1 reads them). `Pool` takes the max or mean over a window of time steps, moved by a
stride: T steps become (T - window) // stride + 1. Features pass through a pool unchanged.

Sizes chain: a block's input size is the size the block before it produces (the net's input_size for the first);
a block may state the input size it expects (`input_size=`), and a net whose sizes do not chain is refused naming
the block. This module is the data only: the JSON form is engine/nets/io.py, running a net engine/nets/runner.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..arguments import integer, normalised, shown
from ..errors import BackendError, CellGraphError
from ..gallery import get as get_preset
from ..ir import CellGraph
from ..network import Network
from ..params import Params, check_params, init_params

NET_SCHEMA = "rnn-network"
NET_VERSION = 1
DIRECTIONS = ("forward", "bidirectional")
MERGES = ("concat", "sum")
POOLS = ("max", "mean")


def _positive(value, what: str, where: str) -> None:
    integer(value, what, where=where)


def check_pool(pool, where: str) -> None:
    """A Pool's fields: op max or mean, window and stride positive integers (BackendError naming `where`)."""
    if not isinstance(pool, Pool):
        raise BackendError(f"{where}: a pool is an engine.Pool(op, window, stride), got {type(pool).__name__}; "
                           "hint: e.g. engine.Pool('max', 2, 2)")
    if not isinstance(pool.op, str) or pool.op not in POOLS:
        raise BackendError(f"{where}: op must be one of {', '.join(POOLS)}, got {shown(pool.op)}; "
                           "hint: 'max' or 'mean'")
    _positive(pool.window, "window", where)
    _positive(pool.stride, "stride", where)


def resolve_cell(cell) -> CellGraph:
    """A Layers block's cell: a CellGraph as it is, or the cell of the preset of that name."""
    if isinstance(cell, CellGraph):
        return cell
    if isinstance(cell, str):
        return get_preset(cell).cell                  # unknown names: CellGraphError with the closest presets
    raise CellGraphError(f"a Layers block takes a CellGraph or a preset name, got {type(cell).__name__}",
                         field="cell", hint="e.g. Layers('lstm', 512) or Layers(engine.preset('gru').cell, 256)")


@dataclass(frozen=True)
class Layers:
    """num_layers stacked layers of one cell (a preset name or a CellGraph), hidden size H."""

    cell: CellGraph | str
    hidden_size: int
    num_layers: int = 1
    direction: str = "forward"         # or "bidirectional"
    merge: str = "concat"              # how the two directions of a bidirectional layer combine: concat or sum
    proj_size: int | None = None       # for cells with projected states (engine/network.py)
    input_size: int | None = None      # the input size this block expects; None: whatever the block before gives
    name: str = ""

    def __post_init__(self):
        object.__setattr__(self, "cell", resolve_cell(self.cell))
        for key in ("hidden_size", "num_layers", "proj_size", "input_size"):   # np.int64 -> int; Net checks them
            object.__setattr__(self, key, normalised(getattr(self, key)))

    @property
    def label(self) -> str:
        return self.name or f"{self.cell.name} x{self.num_layers}" + (" (bidirectional)" if self.bidirectional else "")

    @property
    def bidirectional(self) -> bool:
        return isinstance(self.direction, str) and self.direction == "bidirectional"

    def layer_network(self, layer: int, input_size: int) -> Network:
        """The one-layer Network of layer `layer` (one direction) when the block's input has size input_size."""
        return Network(self.cell, self.layer_input_size(layer, input_size), self.hidden_size, 1, self.proj_size)

    def layer_input_size(self, layer: int, input_size: int) -> int:
        return input_size if layer == 0 else self.direction_output_size * (2 if self.merge_concat else 1)

    @property
    def merge_concat(self) -> bool:
        return self.bidirectional and self.merge == "concat"

    @property
    def direction_output_size(self) -> int:
        """What one direction of one layer outputs: H, or P for a cell with a projected output state."""
        return Network(self.cell, self.hidden_size, self.hidden_size, 1, self.proj_size).output_size

    @property
    def output_size(self) -> int:
        return self.direction_output_size * (2 if self.merge_concat else 1)


@dataclass(frozen=True)
class Pool:
    """max or mean over `window` time steps, moved by `stride`: T steps become (T - window) // stride + 1."""

    op: str = "max"
    window: int = 2
    stride: int = 2
    name: str = ""

    def __post_init__(self):
        for key in ("window", "stride"):            # np.int64 -> int; Net checks them
            object.__setattr__(self, key, normalised(getattr(self, key)))

    @property
    def label(self) -> str:
        return self.name or f"{self.op}-pool {self.window}/{self.stride}"

    def steps_out(self, steps: int) -> int:
        return (steps - self.window) // self.stride + 1


@dataclass(frozen=True)
class Net:
    input_size: int
    blocks: tuple = ()
    name: str = "net"
    doc: str = ""
    sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)   # the input size of every block

    def __post_init__(self):
        if isinstance(self.blocks, (str, bytes)) or not hasattr(self.blocks, "__iter__"):
            raise BackendError(f"net '{self.name}': blocks must be a sequence of Layers and Pool blocks, got "
                               f"{type(self.blocks).__name__}; hint: blocks=(Layers('lstm', 256),)")
        object.__setattr__(self, "blocks", tuple(self.blocks))
        object.__setattr__(self, "input_size", integer(self.input_size, "input_size", where=f"net '{self.name}'"))
        if not self.blocks:
            raise BackendError(f"net '{self.name}' has no blocks; hint: blocks=(Layers('lstm', 256),)")
        sizes, size = [], self.input_size
        for k, block in enumerate(self.blocks):
            where = f"net '{self.name}', block {k}"
            if isinstance(block, Layers):
                where += f" ('{block.label}')"
                _positive(block.hidden_size, "hidden_size", where)
                _positive(block.num_layers, "num_layers", where)
                if not isinstance(block.direction, str) or block.direction not in DIRECTIONS:
                    raise BackendError(f"{where}: direction must be one of {', '.join(DIRECTIONS)}, got "
                                       f"{shown(block.direction)}; hint: 'forward' or 'bidirectional'")
                if not isinstance(block.merge, str) or block.merge not in MERGES:
                    raise BackendError(f"{where}: merge must be one of {', '.join(MERGES)}, got {shown(block.merge)}; "
                                       "hint: 'concat' or 'sum'")
                if block.input_size is not None:
                    integer(block.input_size, "input_size", where=where)
                if block.input_size is not None and block.input_size != size:
                    before = "the net's input" if k == 0 else f"block {k - 1} ('{self.blocks[k - 1].label}')"
                    raise BackendError(f"{where} expects input size {block.input_size}, but {before} gives {size}; "
                                       "hint: make the sizes chain (a block's hidden size is the next block's "
                                       "input size; x2 after a bidirectional block that concatenates)")
                try:                                   # the cell's own size rules (input_is_hidden, proj_size)
                    for layer in range(block.num_layers):
                        block.layer_network(layer, size)
                except BackendError as e:
                    raise BackendError(f"{where}: {e}") from None
            elif isinstance(block, Pool):
                check_pool(block, where + f" ('{block.label}')")
            else:
                raise BackendError(f"{where}: a block is a Layers or a Pool, got {type(block).__name__}; "
                                   "hint: e.g. Layers('lstm', 256) or Pool('max', 2, 2)")
            sizes.append(size)
            size = block.output_size if isinstance(block, Layers) else size
        object.__setattr__(self, "sizes", tuple(sizes))

    @property
    def output_size(self) -> int:
        last = self.blocks[-1]
        return last.output_size if isinstance(last, Layers) else self.sizes[-1]

    def steps(self, steps: int) -> list[int]:
        """The sequence length each block reads, for an input of `steps` steps; refused when a pool's window is
        longer than what reaches it."""
        out, t = [], steps
        for k, block in enumerate(self.blocks):
            out.append(t)
            if isinstance(block, Pool):
                if block.window > t:
                    raise BackendError(f"net '{self.name}', block {k} ('{block.label}'): the pool window "
                                       f"{block.window} is longer than the {t} step(s) that reach it; hint: a "
                                       "longer input, or a smaller window")
                t = block.steps_out(t)
        return out


# ---- parameters -------------------------------------------------------------------------------------

@dataclass
class NetParams:
    """Per block: for Layers, {"forward": Params, "backward": Params or None}, one dict per layer of the block;
    for Pool, None."""

    blocks: list


def layer_networks(net: Net, k: int) -> list[Network]:
    """The one-layer Network of each layer (one direction) of block k, a Layers block of net."""
    block = net.blocks[k]
    return [block.layer_network(layer, net.sizes[k]) for layer in range(block.num_layers)]


def check_net(net) -> Net:
    """`net` as it is when it is an engine.Net; anything else refused naming the argument."""
    if not isinstance(net, Net):
        raise BackendError(f"argument 'net' must be an engine.Net, got {type(net).__name__}; hint: "
                           "engine.Net(input_size, (engine.Layers('lstm', 256),)), engine.net_preset(name) or "
                           "engine.load_net(path)")
    return net


def init_net_params(net: Net, seed: int = 0, dtype=np.float64) -> NetParams:
    """Every block's parameters, seeded per block and direction (uniform in +-1/sqrt(H), as init_params)."""
    check_net(net)
    seed = integer(seed, "seed", low=0, high=None)
    out = []
    for k, block in enumerate(net.blocks):
        if not isinstance(block, Layers):
            out.append(None)
            continue
        directions = {}
        for d, direction in enumerate(("forward", "backward") if block.bidirectional else ("forward",)):
            layers = [init_params(network, seed=seed * 1009 + k * 31 + d * 7 + layer, dtype=dtype)[0]
                      for layer, network in enumerate(layer_networks(net, k))]
            directions[direction] = Params(layers)
        directions.setdefault("backward", None)
        out.append(directions)
    return NetParams(out)


def check_net_params(net: Net, params: NetParams) -> None:
    check_net(net)
    if not isinstance(params, NetParams) or len(params.blocks) != len(net.blocks):
        raise BackendError(f"net '{net.name}' has {len(net.blocks)} blocks; the parameters must be a NetParams with "
                           "one entry per block; hint: make them with engine.init_net_params(net)")
    for k, block in enumerate(net.blocks):
        if not isinstance(block, Layers):
            continue
        entry = params.blocks[k]
        wanted = ("forward", "backward") if block.bidirectional else ("forward",)
        for direction in wanted:
            p = entry.get(direction) if isinstance(entry, dict) else None
            if not isinstance(p, Params) or len(p.layers) != block.num_layers:
                raise BackendError(f"net '{net.name}', block {k} ('{block.label}'): parameters for the {direction} "
                                   f"direction must be Params of {block.num_layers} layer(s); hint: make them with "
                                   "engine.init_net_params(net)")
            for layer, network in enumerate(layer_networks(net, k)):
                try:
                    check_params(network, Params([p.layers[layer]]))
                except BackendError as e:
                    raise BackendError(f"net '{net.name}', block {k} ('{block.label}'), {direction} layer {layer}: "
                                       f"{e}") from None
