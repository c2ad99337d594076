"""Networks of blocks (issue #11): cell layers, bidirectional or not, and pooling over time, in sequence.

    net = engine.Net(input_size=512, blocks=(engine.Layers("lstm", 512, num_layers=4), engine.Pool("max", 2, 2),
                                             engine.Layers("lstm", 512, num_layers=4)))
    params = engine.init_net_params(net, seed=0)
    out = engine.run_net(net, params, x)          # x: (T, B, 512) -> out.outputs: (T // 2, B, 512)

A `Network` (engine/network.py) is one block: L stacked layers of one cell, which every backend runs. A `Net` is the
sequence: block k reads what block k-1 produced. `Layers` runs a cell forward, or in both directions
(direction="bidirectional": layer l of the backward direction reads the sequence reversed in time, and the two
directions' outputs are concatenated feature-wise (merge="concat", torch.nn.LSTM(bidirectional=True)) or added
(merge="sum") before layer l + 1 reads them). `Pool` takes the max or mean over a window of time steps, moved by a
stride: T steps become (T - window) // stride + 1. Features pass through a pool unchanged.

Sizes chain: a block's input size is the size the block before it produces (the net's input_size for the first);
a block may state the input size it expects (`input_size=`), and a net whose sizes do not chain is refused naming
the block. JSON (schema "rnn-network", version 1) names a cell by preset or embeds its cell JSON.

`run_net` runs any net block by block through engine.run: on the NumPy reference, or on a GPU backend (each block
one launch sequence of that backend, arrays staying on the GPU between blocks). One wavefront through the pools and
the layers spread over several GPUs (engine/pipeline.py plans the split) build on this spec.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .backends.common import array_module_of
from .errors import BackendError, CellGraphError, CompileError, Problem
from .ir import CellGraph
from .network import Network
from .params import Params, check_params, init_params

NET_SCHEMA = "rnn-network"
NET_VERSION = 1
DIRECTIONS = ("forward", "bidirectional")
MERGES = ("concat", "sum")
POOLS = ("max", "mean")


def _positive(value, what: str, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BackendError(f"{where}: {what} must be a positive integer, got {value!r}")


def check_pool(pool, where: str) -> None:
    """A Pool's fields: op max or mean, window and stride positive integers (BackendError naming `where`)."""
    if not isinstance(pool, Pool):
        raise BackendError(f"{where}: a pool is an engine.Pool(op, window, stride), got {type(pool).__name__}")
    if pool.op not in POOLS:
        raise BackendError(f"{where}: op must be one of {', '.join(POOLS)}, got {pool.op!r}")
    _positive(pool.window, "window", where)
    _positive(pool.stride, "stride", where)


def _resolve_cell(cell) -> CellGraph:
    from .gallery import get
    if isinstance(cell, CellGraph):
        return cell
    if isinstance(cell, str):
        return get(cell).cell                  # unknown names: CellGraphError with the closest presets
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
        object.__setattr__(self, "cell", _resolve_cell(self.cell))

    @property
    def label(self) -> str:
        return self.name or f"{self.cell.name} x{self.num_layers}" + (" (bidirectional)" if self.bidirectional else "")

    @property
    def bidirectional(self) -> bool:
        return self.direction == "bidirectional"

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
        object.__setattr__(self, "blocks", tuple(self.blocks))
        _positive(self.input_size, "input_size", f"net '{self.name}'")
        if not self.blocks:
            raise BackendError(f"net '{self.name}' has no blocks; hint: blocks=(Layers('lstm', 256),)")
        sizes, size = [], self.input_size
        for k, block in enumerate(self.blocks):
            where = f"net '{self.name}', block {k}"
            if isinstance(block, Layers):
                where += f" ('{block.label}')"
                _positive(block.hidden_size, "hidden_size", where)
                _positive(block.num_layers, "num_layers", where)
                if block.direction not in DIRECTIONS:
                    raise BackendError(f"{where}: direction must be one of {', '.join(DIRECTIONS)}, got "
                                       f"{block.direction!r}")
                if block.merge not in MERGES:
                    raise BackendError(f"{where}: merge must be one of {', '.join(MERGES)}, got {block.merge!r}")
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
                raise BackendError(f"{where}: a block is a Layers or a Pool, got {type(block).__name__}")
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


