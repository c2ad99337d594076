"""Pipelining a network's layers over the GPUs of one host (issue #11): the plan, before any GPU is touched.

    plan = plan_pipeline(engine.net_preset("deepspeech"), gpus=2, steps=100, batch=64)
    print(plan.describe())            # which layers on which GPU, the chunk size, the predicted bubble

Model. Every layer (one direction of one layer of a Layers block) is a unit of work; GPU g owns a contiguous run of
units. The sequence flows through the GPUs in time chunks of C steps: GPU g works on chunk k while GPU g + 1 works on
chunk k - 1, so after a fill of N - 1 chunks every GPU is busy. GPU g's work on a chunk is W_g = C * w_g + n_g * o_l +
o_c (w_g: the time one step of its layers takes; n_g: its layers, each of which costs o_l a chunk for its input
projection, its launch and its start-up; o_c: the hand-over). One Python thread issues every GPU's work, at h a
schedule run (a GPU runs one per block it holds a piece of), so a stage takes S = max(max_g W_g, h * sum_g p_g) with
p_g GPU g's pieces, and the run about (K + N - 1) * S with K = ceil(T / C) chunks. The split is the one that balances
max_g w_g (a linear partition, solved exactly by dynamic programming), or that split with its cuts moved to block
boundaries (fewer pieces to issue), whichever predicts less; the chunk is the admissible C (a multiple of the pools'
strides) with the least predicted time. The predicted bubble is the share of GPU time spent idle,
1 - sum_g W_g K / (N (K + N - 1) S).

The model gets the split and the order of magnitude of the chunk right; the chunk's best value also depends on how
the GEMMs of a chunk of B * C rows fall on the GPU (16 LSTM layers, H = 1024, B = 128 on two H200s: 128 ms at C = 8,
141-144 ms at C = 10-20, benchmarks/results/pipeline-20261123-H200x2.md). tune_pipeline() therefore measures: it
runs the plan's chunk, powers of two around it and the split with its cuts moved to block boundaries, and keeps the
fastest, with its measured time and bubble (PipelineProgram.measure: the GPUs' busy time from CUDA events around each
chunk's work, against N x the wall time).

A layer's step costs what engine.bench.flops counts (its matmuls and elementwise ops) at `tflops`; a layer
after a pool of stride s runs T / s steps, so its per-input-step cost is divided by s. A bidirectional layer needs
the whole sequence of the layer below before its backward direction starts: it cannot overlap with the layers on
either side, so a net with one is pipelined in its forward-only stretches only, and the plan says so. Activations
cross GPUs as B x C x F floats per chunk at `link_gbps`, overlapped with compute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .bench.flops import layer_step_flops
from .blocks import Layers, Net, NetResult, Pool
from .errors import BackendError
from .network import Network

DEFAULT_TFLOPS = 30.0          # fp32, the engine on large layers: 16 x LSTM 1024 at B = 128 ran at 31.5 TFLOP/s on an
                               # H200, LSTM 'large' at 30.5 on an H100 (benchmarks/results/)
DEFAULT_CHUNK_OVERHEAD_US = 10.0   # a chunk's hand-over: events, the peer copy's start
DEFAULT_LAYER_OVERHEAD_US = 80.0   # a layer's cost per chunk beyond its steps: 40-130 us measured on an H200 (the one-GPU
                                   # run of 16 x LSTM 1024 in chunks of 2-20 steps against the run in one piece)
DEFAULT_HOST_US_PER_RUN = 700.0   # the host time of one schedule run (one piece of a GPU's chunk): 0.53-0.83 ms on
                                   # an H200 host (benchmarks/profile_host.py); one Python thread issues every GPU's
DEFAULT_HOST_US_PER_REPLAY = 60.0  # the host time of one GPU's chunk replayed from CUDA graphs (chunk_replay.py):
                                   # a copy in, two or three events, a graph launch; an estimate (DeepSpeech on two
                                   # H200s: 5.9 ms replayed against 7.0-7.8 issued run by run)
DEFAULT_LINK_GBPS = 300.0      # NVLink between two GPUs of one host, one direction, order of magnitude


@dataclass(frozen=True)
class Unit:
    """One layer of the net: block k, layer l (of one direction), what one step of it costs."""

    block: int
    layer: int
    label: str
    step_flops: float          # per step of the net's input (divided by the stride of the pools before it)
    out_features: int
    bidirectional: bool


@dataclass
class PipelinePlan:
    net: Net
    gpus: int
    steps: int
    batch: int
    units: list[Unit]
    split: list[list[int]]                       # unit indices per GPU, contiguous
    chunk: int
    per_gpu_step_us: list[float]
    chunk_overhead_us: float
    transfer_us_per_chunk: list[float]           # the hand-over after each GPU but the last
    predicted_ms: float
    one_gpu_ms: float
    bubble: float
    notes: list[str] = field(default_factory=list)
    measured: "PipelineMeasurement | None" = None  # set by tune_pipeline (or by the caller from measure())
    chunk_work_us: list[float] = field(default_factory=list)   # W_g: GPU g's predicted work on one full chunk
    stage_us: float = 0.0                                        # S: a stage of the pipeline, predicted

    def timeline(self) -> list[dict]:
        """The predicted schedule, one event a GPU and chunk: GPU g works on chunk k from (k + g) * S for W_g
        (a shorter last chunk for its fewer steps). {"lane": "GPU g", "chunk": k, "steps": (first, last + 1),
        "start_ms", "end_ms"}, in start order."""
        events = []
        starts = list(range(0, self.steps, self.chunk))
        for k, first in enumerate(starts):
            count = min(self.chunk, self.steps - first)
            for g, work in enumerate(self.chunk_work_us):
                # the fixed part of W_g stays, the per-step part shrinks with a tail chunk's steps
                us = work - (self.chunk - count) * self.per_gpu_step_us[g]
                start = (k + g) * self.stage_us
                events.append({"lane": f"GPU {g}", "chunk": k, "steps": (first, first + count),
                               "start_ms": start / 1e3, "end_ms": (start + us) / 1e3})
        return sorted(events, key=lambda e: (e["start_ms"], e["lane"]))

    @property
    def predicted_speedup(self) -> float:
        return self.one_gpu_ms / self.predicted_ms if self.predicted_ms else float("nan")

    def as_dict(self) -> dict:
        return {"net": self.net.name, "gpus": self.gpus, "steps": self.steps, "batch": self.batch,
                "chunk_steps": self.chunk, "split": [[self.units[u].label for u in g] for g in self.split],
                "per_gpu_step_us": self.per_gpu_step_us, "transfer_us_per_chunk": self.transfer_us_per_chunk,
                "predicted_ms": self.predicted_ms, "one_gpu_ms": self.one_gpu_ms, "bubble": self.bubble,
                "predicted_speedup": self.predicted_speedup, "notes": self.notes,
                "measured": None if self.measured is None else self.measured.as_dict()}

    def describe(self) -> str:
        lines = [f"net '{self.net.name}' on {self.gpus} GPU(s), T={self.steps}, B={self.batch}: chunks of "
                 f"{self.chunk} step(s), predicted {self.predicted_ms:.2f} ms against {self.one_gpu_ms:.2f} ms on one "
                 f"GPU ({self.predicted_speedup:.2f}x), bubble {100 * self.bubble:.0f}%"]
        for g, units in enumerate(self.split):
            names = ", ".join(self.units[u].label for u in units)
            hand = (f"; hands {self.transfer_us_per_chunk[g]:.1f} us of activations a chunk to GPU {g + 1}"
                    if g < len(self.transfer_us_per_chunk) else "")
            lines.append(f"  GPU {g}: {names} ({self.per_gpu_step_us[g]:.1f} us a step{hand})")
        if self.measured is not None:
            lines.append("  measured: " + self.measured.describe())
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class PipelineMeasurement:
    """A pipelined run timed on its GPUs: the wall time of a whole forward (median), each GPU's busy time (the sum
    over its chunks of the time from its input being ready to its work being done, CUDA events) and the bubble,
    1 - sum(busy) / (N * wall). one_gpu_ms: the net run in one piece on one GPU, where measured."""

    ms: float
    busy_ms: list[float]
    repeats: int
    one_gpu_ms: float | None = None

    @property
    def bubble(self) -> float:
        return 1.0 - sum(self.busy_ms) / (len(self.busy_ms) * self.ms)

    def as_dict(self) -> dict:
        return {"ms": self.ms, "busy_ms": self.busy_ms, "bubble": self.bubble, "repeats": self.repeats,
                "one_gpu_ms": self.one_gpu_ms}

    def describe(self) -> str:
        busy = ", ".join(f"GPU {g} {ms:.2f}" for g, ms in enumerate(self.busy_ms))
        one = "" if self.one_gpu_ms is None else (f", {self.one_gpu_ms / self.ms:.2f}x the one-GPU run's "
                                                  f"{self.one_gpu_ms:.2f} ms")
        return (f"{self.ms:.2f} ms (median of {self.repeats}{one}), bubble {100 * self.bubble:.0f}% "
                f"(busy ms: {busy})")


def units_of(net: Net, batch: int) -> list[Unit]:
    units, stride = [], 1
    for k, block in enumerate(net.blocks):
        if isinstance(block, Pool):
            stride *= block.stride
            continue
        for layer in range(block.num_layers):
            network: Network = block.layer_network(layer, net.sizes[k])
            flops = float(layer_step_flops(block.cell, network.input_size, network.hidden_size, batch,
                                           network.proj_size)["total"])
            directions = 2 if block.bidirectional else 1
            label = f"{block.label}[{layer}]"
            units.append(Unit(k, layer, label, directions * flops / stride, block.output_size, block.bidirectional))
    return units


def _linear_partition(costs: list[float], parts: int) -> list[list[int]]:
    """Contiguous split of `costs` into `parts` non-empty runs minimising the largest sum (exact DP)."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for p in range(1, parts + 1):
        for i in range(p, n + 1):
            for j in range(p - 1, i):
                value = max(best[p - 1][j], prefix[i] - prefix[j])
                if value < best[p][i]:
                    best[p][i], cut[p][i] = value, j
    runs, i = [], n
    for p in range(parts, 0, -1):
        j = cut[p][i]
        runs.append(list(range(j, i)))
        i = j
    return runs[::-1]


