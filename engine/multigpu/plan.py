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

from ..errors import BackendError
from ..flops import layer_step_flops
from ..nets.data import Layers, Net, Pool
from ..network import Network
from .results import PipelineMeasurement

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
    measured: PipelineMeasurement | None = None  # set by tune_pipeline (or by the caller from measure())
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


def linear_partition(costs: list[float], parts: int) -> list[list[int]]:
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


def at_block_boundaries(units: list[Unit], runs: list[list[int]]) -> list[list[int]] | None:
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
            raise BackendError(f"{name} must be a positive integer, got {value!r}; hint: {name}=1 or more")
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
            raise BackendError(f"split must list the number of layers of each of the {gpus} GPUs, got {split!r}; "
                               f"hint: {gpus} whole numbers that add up to the net's {len(units)} layers, or no split "
                               "to let the planner choose")
        empty = [g for g, s in enumerate(split) if s < 1]
        if empty:
            raise BackendError(f"split {list(split)} leaves GPU {empty[0]} without layers; hint: every GPU takes at "
                               "least one layer")
        if sum(split) != len(units):
            raise BackendError(f"split {list(split)} places {sum(split)} layers, but net '{net.name}' has "
                               f"{len(units)}: " + ", ".join(u.label for u in units)
                               + f"; hint: counts that add up to {len(units)}")
        runs, start = [], 0
        for n in split:
            runs.append(list(range(start, start + n)))
            start += n
    notes = []
    if any(u.bidirectional for u in units) and gpus > 1:
        notes.append("a bidirectional layer needs the whole sequence of the layer below before its backward "
                     "direction starts: the GPUs on either side of it do not overlap, so the prediction is optimistic")
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise BackendError(f"chunk must be a positive integer, got {chunk!r}; hint: chunk=1 or more (the steps a GPU "
                           "hands on at a time), or no chunk to let the planner choose")

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
        candidates = [linear_partition(step_us, gpus)]
        moved = at_block_boundaries(units, candidates[0])
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