def _layers_shapes(net: Net, k: int) -> list[Network]:
    block = net.blocks[k]
    return [block.layer_network(layer, net.sizes[k]) for layer in range(block.num_layers)]


def init_net_params(net: Net, seed: int = 0, dtype=np.float64) -> NetParams:
    """Every block's parameters, seeded per block and direction (uniform in +-1/sqrt(H), as init_params)."""
    out = []
    for k, block in enumerate(net.blocks):
        if not isinstance(block, Layers):
            out.append(None)
            continue
        directions = {}
        for d, direction in enumerate(("forward", "backward") if block.bidirectional else ("forward",)):
            layers = [init_params(network, seed=seed * 1009 + k * 31 + d * 7 + layer, dtype=dtype)[0]
                      for layer, network in enumerate(_layers_shapes(net, k))]
            directions[direction] = Params(layers)
        directions.setdefault("backward", None)
        out.append(directions)
    return NetParams(out)


def check_net_params(net: Net, params: NetParams) -> None:
    if not isinstance(params, NetParams) or len(params.blocks) != len(net.blocks):
        raise BackendError(f"net '{net.name}' has {len(net.blocks)} blocks; the parameters must be a NetParams with "
                           "one entry per block (init_net_params)")
    for k, block in enumerate(net.blocks):
        if not isinstance(block, Layers):
            continue
        entry = params.blocks[k]
        wanted = ("forward", "backward") if block.bidirectional else ("forward",)
        for direction in wanted:
            p = entry.get(direction) if isinstance(entry, dict) else None
            if not isinstance(p, Params) or len(p.layers) != block.num_layers:
                raise BackendError(f"net '{net.name}', block {k} ('{block.label}'): parameters for the {direction} "
                                   f"direction must be Params of {block.num_layers} layer(s)")
            for layer, network in enumerate(_layers_shapes(net, k)):
                try:
                    check_params(network, Params([p.layers[layer]]))
                except BackendError as e:
                    raise BackendError(f"net '{net.name}', block {k} ('{block.label}'), {direction} layer {layer}: "
                                       f"{e}") from None


# ---- the reference executor ------------------------------------------------------------------------

@dataclass
class NetResult:
    outputs: np.ndarray                 # (T_out, B, output size)
    block_outputs: list = field(default_factory=list)   # what each block produced (None: a block inside a run that
                                                        # fuse_pools made one program, whose output never existed)


def pool_over_time(x, block: Pool):
    """(T, B, F) -> (T', B, F): block.op over windows of block.window steps every block.stride steps (NumPy or
    CuPy arrays alike)."""
    xp = array_module_of(x)
    steps = block.steps_out(x.shape[0])
    if steps <= 0:                              # shorter than a window (the tail of a chunked run): nothing
        return x[:0]
    starts = xp.arange(steps) * block.stride
    windows = x[starts[:, None] + xp.arange(block.window)[None, :]]      # (T', window, B, F): one gather
    return windows.max(axis=1) if block.op == "max" else windows.mean(axis=1)


NET_BACKENDS = ("reference", "auto", "fused", "graph", "persistent")


FUSED_POOL_BACKENDS = ("auto", "graph", "persistent")   # the wavefront schedules' kernels can fold a pool in