def _at_block_boundaries(units: list[Unit], runs: list[list[int]]) -> list[list[int]] | None:
    """runs with each cut between GPUs moved to the nearest start of a block; None if that changes nothing or
    leaves a GPU without layers."""
    starts = [u for u in range(1, len(units)) if units[u].block != units[u - 1].block]
    if not starts:
        return None
    cuts, at = [], 0
    for run in runs[:-1]:
        at += len(run)
        cuts.append(min(starts, key=lambda b: (abs(b - at), b)))
    bounds = [0] + cuts + [len(units)]
    moved = [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
    if any(not run for run in moved) or moved == [list(run) for run in runs]:
        return None
    return moved


def plan_pipeline(net: Net, gpus: int, steps: int, batch: int, *, split: list[int] | None = None,
                  chunk: int | None = None, tflops: float = DEFAULT_TFLOPS,
                  chunk_overhead_us: float = DEFAULT_CHUNK_OVERHEAD_US,
                  layer_overhead_us: float = DEFAULT_LAYER_OVERHEAD_US,
                  host_us_per_run: float = DEFAULT_HOST_US_PER_RUN, link_gbps: float = DEFAULT_LINK_GBPS,
                  available: int | None = None, replay: bool = True,
                  host_us_per_replay: float = DEFAULT_HOST_US_PER_REPLAY) -> PipelinePlan:
    """The split of net's layers over `gpus` GPUs and the chunk size (see the module docstring). split: layers per
    GPU, in order (else chosen); chunk: steps per chunk (else chosen); available: GPUs present (checked). replay: the
    host issues a GPU's chunk as one graph launch (PipelineProgram's default, host_us_per_replay each) rather than a
    schedule run per piece (host_us_per_run each)."""
    for name, value in (("gpus", gpus), ("steps", steps), ("batch", batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BackendError(f"{name} must be a positive integer, got {value!r}")
    if available is not None and gpus > available:
        raise BackendError(f"{gpus} GPUs asked for, but this host has {available}; hint: gpus={available} or fewer")
    net.steps(steps)                                   # pools that do not fit are refused, naming the block
    units = units_of(net, batch)
    if gpus > len(units):
        raise BackendError(f"net '{net.name}' has {len(units)} layer(s), so {gpus} GPUs would leave "
                           f"{gpus - len(units)} without work; hint: gpus={len(units)} or fewer")
    step_us = [u.step_flops / (tflops * 1e12) * 1e6 for u in units]
    if split is not None:
        if (not isinstance(split, (list, tuple)) or len(split) != gpus
                or any(not isinstance(s, int) or isinstance(s, bool) for s in split)):
            raise BackendError(f"split must list the number of layers of each of the {gpus} GPUs, got {split!r}")
        empty = [g for g, s in enumerate(split) if s < 1]
        if empty:
            raise BackendError(f"split {list(split)} leaves GPU {empty[0]} without layers; hint: every GPU takes at "
                               "least one layer")
        if sum(split) != len(units):
            raise BackendError(f"split {list(split)} places {sum(split)} layers, but net '{net.name}' has "
                               f"{len(units)}: " + ", ".join(u.label for u in units))
        runs, start = [], 0
        for n in split:
            runs.append(list(range(start, start + n)))
            start += n
    notes = []
    if any(u.bidirectional for u in units) and gpus > 1:
        notes.append("a bidirectional layer needs the whole sequence of the layer below before its backward "
                     "direction starts: the GPUs on either side of it do not overlap, so the prediction is optimistic")
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise BackendError(f"chunk must be a positive integer, got {chunk!r}")

    def timing(runs: list[list[int]], c: int):
        per_gpu = [sum(step_us[u] for u in run) for run in runs]
        chunks = math.ceil(steps / c)
        transfer = [batch * c * units[run[-1]].out_features * 4 / (link_gbps * 1e9) * 1e6 for run in runs[:-1]]
        work = [c * w + len(run) * layer_overhead_us + chunk_overhead_us for w, run in zip(per_gpu, runs)]
        issue = (len(runs) * host_us_per_replay if replay     # one thread issues all
                 else sum(len({units[u].block for u in run}) for run in runs) * host_us_per_run)
        stage = max(max(work), max(transfer, default=0.0), issue if gpus > 1 else 0.0)
        return (chunks + gpus - 1) * stage, per_gpu, chunks, transfer, work

    def best_chunk(runs: list[list[int]]) -> int:
        if chunk is not None:
            return chunk_steps(net, steps, chunk)[0]
        if gpus == 1:
            return steps
        admissible = sorted({chunk_steps(net, steps, c)[0] for c in range(1, steps + 1)})
        return min(admissible, key=lambda c: (timing(runs, c)[0], c))

    if split is None:                  # the FLOP-balanced split, or its cuts moved to block boundaries if that is faster
        candidates = [_linear_partition(step_us, gpus)]
        moved = _at_block_boundaries(units, candidates[0])
        if moved is not None:
            candidates.append(moved)
        scored = [(r, best_chunk(r)) for r in candidates]
        runs, chosen = min(scored, key=lambda rc: timing(*rc)[0])
    else:
        chosen = best_chunk(runs)
    chunk, why = chunk_steps(net, steps, chosen)   # whole pool windows per chunk; one chunk where it cannot cut
    if why and gpus > 1:
        notes.append(why)
    predicted_us, per_gpu, chunks, transfer, chunk_work = timing(runs, chunk)
    one_gpu_us = steps * sum(step_us) + len(units) * layer_overhead_us + chunk_overhead_us   # in one go
    bubble = 1.0 - sum(chunk_work) * chunks / (gpus * predicted_us)
    return PipelinePlan(net, gpus, steps, batch, units, runs, chunk, per_gpu, chunk_overhead_us, transfer,
                        predicted_us / 1e3, one_gpu_us / 1e3, bubble, notes, chunk_work_us=chunk_work,
                        stage_us=predicted_us / (chunks + gpus - 1))


def layers_net(network: Network) -> Net:
    """A Network (one cell, L layers) as a Net of one Layers block, for planning."""
    return Net(network.input_size, (Layers(network.cell, network.hidden_size, network.num_layers,
                                           proj_size=network.proj_size),), name=network.cell.name)


# ---- running a plan ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Piece:
    """What one GPU runs of one block: layers [first, last) of a Layers block, or a whole Pool block."""

    block: int
    first: int = 0
    last: int = 0

    def is_pool(self, net: Net) -> bool:
        return isinstance(net.blocks[self.block], Pool)


def pieces_of(plan: PipelinePlan) -> list[list[Piece]]:
    """Each GPU's pieces, in order. A pool goes with the GPU that produces its input (it hands over the pooled,
    smaller sequence); a pool before any layer goes with the first GPU."""
    net = plan.net
    owner = {}                                   # (block, layer) -> GPU
    for g, run in enumerate(plan.split):
        for u in run:
            owner[(plan.units[u].block, plan.units[u].layer)] = g
    out: list[list[Piece]] = [[] for _ in plan.split]
    last_gpu = 0
    for k, block in enumerate(net.blocks):
        if isinstance(block, Pool):
            out[last_gpu].append(Piece(k))
            continue
        layer = 0
        while layer < block.num_layers:
            g = owner[(k, layer)]
            end = layer
            while end < block.num_layers and owner[(k, end)] == g:
                end += 1
            out[g].append(Piece(k, layer, end))
            last_gpu, layer = g, end
    return out


def chunk_steps(net: Net, steps: int, chunk: int) -> tuple[int, str | None]:
    """The chunk the net can take: a multiple of the product of its pools' strides (so that every chunk boundary is a
    pool window boundary), or the whole sequence when a pool's windows overlap or a layer is bidirectional."""
    pools = [b for b in net.blocks if isinstance(b, Pool)]
    if any(isinstance(b, Layers) and b.bidirectional for b in net.blocks):
        return steps, "a bidirectional layer reads the whole sequence: one chunk"
    if any(p.window != p.stride for p in pools):
        return steps, "a pool whose windows overlap (window != stride) cannot be cut into chunks: one chunk"
    stride = math.prod(p.stride for p in pools)
    return min(steps, max(stride, chunk // stride * stride)), None


def gpu_fused_runs(plan: PipelinePlan, precision: str = "float32") -> tuple[dict, dict]:
    """({GPU: (FusedRun, [(block, layer) of the net for each layer of the run])}, {GPU: why not}) for
    PipelineProgram(fuse_pools=True): a GPU whose pieces (layers of blocks of one cell and size, pools between or
    after them) make one wavefront program (engine.blocks.fused_runs over the GPU's pieces as a net of their own) runs
    each chunk as that one program, pools folded in: one run for the host to issue instead of one per piece. A GPU
    with one piece and no pool has nothing to fuse; a net whose length is not a multiple of its pools' strides would
    leave a tail chunk a pool cannot take whole, so no GPU fuses."""
    from .blocks import fused_runs
    net = plan.net
    stride = math.prod(b.stride for b in net.blocks if isinstance(b, Pool))
    fused, why = {}, {}
    for g, pieces in enumerate(pieces_of(plan)):
        if plan.steps % stride:
            why[g] = (f"T={plan.steps} is not a multiple of the pools' stride {stride}: the last chunk would end inside "
                      "a pool window")
            continue
        if len(pieces) < 2:
            why[g] = "one piece: nothing to fuse"
            continue
        blocks, origin = [], []
        for piece in pieces:
            block = net.blocks[piece.block]
            if piece.is_pool(net):
                blocks.append(block)
                origin.append(None)
            else:
                blocks.append(Layers(block.cell, block.hidden_size, piece.last - piece.first, block.direction,
                                     block.merge, block.proj_size, name=f"{block.label}[{piece.first}:{piece.last}]"))
                origin.append(piece)
        first = pieces[0]
        size = (net.sizes[first.block] if first.is_pool(net)
                else net.blocks[first.block].layer_input_size(first.first, net.sizes[first.block]))
        runs = fused_runs(Net(size, tuple(blocks), name=f"{net.name}@GPU{g}"), precision)
        if len(runs) != 1 or runs[0].first != 0 or runs[0].last != len(blocks) - 1:
            why[g] = "its pieces are not one run of blocks of one cell and size (engine.blocks.fused_runs)"
            continue
        run = runs[0]
        layers = [(origin[b].block, origin[b].first + i) for b, i in run.layers]
        fused[g] = (run, layers)
    return fused, why


class PipelineProgram:
    """A net run over the GPUs of a PipelinePlan: GPU g runs its pieces on time chunk c while GPU g + 1 runs chunk
    c - 1 (launches issued diagonal by diagonal, each GPU on its own device, so they overlap), the states of every
    layer carried from chunk to chunk. backend: 'reference' runs the same schedule on the CPU, one "GPU" after the
    other, which is how the chunking, the carried states and the pools across chunk boundaries are tested without
    GPUs; a GPU backend (fused, graph, persistent) runs GPU g's pieces on device devices[g].

    fuse_pools=True (graph or persistent): a GPU whose pieces make one wavefront program with its pools folded in
    (gpu_fused_runs) runs each chunk as that program, one run for the host to issue; `fused` says which GPUs do and
    why the others do not. Off by default (measured 2026-11-23 on two H200s: no faster, benchmarks/NOTES.md).

    replay=True (graph or persistent): each GPU's work on a chunk is captured once into CUDA graphs on fixed buffers
    (engine/chunk_replay.py) and replayed, so the host issues a graph launch and a copy a chunk instead of every CuPy
    call of the schedule runs; a GPU whose chunk cannot be captured (a cuBLAS call in it) runs its chunks directly,
    and `replayed` says which GPUs replay and why the others do not."""

    def __init__(self, net: Net, params, plan: PipelinePlan, backend: str = "reference", devices=None, *,
                 fuse_pools: bool = False, replay: bool = True):
        from .blocks import check_net_params
        check_net_params(net, params)
        if plan.net != net:
            raise BackendError("the pipeline plan was made for another net; hint: plan_pipeline(net, ...) first")
        if fuse_pools and backend not in ("graph", "persistent"):
            raise BackendError(f"fuse_pools=True folds the pools into a wavefront schedule's kernel: backend must be "
                               f"'graph' or 'persistent', not {backend!r}; hint: fuse_pools=False")
        self.net, self.params, self.plan, self.backend = net, params, plan, backend
        self.pieces = pieces_of(plan)
        self.fused_runs, self.fused = {}, {}
        if fuse_pools:
            self.fused_runs, why = gpu_fused_runs(plan)
            for g in range(plan.gpus):
                if g not in self.fused_runs:
                    self.fused[g] = f"not fused: {why[g]}"
                    continue
                run = self.fused_runs[g][0]
                self.fused[g] = (f"{', '.join(self._piece_label(p) for p in self.pieces[g])} run as one wavefront of "
                                 f"{run.network.num_layers} layers, pools after layers "
                                 f"{', '.join(str(layer) for layer in run.pools)} folded in")
        if backend != "reference":
            import cupy
            present = cupy.cuda.runtime.getDeviceCount()
            devices = list(range(plan.gpus)) if devices is None else list(devices)
            if len(devices) != plan.gpus or any(not 0 <= d < present for d in devices):
                raise BackendError(f"devices {devices} do not name {plan.gpus} of the {present} GPU(s) of this host")
        self.devices = devices
        self.programs: dict = {}
        self.replay = replay and backend in ("graph", "persistent")
        self.replays: dict = {}                    # (GPU, chunk length) -> ChunkReplay
        self.carry: dict = {}                      # GPU -> the states its replays carry from chunk to chunk
        self.direct: set = set() if self.replay else set(range(plan.gpus))   # GPUs that run their chunks directly
        self.replayed: dict = {g: ("replayed: one CUDA graph launch a chunk" if self.replay else
                                   f"not replayed: backend '{backend}'" + ("" if replay else ", replay=False"))
                               for g in range(plan.gpus)}

    def _piece_label(self, piece: Piece) -> str:
        block = self.net.blocks[piece.block]
        return block.label if piece.is_pool(self.net) else f"{block.label}[{piece.first}:{piece.last}]"

    def _fused(self, g: int, value, states):
        """GPU g's chunk as its one fused program (gpu_fused_runs): outputs, final states of all its layers."""
        from .params import Params
        from .schedules import schedule_class
        run, layers = self.fused_runs[g]
        key = (g, "fused", value.shape[0])
        if key not in self.programs:
            params = Params([self.params.blocks[b]["forward"].layers[i] for b, i in layers])
            self.programs[key] = schedule_class(self.backend)(run.network, params,
                                                              config=run.tile_config(self.backend), pools=run.pools)
        result = self.programs[key].run(value, states)
        return result.outputs, result.final_states

    def _network(self, piece: Piece) -> Network:
        block = self.net.blocks[piece.block]
        return Network(block.cell, block.layer_input_size(piece.first, self.net.sizes[piece.block]),
                       block.hidden_size, piece.last - piece.first, block.proj_size)

    def _layers(self, g: int, piece: Piece, value, states):
        from .api import run
        from .params import Params
        block = self.net.blocks[piece.block]
        if block.bidirectional:                    # the whole sequence in one chunk (chunk_steps): no states to carry
            return self._bidirectional(g, piece, value), None
        network = self._network(piece)
        params = Params(self.params.blocks[piece.block]["forward"].layers[piece.first:piece.last])
        if self.backend == "reference":
            result = run(network, params, value, states, backend="reference", dtype=np.float64)
        else:
            from .schedules import autotune
            key = (g, piece, value.shape[0])       # a program per chunk length: a shorter tail chunk does not
            if key not in self.programs:           # make the full chunks' program rebuild its buffers each run
                self.programs[key] = autotune.prepare(autotune.Candidate(self.backend, None), network, params)
            result = self.programs[key].run(value, states)
        return result.outputs, result.final_states

    def _bidirectional(self, g: int, piece: Piece, value):
        """Layers [first, last) of a bidirectional block, as a net of their own (engine.blocks.NetProgram)."""
        from .blocks import NetParams, NetProgram
        from .params import Params
        key = (g, piece, "bidirectional")
        if key not in self.programs:
            block = self.net.blocks[piece.block]
            sub = Net(block.layer_input_size(piece.first, self.net.sizes[piece.block]),
                      (Layers(block.cell, block.hidden_size, piece.last - piece.first, "bidirectional", block.merge,
                              block.proj_size),), name=f"{self.net.name}[{piece.block}]")
            entry = self.params.blocks[piece.block]
            params = NetParams([{d: Params(entry[d].layers[piece.first:piece.last]) for d in ("forward", "backward")}])
            self.programs[key] = NetProgram(sub, params, self.backend)
        return self.programs[key].run(value).outputs

    def _chunk(self, g: int, value, states: dict):
        """GPU g's work on one chunk: its one fused program, or its pieces in order. Returns what it hands on and the
        final states of its pieces ({(GPU, piece): states}; states: those of the chunk before, or {} at the start)."""
        from .blocks import pool_over_time
        if g in self.fused_runs:
            value, final = self._fused(g, value, states.get((g, "fused")))
            return value, {(g, "fused"): final}
        out = {}
        for piece in self.pieces[g]:
            if value.shape[0] == 0:                # a tail chunk shorter than the pools' stride: no steps left
                break
            if piece.is_pool(self.net):
                value = pool_over_time(value, self.net.blocks[piece.block])
            else:
                value, out[(g, piece)] = self._layers(g, piece, value, states.get((g, piece)))
        return value, out

    def run(self, x, *, timing: bool = False) -> NetResult:
        """The net on x, chunk by chunk over the GPUs (asynchronous on GPUs: the outputs are ready when the last GPU's
        stream is). timing=True records CUDA events around each GPU's work on each chunk (for measure()).

        Chunks go in diagonals (chunk c on GPU g in diagonal c + g), and within a diagonal the GPUs are issued last
        first: a replayed chunk (replay=True) reads its input from, and writes its outputs to, its graphs' fixed
        buffers, so GPU g + 1 copies in chunk c - 1 (GPU g's outputs) before GPU g's stream, waiting on that copy,
        overwrites them with chunk c. A GPU that runs its chunks directly gets each chunk in a fresh array."""
        net, plan = self.net, self.plan
        steps = x.shape[0]
        if steps != plan.steps or x.shape[1] != plan.batch:
            raise BackendError(f"the pipeline plan is for T={plan.steps}, B={plan.batch}; x has shape {tuple(x.shape)}")
        on_gpus = self.backend != "reference"
        chunk, _ = chunk_steps(net, steps, plan.chunk)
        starts = list(range(0, steps, chunk))
        states: dict = {}                          # (GPU, piece) -> final states of the previous chunk (run directly)
        handed: dict = {}                          # (GPU, chunk) -> (what GPU hands GPU + 1, event after it)
        copied: dict = {}                          # GPU -> event after its copy of its latest input
        self._sources = []                         # handed chunks, alive until the copies of them are done
        self._spans = [] if timing and on_gpus else None   # (GPU, start event, end event)
        outputs = []
        gpus = len(self.pieces)
        for diagonal in range(len(starts) + gpus - 1):
            for g in reversed(range(gpus)):
                c = diagonal - g
                if not 0 <= c < len(starts):
                    continue
                value, ready = (x[starts[c]:starts[c] + chunk], None) if g == 0 else handed.pop((g - 1, c))
                with self._device(g):
                    replay = self._replay_for(g, value) if value.shape[0] else None
                    if replay is None:
                        value = self._on_device(value, ready)
                        copied[g] = self._record()
                    else:
                        import cupy
                        stream = cupy.cuda.get_current_stream()
                        if ready is not None:
                            stream.wait_event(ready)
                        self._copy_into(replay.x, value)
                        copied[g] = self._record()
                        if g + 1 in copied and c > 0:  # GPU g + 1 has copied in chunk c - 1: its buffer is free
                            stream.wait_event(copied[g + 1])
                    began = self._record(timing=True) if self._spans is not None else None
                    if replay is not None:
                        value = replay.launch(first=c == 0)
                        if c == 0:
                            states.update(self.carry[g])
                        if g == gpus - 1:
                            value = value.copy()           # the graph's output buffer is rewritten by the next chunk
                    elif value.shape[0]:
                        value, final = self._chunk(g, value, states)
                        states.update(final)
                    ready = self._record(timing=began is not None)
                    if began is not None:
                        self._spans.append((g, began, ready))
                if g == gpus - 1:
                    outputs.append(value)
                else:
                    handed[(g, c)] = (value, ready)
        if not on_gpus:
            return NetResult(outputs=np.concatenate(outputs, axis=0))
        import cupy
        self._release_sources()
        with cupy.cuda.Device(self.devices[-1]):
            return NetResult(outputs=cupy.concatenate(outputs, axis=0))

    def _replay_for(self, g: int, value):
        """GPU g's ChunkReplay for chunks of value's length (captured on first use), or None where GPU g runs its
        chunks directly (a capture of its chunk failed once: `replayed[g]` says why)."""
        if g in self.direct:
            return None
        import cupy

        from .chunk_replay import CaptureError, ChunkReplay
        key = (g, int(value.shape[0]))
        if key not in self.replays:
            carry = self.carry.setdefault(g, {})
            try:
                replay = ChunkReplay(cupy, lambda v, s: self._chunk(g, v, s), (key[1], *value.shape[1:]), carry)
            except CaptureError as e:
                self.direct.add(g)
                self.replayed[g] = f"not replayed: its chunk could not be captured ({e}); run directly"
                return None
            self.replays[key] = replay
        return self.replays[key]

    def _copy_into(self, target, value) -> None:
        """target (a replay's input buffer on the current GPU) = value, from this GPU or by a peer copy."""
        import cupy
        if not isinstance(value, cupy.ndarray):
            target[...] = cupy.asarray(value, dtype=cupy.float32)
            return
        if value.device.id == cupy.cuda.Device().id:
            target[...] = value
        else:
            self._peer_copy(target, value)

    def _release_sources(self) -> None:
        """A handed chunk lives in the memory pool of the GPU that wrote it, which knows nothing of the copy another
        GPU's stream makes of it: every GPU's stream waits for the copies made by the others before the chunks go
        back to their pools, so that no later kernel of this or the next run reuses a chunk's memory early."""
        import cupy
        if not self._sources:
            return
        done = []
        for d in sorted(set(self.devices)):
            with cupy.cuda.Device(d):
                done.append(self._record())
        for d in sorted(set(self.devices)):
            with cupy.cuda.Device(d):
                stream = cupy.cuda.get_current_stream()
                for event in done:
                    stream.wait_event(event)
        self._sources = []

    def _device(self, g: int):
        if self.backend == "reference":
            import contextlib
            return contextlib.nullcontext()
        import cupy
        return cupy.cuda.Device(self.devices[g])

    def measure(self, x, *, warmup: int = 2, repeats: int = 5) -> PipelineMeasurement:
        """Time whole forwards on x: the wall time from all GPUs idle to all GPUs done (median of `repeats` after
        `warmup` runs), and each GPU's busy time in the median run (CUDA events around its work on each chunk, from
        its input being ready to its last kernel being done)."""
        import time

        import cupy
        if self.backend == "reference":
            raise BackendError("measure() times the pipeline on GPUs; the 'reference' backend runs on the CPU; hint: "
                               "backend='persistent' or 'graph'")
        for name, value in (("warmup", warmup), ("repeats", repeats)):
            if not isinstance(value, int) or value < (0 if name == "warmup" else 1):
                raise BackendError(f"{name} must be a {'non-negative' if name == 'warmup' else 'positive'} integer, "
                                   f"got {value!r}")
        for _ in range(warmup):
            self.run(x)
        samples = []
        for _ in range(repeats):
            self._synchronize()
            start = time.perf_counter()
            self.run(x, timing=True)
            self._synchronize()
            wall = (time.perf_counter() - start) * 1e3
            busy = [0.0] * len(self.pieces)
            for g, began, ended in self._spans:
                busy[g] += cupy.cuda.get_elapsed_time(began, ended)
            samples.append((wall, busy))
        self._spans = None
        samples.sort(key=lambda sample: sample[0])
        wall, busy = samples[len(samples) // 2]
        return PipelineMeasurement(wall, busy, repeats)

    def _synchronize(self) -> None:
        synchronize(self.devices)

    def _record(self, timing: bool = False):
        """An event after GPU g's work on a chunk (on its current stream), for the next GPU to wait on."""
        if self.backend == "reference":
            return None
        import cupy
        event = cupy.cuda.Event(disable_timing=not timing)
        event.record()
        return event

    def _on_device(self, value, ready=None):
        """The chunk on the current GPU: as it is when it is already there, else a peer copy on this GPU's stream,
        after the event that says the GPU before has written it."""
        if self.backend == "reference":
            return value
        import cupy
        if not isinstance(value, cupy.ndarray):
            return cupy.asarray(value, dtype=cupy.float32)
        stream = cupy.cuda.get_current_stream()
        if ready is not None:
            stream.wait_event(ready)
        if value.device.id == cupy.cuda.Device().id:
            return value
        out = cupy.empty(value.shape, dtype=value.dtype)
        self._peer_copy(out, value)
        return out

    def _peer_copy(self, target, value) -> None:
        """target (on the current GPU) = value (on another), on the current stream; value kept alive until the copy
        is done (_release_sources)."""
        import cupy
        here = cupy.cuda.Device().id
        if not value.flags.c_contiguous:
            with cupy.cuda.Device(value.device.id):
                value = cupy.ascontiguousarray(value)
        self._enable_peer_access(value.device.id, here)
        self._sources.append(value)
        cupy.cuda.runtime.memcpyPeerAsync(target.data.ptr, here, value.data.ptr, value.device.id, value.nbytes,
                                          cupy.cuda.get_current_stream().ptr)

    _peers: set = set()                            # (from, to) pairs with peer access enabled, process-wide

    @classmethod
    def _enable_peer_access(cls, source: int, here: int) -> None:
        """Direct copies over NVLink / PCIe from `source` to `here` where the GPUs can reach each other (without
        peer access the driver stages a peer copy through host memory, which is correct but slow)."""
        import cupy
        if (source, here) in cls._peers:
            return
        cls._peers.add((source, here))
        if cupy.cuda.runtime.deviceCanAccessPeer(here, source):
            try:
                cupy.cuda.runtime.deviceEnablePeerAccess(source)      # from the current device (here) to source
            except cupy.cuda.runtime.CUDARuntimeError as e:
                if "PeerAccessAlreadyEnabled" not in str(e) and "ALREADY_ENABLED" not in str(e).upper():
                    raise


def synchronize(devices) -> None:
    """Wait for the current stream of each of these GPUs."""
    import cupy
    for d in sorted(set(devices)):
        with cupy.cuda.Device(d):
            cupy.cuda.get_current_stream().synchronize()


def wall_ms(fn, devices=(0,), *, warmup: int = 2, repeats: int = 5) -> float:
    """The median wall time of fn() in ms, from the GPUs `devices` idle to them done, after `warmup` calls: how
    PipelineProgram.measure times a pipelined forward, for the one-GPU run it is read against."""
    import time
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        synchronize(devices)
        start = time.perf_counter()
        fn()
        synchronize(devices)
        samples.append((time.perf_counter() - start) * 1e3)
    return sorted(samples)[len(samples) // 2]


# ---- measuring the chunk and the split -----------------------------------------------------------------------

def block_boundary_split(plan: PipelinePlan) -> list[int] | None:
    """The plan's split with each cut moved to the nearest boundary between blocks (a GPU then runs whole blocks, so
    fewer pieces a chunk: DeepSpeech's [3, 5] becomes [4, 4]); None where it is the same or would empty a GPU."""
    runs = _at_block_boundaries(plan.units, plan.split)
    return None if runs is None else [len(run) for run in runs]


PIPELINE_CACHE = "pipelines.json"      # beside the schedules' autotune.json (engine/schedules/autotune.py)


def tuned_key(net: Net, gpus: int, steps: int, batch: int, backend: str, fuse_pools: bool, device: str) -> str:
    import hashlib
    from .blocks import net_to_json
    digest = hashlib.sha256(net_to_json(net).encode()).hexdigest()[:16]
    return f"{net.name}|{digest}|gpus{gpus}|T{steps}|B{batch}|{backend}|fuse{int(fuse_pools)}|{device}"


def tuned_plan(net: Net, gpus: int, steps: int, batch: int, *, backend: str = "persistent", fuse_pools: bool = False,
               device: str | None = None, **plan_options) -> PipelinePlan | None:
    """The plan tune_pipeline found fastest for this net, sizes and backend on GPUs named `device` (else GPU 0's
    name), with its measured time and bubble, or None if it was never tuned there."""
    from .schedules.autotune import cache_path, read_cache
    if device is None:
        import cupy
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    entry = read_cache(cache_path(PIPELINE_CACHE)).get(tuned_key(net, gpus, steps, batch, backend, fuse_pools,
                                                                  device))
    if entry is None:
        return None
    try:
        plan = plan_pipeline(net, gpus, steps, batch, split=list(entry["split"]), chunk=int(entry["chunk"]),
                             **plan_options)
        plan.measured = PipelineMeasurement(float(entry["ms"]), [float(b) for b in entry["busy_ms"]],
                                            int(entry["repeats"]))
    except (KeyError, TypeError, ValueError, BackendError) as e:
        import logging
        logging.getLogger(__name__).warning("tuned pipeline entry for net '%s' is unusable (%s); ignored", net.name, e)
        return None
    plan.notes.append(f"tuned on {device}: the fastest of {entry.get('candidates', '?')} measured candidates")
    return plan


def tune_pipeline(net: Net, params, gpus: int, steps: int, batch: int, *, backend: str = "persistent", x=None,
                  chunks: list[int] | None = None, splits: list[list[int]] | None = None, warmup: int = 1,
                  repeats: int = 3, seed: int = 0, fuse_pools: bool = False, use_cache: bool = True,
                  replay: bool = True, **plan_options) -> tuple[PipelinePlan, list[dict]]:
    """Measure the pipeline on this host's GPUs and keep the fastest plan (see the module docstring): the planner's
    chunk and the powers of two from a quarter to four times it, over the planner's split, the FLOP-balanced one and
    each with its cuts at block boundaries (or the given chunks and splits). Returns the plan, with .measured set, and
    every candidate's row (split, chunk, ms, bubble, or the error that ruled it out). x: the input (else normal random
    on GPU 0). fuse_pools, replay: how each candidate's PipelineProgram runs. use_cache: the winner is written to the
    pipelines cache, where tuned_plan() finds it (replayed runs only: what PipelineProgram does by default)."""
    import cupy
    present = cupy.cuda.runtime.getDeviceCount()
    base = plan_pipeline(net, gpus, steps, batch, available=present, **plan_options)
    if splits is None:               # the planner's split, the FLOP-balanced one, each with its cuts at block boundaries
        balanced = plan_pipeline(net, gpus, steps, batch, available=present,
                                 **{**plan_options, "host_us_per_run": 0.0})
        splits = []
        for plan in (base, balanced):
            for split in ([len(run) for run in plan.split], block_boundary_split(plan)):
                if split is not None and split not in splits:
                    splits.append(split)
    if chunks is None:
        chunks = [base.chunk] + [c for c in (2 ** k for k in range(2, 12)) if base.chunk / 4 <= c <= 4 * base.chunk
                                 and c < steps]
    if x is None:
        with cupy.cuda.Device(0):
            x = cupy.asarray(np.random.default_rng(seed).standard_normal((steps, batch, net.input_size)),
                             dtype=cupy.float32)
    rows, best = [], None
    seen = set()
    for split in splits:
        for chunk in chunks:
            plan = plan_pipeline(net, gpus, steps, batch, split=list(split), chunk=chunk, available=present,
                                 **plan_options)
            key = (tuple(len(run) for run in plan.split), plan.chunk)
            if key in seen:                        # two chunks the pools round to the same one
                continue
            seen.add(key)
            row = {"split": list(key[0]), "chunk": plan.chunk, "predicted_ms": plan.predicted_ms}
            try:
                measured = PipelineProgram(net, params, plan, backend=backend, fuse_pools=fuse_pools,
                                           replay=replay).measure(x, warmup=warmup, repeats=repeats)
            except BackendError as e:
                row["error"] = str(e).splitlines()[0]
            else:
                plan.measured = measured
                row.update(ms=measured.ms, bubble=measured.bubble, busy_ms=measured.busy_ms)
                if best is None or measured.ms < best.measured.ms:
                    best = plan
            rows.append(row)
    if best is None:
        raise BackendError(f"no pipeline plan of net '{net.name}' ran on {gpus} GPU(s): "
                           + "; ".join(f"split {r['split']} chunk {r['chunk']}: {r['error']}" for r in rows))
    if use_cache and replay:
        from .schedules.autotune import cache_path, write_entry
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        write_entry(tuned_key(net, gpus, steps, batch, backend, fuse_pools, device),
                    {"split": [len(run) for run in best.split], "chunk": best.chunk, "ms": best.measured.ms,
                     "busy_ms": best.measured.busy_ms, "repeats": best.measured.repeats,
                     "candidates": sum("ms" in r for r in rows)}, cache_path(PIPELINE_CACHE))
    return best, rows


# ---- measured figures on disk -----------------------------------------------------------------------------

MEASUREMENT_FIELDS = ("net", "gpus", "backend", "device", "choice", "split", "chunk", "ms", "measured_bubble",
                      "predicted_ms", "predicted_bubble", "one_gpu_best", "one_gpu_ms", "max_rel_diff")


def measured_pipelines(directory=None) -> tuple[list[dict], list[tuple[str, str]]]:
    """The pipelined runs written by benchmarks/probe_pipeline.py (benchmarks/results/pipeline-*.json with one row
    per plan measured: the planner's and the tuner's), flattened to one row each with its file, and the files that
    are not such runs, with why (left as they are). Rows: MEASUREMENT_FIELDS plus "file", "speedup" (against the
    best one-GPU run of the same net in the same file), "replay" and "fuse_pools" (how the chunks ran; files written
    before the replay existed issued them run by run)."""
    import json
    from pathlib import Path
    from .bench.results import RESULTS_DIR
    directory = Path(directory) if directory is not None else RESULTS_DIR
    rows, skipped = [], []
    for path in sorted(directory.glob("pipeline-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            skipped.append((path.name, f"not readable as JSON: {e}"))
            continue
        if not isinstance(data, list) or not data or not all(isinstance(r, dict) and "choice" in r for r in data):
            skipped.append((path.name, "not a list of measured plans (an earlier sweep's format)"))
            continue
        missing = sorted({f for r in data for f in MEASUREMENT_FIELDS if f not in r})
        if missing:
            skipped.append((path.name, f"rows without {', '.join(missing)}"))
            continue
        for r in data:
            one = r["one_gpu_ms"].get(r["one_gpu_best"]) if isinstance(r["one_gpu_ms"], dict) else None
            rows.append({**{f: r[f] for f in MEASUREMENT_FIELDS if f != "one_gpu_ms"}, "one_gpu_ms": one,
                         "speedup": one / r["ms"] if one and r["ms"] else None, "file": path.name,
                         "replay": bool(r.get("replay", False)), "fuse_pools": bool(r.get("fuse_pools", False))})
    return rows, skipped
