"""Running a pipeline plan: GPU g runs its pieces on time chunk c while GPU g + 1 runs chunk c - 1, the states of
every layer carried from chunk to chunk (see engine/multigpu/plan.py for the model)."""
from __future__ import annotations

import contextlib
import time

import numpy as np

from ..chunk_replay import CaptureError, ChunkReplay
from ..errors import BackendError
from ..execute import run as run_network
from ..nets.data import Layers, Net, NetParams, check_net_params
from ..nets.pooling import pool_over_time
from ..nets.results import NetResult
from ..nets.runner import NetProgram
from ..network import Network
from ..params import Params
from ..schedules import autotune
from ..schedules.registry import schedule_class
from .pieces import Piece, gpu_fused_runs, pieces_of
from .plan import PipelinePlan, chunk_steps
from .results import PipelineMeasurement


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
            import cupy  # deferred: CuPy is optional (no GPU in CI)
            present = cupy.cuda.runtime.getDeviceCount()
            devices = list(range(plan.gpus)) if devices is None else list(devices)
            if len(devices) != plan.gpus or any(not 0 <= d < present for d in devices):
                raise BackendError(f"devices {devices} do not name {plan.gpus} of the {present} GPU(s) of this host; "
                                   f"hint: {plan.gpus} distinct device numbers below {present}, or no devices")
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
        block = self.net.blocks[piece.block]
        if block.bidirectional:                    # the whole sequence in one chunk (chunk_steps): no states to carry
            return self._bidirectional(g, piece, value), None
        network = self._network(piece)
        params = Params(self.params.blocks[piece.block]["forward"].layers[piece.first:piece.last])
        if self.backend == "reference":
            result = run_network(network, params, value, states, backend="reference", dtype=np.float64)
        else:
            key = (g, piece, value.shape[0])       # a program per chunk length: a shorter tail chunk does not
            if key not in self.programs:           # make the full chunks' program rebuild its buffers each run
                self.programs[key] = autotune.prepare(autotune.Candidate(self.backend, None), network, params)
            result = self.programs[key].run(value, states)
        return result.outputs, result.final_states

    def _bidirectional(self, g: int, piece: Piece, value):
        """Layers [first, last) of a bidirectional block, as a net of their own (engine.nets.runner.NetProgram)."""
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
            raise BackendError(f"the pipeline plan is for T={plan.steps}, B={plan.batch}; x has shape {tuple(x.shape)}; "
                               "hint: plan the pipeline for x's steps and batch")
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
                        import cupy  # deferred: CuPy is optional (no GPU in CI)
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
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        self._release_sources()
        with cupy.cuda.Device(self.devices[-1]):
            return NetResult(outputs=cupy.concatenate(outputs, axis=0))

    def _replay_for(self, g: int, value):
        """GPU g's ChunkReplay for chunks of value's length (captured on first use), or None where GPU g runs its
        chunks directly (a capture of its chunk failed once: `replayed[g]` says why)."""
        if g in self.direct:
            return None
        import cupy  # deferred: CuPy is optional (no GPU in CI)
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
        import cupy  # deferred: CuPy is optional (no GPU in CI)
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
        import cupy  # deferred: CuPy is optional (no GPU in CI)
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
            return contextlib.nullcontext()
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        return cupy.cuda.Device(self.devices[g])

    def measure(self, x, *, warmup: int = 2, repeats: int = 5) -> PipelineMeasurement:
        """Time whole forwards on x: the wall time from all GPUs idle to all GPUs done (median of `repeats` after
        `warmup` runs), and each GPU's busy time in the median run (CUDA events around its work on each chunk, from
        its input being ready to its last kernel being done)."""
        import cupy  # deferred: CuPy is optional (no GPU in CI)
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
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        event = cupy.cuda.Event(disable_timing=not timing)
        event.record()
        return event

    def _on_device(self, value, ready=None):
        """The chunk on the current GPU: as it is when it is already there, else a peer copy on this GPU's stream,
        after the event that says the GPU before has written it."""
        if self.backend == "reference":
            return value
        import cupy  # deferred: CuPy is optional (no GPU in CI)
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
        import cupy  # deferred: CuPy is optional (no GPU in CI)
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
        import cupy  # deferred: CuPy is optional (no GPU in CI)
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
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    for d in sorted(set(devices)):
        with cupy.cuda.Device(d):
            cupy.cuda.get_current_stream().synchronize()


def wall_ms(fn, devices=(0,), *, warmup: int = 2, repeats: int = 5) -> float:
    """The median wall time of fn() in ms, from the GPUs `devices` idle to them done, after `warmup` calls: how
    PipelineProgram.measure times a pipelined forward, for the one-GPU run it is read against."""
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