@dataclass(frozen=True)
class FusedRun:
    """Blocks first..last (inclusive) of a net run as one wavefront program (fuse_pools=True): one-directional
    Layers blocks of one cell and hidden size with pools between them, and maybe one after the last."""
    first: int
    last: int
    network: Network                       # every layer of the run, stacked
    pools: dict                            # {layer of `network`: Pool}
    layers: tuple                          # (block, layer within it) of each layer of `network`

    @property
    def largest_block(self) -> int:
        """Layers of the run's largest block: the persistent schedule launches that many at a time (the blocks'
        own grouping, where one launch of every layer would stream the weights instead of keeping them on chip)."""
        return max(sum(1 for b, _ in self.layers if b == block) for block, _ in self.layers)

    def tile_config(self, backend: str):
        """The persistent schedule's TileConfig for the run: groups of the largest block keep each group's weights
        resident (DeepSpeech: 2 x 4 layers); where the block sizes do not divide the run (2 + 1 layers), or on the
        graph schedule, None: the tiling chooses, as for any network."""
        L = self.network.num_layers
        if backend != "persistent" or self.largest_block == L or L % self.largest_block:
            return None
        from .schedules.tiling import TileConfig
        return TileConfig(layers_per_launch=self.largest_block)


def fused_runs(net: Net, precision: str = "float32") -> list[FusedRun]:
    """Where fuse_pools=True makes one wavefront program of several blocks: maximal runs of one-directional Layers
    blocks of the same cell, hidden size and no projection, joined by pools (folded into the layer below them,
    kernels/pool.cuh) or directly, plus a pool right after the run. Runs that would be one block with no pool are
    left out (nothing to fuse). Cells whose layer output cannot take a pool (codegen.check_pool_fusable) make none."""
    from .codegen.wavefront import check_pool_fusable
    from .compiler import compile_program
    blocks, runs, k = net.blocks, [], 0

    def joinable(a, b):
        return (isinstance(b, Layers) and not b.bidirectional and b.proj_size is None and b.cell == a.cell
                and b.hidden_size == a.hidden_size)

    while k < len(blocks):
        head = blocks[k]
        if not isinstance(head, Layers) or head.bidirectional or head.proj_size is not None:
            k += 1
            continue
        try:
            program = compile_program(head.cell, layout="interleaved", precision=precision)
        except CompileError:                   # a cell the schedules cannot plan: its blocks run one by one
            k += 1
            continue
        layers, pools, last = [(k, i) for i in range(head.num_layers)], {}, k
        j = k + 1
        while j < len(blocks):
            block = blocks[j]
            if isinstance(block, Pool):
                try:
                    check_pool_fusable(program, block)
                except CompileError:
                    break
                pools[len(layers) - 1], last = block, j
                if j + 1 < len(blocks) and joinable(head, blocks[j + 1]):
                    j += 1                     # a run goes on through the pool
                    continue
                break
            if not joinable(head, block):
                break
            layers += [(j, i) for i in range(block.num_layers)]
            last, j = j, j + 1
        if last > k:
            runs.append(FusedRun(k, last, Network(head.cell, net.sizes[k], head.hidden_size, len(layers)), pools,
                                 tuple(layers)))
        k = last + 1
    return runs


