"""Running a net of blocks, block by block: on the NumPy reference, or on a GPU backend (each block one launch
sequence of that backend, arrays staying on the GPU between blocks).

    out = engine.run_net(net, params, x)          # x: (T, B, 512) -> out.outputs: (T // 2, B, 512)

One wavefront through the pools and the layers spread over several GPUs (engine/multigpu plans the split) build on
this.
"""
from __future__ import annotations

import numpy as np

from ..arguments import float_dtype, shown
from ..backends.common import array_module_of
from ..backends.lengths import check_lengths, only_on, within
from ..errors import BackendError
from ..execute import run
from ..network import Network
from ..params import Params
from ..schedules import autotune
from ..schedules.registry import schedule_class
from .data import Net, NetParams, Pool, check_net_params, layer_networks
from .fusion import FUSED_POOL_BACKENDS, FusedRun, fused_runs
from .pooling import pool_over_time, pooled_lengths, zero_past
from .results import NetResult

NET_BACKENDS = ("reference", "auto", "fused", "graph", "persistent")


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
        if not isinstance(backend, str) or backend not in NET_BACKENDS:
            raise BackendError(f"a net runs on one of {', '.join(NET_BACKENDS)}, not {shown(backend)}; hint: "
                               "backend='reference' runs NumPy on the CPU")
        if fuse_pools and backend not in FUSED_POOL_BACKENDS:
            raise BackendError(f"fuse_pools=True folds a pool into a wavefront schedule's kernel: backend must be one "
                               f"of {', '.join(FUSED_POOL_BACKENDS)}, not {backend!r}; hint: fuse_pools=False")
        check_net_params(net, params)
        self.net, self.params, self.backend, self.precision = net, params, backend, precision
        self.fuse_pools = fuse_pools
        self.dtype = (np.float64 if backend == "reference" else np.float32) if dtype is None else float_dtype(dtype)
        self.programs: dict[tuple, object] = {}
        self.runs = {r.first: r for r in fused_runs(net, precision)} if fuse_pools else {}
        self.fused: dict[int, str] = {}          # first block of a run -> what was joined, or why it was not

    def _run(self, key: tuple, network: Network, params: Params, value, poison: bool = False, pools=None,
             config=None, lengths=None):
        """(outputs, True) of one program: a block, a layer of a bidirectional block, or a fused run with `pools`;
        (None, False) for a fused run the autotuner gave no wavefront schedule (the caller runs its blocks)."""
        if self.backend == "reference":
            return run(network, params, value, backend="reference", dtype=self.dtype,
                       precision=self.precision, lengths=lengths).outputs, True
        program = self.programs.get(key)
        if program is None:
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

    def run(self, x, *, poison: bool = False, lengths=None) -> NetResult:
        """Every block in order, zero initial states; pools take the max or mean of the arrays as they are.
        poison=True: each GPU program fills its work buffers with NaN first (tests and the harness). A block that is
        part of a fused run (fuse_pools) has None in block_outputs but the run's last: what it produced never existed.
        lengths: (B,) the steps of each sequence of a batch padded at the end (backend 'reference'): every block
        sees each sequence alone (a backward direction reverses its own steps, a pool keeps the windows wholly
        within it), and result.lengths gives the steps each has at the end."""
        net, params = self.net, self.params
        shape = getattr(x, "shape", None)
        if not isinstance(shape, tuple) or len(shape) != 3 or shape[2] != net.input_size:
            raise BackendError(f"argument 'x' must have shape (T, B, {net.input_size}) for net '{net.name}', got "
                               f"{shape if isinstance(shape, tuple) else type(x).__name__}; hint: steps first, "
                               "then the batch, then the features")
        net.steps(shape[0])                    # pools that do not fit are refused before any work
        if lengths is not None:
            if self.backend != "reference":
                raise only_on(self.backend, f"net '{net.name}'", takes=("reference",))
            lengths = check_lengths(lengths, shape[0], shape[1])
            if self.runs:
                raise BackendError("lengths= and fuse_pools=True do not go together; hint: fuse_pools=False")
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
                if lengths is not None:
                    lengths = pooled_lengths(lengths, block, f"net '{net.name}'")
                    value = zero_past(value, lengths)
            elif not block.bidirectional:          # the whole stack in one program: the backend's own wavefront
                network = Network(block.cell, net.sizes[k], block.hidden_size, block.num_layers, block.proj_size)
                value = self._run((k,), network, params.blocks[k]["forward"], value, poison, lengths=lengths)[0]
            else:
                for layer, network in enumerate(layer_networks(net, k)):
                    xp = array_module_of(value)
                    forward = self._run((k, layer, "forward"), network,
                                        Params([params.blocks[k]["forward"].layers[layer]]), value, poison,
                                        lengths=lengths)[0]
                    backward = reverse_steps(self._run((k, layer, "backward"), network,
                                                       Params([params.blocks[k]["backward"].layers[layer]]),
                                                       reverse_steps(value, lengths), poison, lengths=lengths)[0],
                                             lengths)
                    xp = array_module_of(forward)
                    value = (xp.concatenate([forward, xp.ascontiguousarray(backward)], axis=2)
                             if block.merge == "concat" else forward + backward)
            produced.append(value)
            k += 1
        return NetResult(outputs=value, block_outputs=produced, lengths=lengths)


def reverse_steps(value, lengths):
    """Each sequence's steps in reverse order (T, B, F): the whole axis without lengths, else each sequence's own
    first lengths[b] steps, the padding left after them."""
    xp = array_module_of(value)
    if lengths is None:
        return xp.ascontiguousarray(value[::-1])
    T = value.shape[0]
    steps = np.arange(T)[:, None]
    source = np.where(within(lengths, T), lengths[None, :] - 1 - steps, steps)                # (T, B)
    return xp.take_along_axis(value, xp.asarray(source)[..., None], axis=0)


def prepare_net(net: Net, params: NetParams, backend: str = "reference", *, dtype=None,
                precision: str = "float32", fuse_pools: bool = False) -> NetProgram:
    return NetProgram(net, params, backend, dtype=dtype, precision=precision, fuse_pools=fuse_pools)


def run_net(net: Net, params: NetParams, x, *, backend: str = "reference", dtype=None,
            precision: str = "float32", fuse_pools: bool = False, lengths=None) -> NetResult:
    """prepare_net(...).run(x): once. Prepare the net yourself to run it many times (the programs are kept)."""
    return NetProgram(net, params, backend, dtype=dtype, precision=precision, fuse_pools=fuse_pools).run(
        x, lengths=lengths)