class NetProgram:
    """A net prepared for repeated runs on one backend: one prepared program per Layers block (per layer and
    direction for a bidirectional one), each built on the first run, for the steps and batch that reach it.
    backend: reference (NumPy, float64 by default), auto (the autotuned schedule of each block), fused, graph or
    persistent (float32; CuPy arrays stay on the GPU from block to block).

    fuse_pools=True (graph, persistent, or auto when it picks one of them): runs of one-directional Layers blocks of
    one cell and size, with pools between them (fused_runs), become one wavefront program: each pool is folded into
    the store of the layer below it (kernels/pool.cuh: h_t goes into the pooled sequence, the unpooled one is never
    written) and the layers above start as soon as their pooled input is complete (engine/schedules/steps.py). Off
    by default until the GPU suite has checked it (tests/gpu/test_nets_gpu.py). `fused` says what was joined."""

    def __init__(self, net: Net, params: NetParams, backend: str = "reference", *, dtype=None,
                 precision: str = "float32", fuse_pools: bool = False):
        if backend not in NET_BACKENDS:
            raise BackendError(f"a net runs on one of {', '.join(NET_BACKENDS)}, not {backend!r}")
        if fuse_pools and backend not in FUSED_POOL_BACKENDS:
            raise BackendError(f"fuse_pools=True folds a pool into a wavefront schedule's kernel: backend must be one "
                               f"of {', '.join(FUSED_POOL_BACKENDS)}, not {backend!r}; hint: fuse_pools=False")
        check_net_params(net, params)
        self.net, self.params, self.backend, self.precision = net, params, backend, precision
        self.fuse_pools = fuse_pools
        self.dtype = (np.float64 if backend == "reference" else np.float32) if dtype is None else dtype
        self.programs: dict[tuple, object] = {}
        self.runs = {r.first: r for r in fused_runs(net, precision)} if fuse_pools else {}
        self.fused: dict[int, str] = {}          # first block of a run -> what was joined, or why it was not

    def _run(self, key: tuple, network: Network, params: Params, value, poison: bool = False, pools=None,
             config=None):
        """(outputs, True) of one program: a block, a layer of a bidirectional block, or a fused run with `pools`;
        (None, False) for a fused run the autotuner gave no wavefront schedule (the caller runs its blocks)."""
        if self.backend == "reference":
            from .api import run
            return run(network, params, value, backend="reference", dtype=self.dtype,
                       precision=self.precision).outputs, True
        program = self.programs.get(key)
        if program is None:
            from .schedules import autotune, schedule_class
            if self.backend == "auto":
                choice = autotune.tune(network, params, int(value.shape[0]), int(value.shape[1]),
                                       precision=self.precision)
                candidate = autotune.Candidate(choice.schedule, choice.config)
            else:
                candidate = autotune.Candidate(self.backend, config)
            if pools is not None and candidate.schedule not in FUSED_POOL_BACKENDS:
                self.fused[key[1]] = f"not fused: the autotuner chose backend '{candidate.schedule}'"
                self.programs[key] = False
                return None, False
            if pools is not None:
                program = schedule_class(candidate.schedule)(network, params, config=candidate.config,
                                                             precision=self.precision, pools=pools)
            else:
                program = autotune.prepare(candidate, network, params, precision=self.precision)
            self.programs[key] = program
        if program is False:                     # a run the autotuner did not give a wavefront schedule
            return None, False
        return program.run(value, poison=poison).outputs, True

    def _run_fused(self, run: FusedRun, value, poison: bool):
        params = Params([self.params.blocks[b]["forward"].layers[i] for b, i in run.layers])
        out, done = self._run(("fused", run.first), run.network, params, value, poison, run.pools,
                              run.tile_config(self.backend))
        if done and run.first not in self.fused:
            labels = [f"'{self.net.blocks[b].label}'" for b in range(run.first, run.last + 1)]
            self.fused[run.first] = (f"blocks {run.first}-{run.last} ({', '.join(labels)}) run as one wavefront of "
                                     f"{run.network.num_layers} layers, pools after layers "
                                     f"{', '.join(str(p) for p in run.pools)} folded in")
        return out, done

    def run(self, x, *, poison: bool = False) -> NetResult:
        """Every block in order, zero initial states; pools take the max or mean of the arrays as they are.
        poison=True: each GPU program fills its work buffers with NaN first (tests and the harness). A block that is
        part of a fused run (fuse_pools) has None in block_outputs but the run's last: what it produced never existed."""
        net, params = self.net, self.params
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) != 3 or shape[2] != net.input_size:
            raise BackendError(f"argument 'x' must have shape (T, B, {net.input_size}) for net '{net.name}', got "
                               f"{tuple(shape) if shape is not None else type(x).__name__}")
        net.steps(shape[0])                    # pools that do not fit are refused before any work
        value = x if array_module_of(x) is not np else np.asarray(x)
        produced = []
        k = 0
        while k < len(net.blocks):
            run = self.runs.get(k)
            if run is not None:
                out, done = self._run_fused(run, value, poison)
                if done:
                    value = out
                    produced += [None] * (run.last - run.first) + [value]
                    k = run.last + 1
                    continue
            block = net.blocks[k]
            if isinstance(block, Pool):
                value = pool_over_time(value, block)
            elif not block.bidirectional:          # the whole stack in one program: the backend's own wavefront
                network = Network(block.cell, net.sizes[k], block.hidden_size, block.num_layers, block.proj_size)
                value = self._run((k,), network, params.blocks[k]["forward"], value, poison)[0]
            else:
                for layer, network in enumerate(_layers_shapes(net, k)):
                    xp = array_module_of(value)
                    forward = self._run((k, layer, "forward"), network,
                                        Params([params.blocks[k]["forward"].layers[layer]]), value, poison)[0]
                    backward = self._run((k, layer, "backward"), network,
                                         Params([params.blocks[k]["backward"].layers[layer]]),
                                         xp.ascontiguousarray(value[::-1]), poison)[0][::-1]
                    xp = array_module_of(forward)
                    value = (xp.concatenate([forward, xp.ascontiguousarray(backward)], axis=2)
                             if block.merge == "concat" else forward + backward)
            produced.append(value)
            k += 1
        return NetResult(outputs=value, block_outputs=produced)


def prepare_net(net: Net, params: NetParams, backend: str = "reference", *, dtype=None,
                precision: str = "float32", fuse_pools: bool = False) -> NetProgram:
    return NetProgram(net, params, backend, dtype=dtype, precision=precision, fuse_pools=fuse_pools)


def run_net(net: Net, params: NetParams, x, *, backend: str = "reference", dtype=None,
            precision: str = "float32", fuse_pools: bool = False) -> NetResult:
    """prepare_net(...).run(x): once. Prepare the net yourself to run it many times (the programs are kept)."""
    return NetProgram(net, params, backend, dtype=dtype, precision=precision, fuse_pools=fuse_pools).run(x)


# ---- JSON ------------------------------------------------------------------------------------------

def net_to_dict(net: Net) -> dict:
    from .gallery import presets
    from .serialize import to_dict
    blocks = []
    for block in net.blocks:
        if isinstance(block, Pool):
            entry = {"kind": "pool", "op": block.op, "window": block.window, "stride": block.stride}
        else:
            known = presets().get(block.cell.name)
            cell = block.cell.name if known is not None and known.cell == block.cell else to_dict(block.cell)
            entry = {"kind": "layers", "cell": cell, "hidden_size": block.hidden_size, "num_layers": block.num_layers,
                     "direction": block.direction}
            if block.bidirectional:
                entry["merge"] = block.merge
            for key in ("proj_size", "input_size"):
                if getattr(block, key) is not None:
                    entry[key] = getattr(block, key)
        if block.name:
            entry["name"] = block.name
        blocks.append(entry)
    return {"schema": NET_SCHEMA, "version": NET_VERSION, "name": net.name, "doc": net.doc,
            "input_size": net.input_size, "blocks": blocks}


def net_from_dict(data) -> Net:
    """A Net from its JSON dict. Errors are BackendError / CellGraphError naming the block and field."""
    from .serialize import from_dict
    if not isinstance(data, dict):
        raise BackendError(f"a network is a JSON object, got {type(data).__name__}")
    if data.get("schema") != NET_SCHEMA:
        raise BackendError(f"field 'schema' must be {NET_SCHEMA!r}, got {data.get('schema')!r}; hint: a cell's JSON "
                           "(schema 'rnn-cell-graph') goes in a block's 'cell' field")
    if data.get("version") != NET_VERSION:
        raise BackendError(f"field 'version': this engine reads version {NET_VERSION}, got {data.get('version')!r}")
    raw_blocks = data.get("blocks")
    if not isinstance(raw_blocks, list) or not raw_blocks:
        raise BackendError("field 'blocks' must be a non-empty list of {\"kind\": \"layers\" | \"pool\", ...}")
    blocks = []
    allowed = {"layers": {"kind", "cell", "hidden_size", "num_layers", "direction", "merge", "proj_size",
                          "input_size", "name"},
               "pool": {"kind", "op", "window", "stride", "name"}}
    for k, raw in enumerate(raw_blocks):
        where = f"blocks[{k}]"
        if not isinstance(raw, dict) or raw.get("kind") not in allowed:
            raise BackendError(f"field '{where}.kind' must be 'layers' or 'pool', got "
                               f"{raw.get('kind') if isinstance(raw, dict) else raw!r}")
        unknown = sorted(set(raw) - allowed[raw["kind"]])
        if unknown:
            raise BackendError(f"field '{where}.{unknown[0]}' is not a field of a {raw['kind']} block; hint: "
                               f"{raw['kind']} blocks take {', '.join(sorted(allowed[raw['kind']] - {'kind'}))}")
        if raw["kind"] == "pool":
            blocks.append(Pool(raw.get("op", "max"), raw.get("window", 2), raw.get("stride", 2), raw.get("name", "")))
            continue
        cell = raw.get("cell")
        try:
            cell = from_dict(cell) if isinstance(cell, dict) else _resolve_cell(cell)
        except CellGraphError as e:      # the same findings, placed inside this block's 'cell' field
            raise CellGraphError([Problem(p.message, node=p.node, hint=p.hint,
                                          field=f"{where}.cell" + (f".{p.field}" if p.field and p.field != "preset"
                                                                   else ""))
                                  for p in e.problems]) from None
        if "hidden_size" not in raw:
            raise BackendError(f"field '{where}.hidden_size' is missing; hint: e.g. \"hidden_size\": 512")
        blocks.append(Layers(cell, raw["hidden_size"], raw.get("num_layers", 1), raw.get("direction", "forward"),
                             raw.get("merge", "concat"), raw.get("proj_size"), raw.get("input_size"),
                             raw.get("name", "")))
    return Net(data.get("input_size"), tuple(blocks), str(data.get("name", "net")), str(data.get("doc", "")))


def net_to_json(net: Net) -> str:
    return json.dumps(net_to_dict(net), indent=1)


def net_from_json(text: str) -> Net:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BackendError(f"not JSON: {e}") from None
    return net_from_dict(data)


def load_net(path) -> Net:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise BackendError(f"cannot read network file {str(path)!r}: {e}") from None
    try:
        return net_from_json(text)
    except (BackendError, CellGraphError) as e:
        raise type(e)(f"{path}: {e}") from None


# ---- preset networks -----------------------------------------------------------------------------

def deepspeech(input_size: int = 512, hidden_size: int = 512, layers: int = 4, cell="lstm") -> Net:
    """The seed benchmark's DeepSpeech-style block: `layers` LSTM layers, max-pool over time by 2 (stride 2), `layers`
    more LSTM layers (4, 512 and 512 by default)."""
    first = Layers(cell, hidden_size, layers, name="rnn_a")
    return Net(input_size, (first, Pool("max", 2, 2, name="pool"), Layers(cell, hidden_size, layers, name="rnn_b")),
               name="deepspeech", doc=f"{layers} {first.cell.name} layers, max-pool over time by 2 (stride 2), "
                                      f"{layers} more (the seed benchmark's DeepSpeech block)")


def stack(input_size: int = 1024, hidden_size: int = 1024, layers: int = 16, cell="lstm") -> Net:
    """A deep stack of one cell: `layers` layers (16 LSTM layers of 1024 by default, issue #11's two-GPU case)."""
    block = Layers(cell, hidden_size, layers, name="stack")
    return Net(input_size, (block,), name="stack", doc=f"{layers} {block.cell.name} layers of {hidden_size}")


NET_PRESETS = {"deepspeech": deepspeech, "stack": stack}


def net_preset(name: str, **sizes) -> Net:
    from .gallery import closest_names
    if name not in NET_PRESETS:
        raise BackendError(f"unknown network preset '{name}'; hint: {closest_names(name, NET_PRESETS)}known: "
                           + ", ".join(NET_PRESETS))
    return NET_PRESETS[name](**sizes)
