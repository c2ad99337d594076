"""What the two wavefront schedules share on the host: plan, compile, buffers, weights, the run.

    program = GraphSchedule(network, params)      # or PersistentSchedule; nothing runs yet
    result = program.run(x)                       # builds for x's (T, B) once, then launches

plan   make_plan(..., layout="interleaved") and make_tiling(): which block owns which units.
compile render_wavefront() -> cupy.RawKernel per entry point (engine/codegen/nvrtc.py; cached by source and device).
build  one set of buffers per (T, B), reused by every run; packed weights (N, K) per layer; the
       per-layer argument table (engine.codegen.layer_args.layer_fields) as an int64 device array.
run    states initialised (one memset when they start at zero), layer 0's input projection as one
       cuBLAS GEMM over all T*B rows when the network has one layer (with more, the kernel projects
       layer 0 too), then the schedule's own launch (`_launch`), all on the caller's stream, with no
       host round trip; outputs copied out.
lengths a batch padded at the end (run(..., lengths=)) has a build of its own, whose kernels hold the rows
       past their end (engine/passes/lengths.py) and read the lengths from a buffer each run fills first.

A subclass supplies `persistent` (which kernels to generate) and `_prepare_launch` / `_launch`.
"""
from __future__ import annotations

import math

import numpy as np

from ..backends.common import RunResult, check_float32_gpu_program, check_gpu_run_inputs, check_precision
from ..backends.fused import plan_bytes
from ..backends.lengths import check_lengths
from ..chunk_replay import CaptureError, ChunkReplay
from ..codegen.layer_args import half_copies, layer_fields
from ..codegen.nvrtc import load_module
from ..codegen.shared_outputs import untouched
from ..codegen.wavefront import POOL_OPS, entry_points, render_wavefront, stages
from ..compiler import make_plan
from ..dense import dense, variance_network
from ..errors import BackendError, CompileError
from ..memory import available_device_bytes, check_fits
from ..nets.data import check_pool
from ..network import Network
from ..params import Params
from ..plan import Plan, pack_weights, slot_columns
from ..rounding import weight_bits
from .project import project, round_activations
from .steps import WavefrontSteps, layer_steps
from .tiling import DeviceLimits, TileConfig, Tiling, make_tiling

NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14   # CUfunction_attribute (CUDA driver API): clusters of more than 8 blocks


def compile_kernel(source: str, name: str, cooperative: bool, smem_bytes: int, cell: str, cluster: int = 0):
    """The kernel of one entry point, compiled now with NVRTC as IEEE fp32 (engine/codegen/nvrtc.py, which caches the
    module by source and device, and turns NVRTC's refusal into a CompileError). cluster: blocks of its clusters
    (__cluster_dims__ in the source), which past 8 the kernel must allow."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)

    module = load_module(source, cooperative, cell=cell)     # IEEE fp32: no -ftz (engine/codegen/nvrtc.py)
    try:
        kernel = module.get_function(name)
        if smem_bytes > 48 * 1024:
            kernel.max_dynamic_shared_size_bytes = smem_bytes
        if cluster > 8:
            cupy.cuda.driver.funcSetAttribute(kernel.kernel.ptr, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    except cupy.cuda.driver.CUDADriverError as e:
        raise CompileError(f"the wavefront kernel '{name}' for cell '{cell}' did not load: {e}\n  hint: this is a bug "
                           "in engine.codegen.wavefront; `python -m engine explain <cell> --schedule persistent` "
                           "prints the source") from None
    return kernel


def chunked(xp, values, block_rows: int, k_chunk: int, group: int = 8):
    """values (rows, cols) of array module xp, in the bulk pipeline's chunked layout, flat (kernels/mma_gemm.cuh
    rnn_chunked): blocks of block_rows rows, each as cols / k_chunk chunks of block_rows x k_chunk elements, and
    in a chunk the 16-byte group c of row b at group c ^ (b % 8) (group: the elements of 16 bytes, 8 of a 16-bit
    type, 4 of a 32-bit one). Reshapes and one gather, no index array of the matrix's size."""
    rows, cols = values.shape
    tiles = values.reshape(rows // block_rows, block_rows, cols // k_chunk, k_chunk // group, group)
    tiles = tiles.transpose(0, 2, 1, 3, 4)
    row = xp.arange(block_rows)[:, None]
    source = xp.arange(k_chunk // group)[None, :] ^ (row & 7)  # group p holds group p ^ (b % 8): XOR undoes itself
    return tiles[:, :, row, source, :].reshape(-1)


def chunked_weight(bits: np.ndarray, rows_per_block: int, blocks: int, block_rows: int, k_chunk: int) -> np.ndarray:
    """A packed weight (N, K) as the bulk pipeline streams it: block i's rows [i * rows_per_block, ...) padded
    with zeros to block_rows rows, chunked block by block."""
    N, K = bits.shape
    padded = np.zeros((blocks, block_rows, K), dtype=bits.dtype)
    for i in range(blocks):
        part = bits[i * rows_per_block:min((i + 1) * rows_per_block, N)]
        padded[i, :len(part)] = part
    return chunked(np, padded.reshape(blocks * block_rows, K), block_rows, k_chunk)


def check_pools(schedule: str, network: Network, pool=None, pools=None) -> dict:
    """{layer: Pool} from a schedule's pool / pools arguments, each checked (BackendError naming the argument)."""
    if pool is not None and pools is not None:
        raise BackendError(f"schedule '{schedule}': give pool (after the last layer) or pools ({{layer: Pool}}), "
                           "not both")
    if pool is not None:
        check_pool(pool, f"schedule '{schedule}', argument 'pool'")
        return {network.num_layers - 1: pool}
    if pools is None:
        return {}
    if not isinstance(pools, dict):
        raise BackendError(f"schedule '{schedule}': argument 'pools' must be a dict {{layer: Pool}}, got "
                           f"{type(pools).__name__}")
    for layer, value in pools.items():
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < network.num_layers:
            raise BackendError(f"schedule '{schedule}': argument 'pools' has key {layer!r}, not a layer of this "
                               f"{network.num_layers}-layer network (0 to {network.num_layers - 1})")
        check_pool(value, f"schedule '{schedule}', argument 'pools[{layer}]'")
    return dict(sorted(pools.items()))


def _version0(buffer):
    """Version 0 of a buffer: the array, or the first of a double buffer's two."""
    return buffer[0] if isinstance(buffer, list) else buffer


class WavefrontSchedule:
    """Host side of a wavefront schedule for one network and parameter set."""

    name = "wavefront"
    persistent = False

    def __init__(self, network: Network, params: Params, dtype=np.float32, *, config: TileConfig | None = None,
                 limits: DeviceLimits | None = None, precision: str = "float32", pool=None, pools=None,
                 replay: bool = True):
        pools = check_pools(self.name, network, pool, pools)   # first: a CPU-only machine says what is wrong too
        check_float32_gpu_program(f"schedule '{self.name}'", network, params, dtype)
        network, params = dense(network, params)      # heads as block-diagonal weights, reductions as matmuls
        network, params = variance_network(network, params)   # a LayerNorm's variance: one reduction, one barrier
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        self.cupy, self.network, self.params = cupy, network, params
        self.precision = check_precision(precision)
        self.config = config or TileConfig()
        self.limits = limits or DeviceLimits.current()
        # pools {layer: nets.data.Pool}: a pool over time after those layers, folded into the layer's store of its
        # output (kernels/pool.cuh): the layers above read the pooled sequence, started as soon as their input is
        # (engine/schedules/steps.py), and a pool after the last layer pools the outputs. pool=P: pools={L - 1: P}.
        self.pools = pools
        self._shape = None                      # (T, B, lengths) of the build
        self.lengths_device = None              # lengths=: the build's (B,) int32 buffer of the sequences' steps
        # replay: the second and later runs in a row at one (T, B) replay the whole run from CUDA graphs (see run()).
        self.replay = replay
        self.replayed = "not replayed: replay=False" if not replay else "not yet replayed (from a shape's second run)"
        self._replays: dict = {}                # (T, B, lengths) -> engine.chunk_replay.ChunkReplay, on this build's buffers

    # ---- plan and compile -------------------------------------------------------------------------
    def plan(self, T: int, B: int, lengths: bool = False) -> tuple[Plan, Tiling]:
        """lengths=True: the kernels that take the sequences' lengths (engine/passes/lengths.py)."""
        plan = make_plan(self.network, T, B, layout="interleaved", precision=self.precision, lengths=lengths)
        tiling = make_tiling(plan.program, self.network, B, self.config, self.limits, persistent=self.persistent)
        return plan, tiling

    def source(self, T: int, B: int, lengths: bool = False) -> str:
        plan, tiling = self.plan(T, B, lengths)
        return render_wavefront(plan.program, self.network, tiling, pools=self.pools)

    # ---- build: once per (T, B) and with or without lengths ----------------------------------------
    def _build(self, T: int, B: int, lengths: bool = False) -> None:
        cupy, network = self.cupy, self.network
        self._replays = {}                      # graphs captured on the buffers this build replaces go with them
        self._build_info = None                 # RunResult.info of this build (_info)
        plan, tiling = self.plan(T, B, lengths)
        program = plan.program
        self.plan_, self.tiling = plan, tiling
        self.steps_ = self._layer_steps(T)
        self.source_ = render_wavefront(program, network, tiling, pools=self.pools)
        names = entry_points(program)
        wanted = [names["persistent"]] if self.persistent else list(names["wave"])
        self.kernels = [compile_kernel(self.source_, n, self.persistent and not tiling.cluster, tiling.smem_bytes,
                                       program.cell.name, tiling.cluster) for n in wanted]
        self._check_memory(plan)
        L = network.num_layers
        # Version 0 of every buffer that holds a state's home sits in one arena: zero states are one memset.
        homes = {h.slot.buffer for h in program.homes}
        unused = untouched(program, tiling)    # Y in shared memory (engine/codegen/shared_outputs.py): one element
        shapes = {}
        for layer in range(L):
            sizes = plan.layer_sizes(layer)
            Tl = self.steps_[layer].steps          # T, or fewer steps above a pool
            for buf in program.buffers:
                if buf.name != program.input_buffer:
                    shapes[layer, buf.name] = ((1, 1) if buf.name in unused else
                                               (Tl * B if buf.rows == "sequence" else B, buf.cols(sizes)))
        # Each view starts on a 256-byte boundary, as a buffer of its own would: the kernels read rows as float4.
        def span(shape):
            return -(-shape[0] * shape[1] // 64) * 64
        arena_floats = sum(span(shape) for (layer, name), shape in shapes.items() if name in homes)
        self.state_arena = cupy.empty(max(arena_floats, 1), dtype=cupy.float32)
        offset = 0
        self.buffers = []
        for layer in range(L):
            bufs = {}
            for buf in program.buffers:
                if buf.name == program.input_buffer:
                    continue
                shape = shapes[layer, buf.name]
                if buf.name in homes:
                    first = self.state_arena[offset:offset + shape[0] * shape[1]].reshape(shape)
                    offset += span(shape)
                else:
                    first = cupy.empty(shape, dtype=cupy.float32)
                bufs[buf.name] = [first, cupy.empty(shape, dtype=cupy.float32)] if buf.double else first
            self.buffers.append(bufs)
        # The 16-bit copies of the GEMMs' X operands (fp16 / bf16 on the tensor-core path): the kernels write them
        # beside the fp32 values; the run writes those of x and of the initial states. State copies share an arena.
        self.halves = half_copies(program, tiling)
        home_halves = [name for name in self.halves if name in homes]
        self.half_arena = cupy.zeros(max(sum(span(shapes[layer, n]) for layer in range(L) for n in home_halves), 1),
                                     dtype=cupy.uint16)
        offset = 0
        self.half_buffers = []
        for layer in range(L):
            bufs = {}
            for name in self.halves:
                if name == program.input_buffer:
                    continue
                shape = shapes[layer, name]
                if name in home_halves:
                    first = self.half_arena[offset:offset + shape[0] * shape[1]].reshape(shape)
                    offset += span(shape)
                else:
                    first = cupy.empty(shape, dtype=cupy.uint16)
                bufs[name] = [first, cupy.empty(shape, dtype=cupy.uint16)] if program.buffer(name).double else first
            self.half_buffers.append(bufs)
        if program.output_buffer in self.halves and any(p < L - 1 for p in self.pools):
            raise BackendError(f"schedule '{self.name}': a pool between layers in precision '{self.precision}' would "
                               "need the 16-bit copy of the pooled sequence, which the pool does not write yet; hint: "
                               "precision='float32' or 'tf32', or the pool as its own pass (fuse_pools=False)")
        self.x_half = (cupy.empty((T * B, network.input_size), dtype=cupy.uint16)
                       if program.input_buffer in self.halves else None)
        self._chunked_sources = {}              # shape -> gather index of the bulk pipeline's chunked copies
        self.weights, self.vectors = [], []
        for layer in range(L):
            # Weights as the kernels read them: float32, tf32-rounded float32, or fp16/bf16 bit patterns.
            packed = pack_weights(program, network, self.params, layer)
            self.weights.append({g: (cupy.asarray(self._layout_weight(g, weight_bits(p.weight, self.precision))),
                                     None if p.bias is None else cupy.asarray(p.bias, dtype=cupy.float32))
                                 for g, p in packed.items()})
            self.vectors.append({n: cupy.asarray(np.asarray(self.params[layer][n]), dtype=cupy.float32)
                                 for n in program.kernel_params})
        self.x_device = cupy.empty((T * B, network.input_size), dtype=cupy.float32)
        # The pooled sequences: what a pool after layer p hands to layer p + 1 (or out, after the last layer).
        self.pooled = {p: cupy.empty((self._pool_steps(p) * B, network.output_size), dtype=cupy.float32)
                       for p in self.pools}
        # lengths=: the (B,) steps of each sequence, which every layer's kernels read (a run copies its own in)
        self.lengths_device = cupy.full((B,), T, dtype=cupy.int32) if lengths else None
        fields = layer_fields(program, tiling, bool(self.pools))
        table = np.zeros((L, len(fields)), dtype=np.int64)
        for layer in range(L):
            for i, f in enumerate(fields):
                table[layer, i] = self._field_value(layer, f)
        self.args = cupy.asarray(table)
        self._shape = (T, B, lengths)
        self._prepare_launch(T, B)

    def _field_value(self, layer: int, f) -> int:
        program = self.plan_.program
        if f.kind == "input":
            return self._layer_input(layer).data.ptr
        if f.kind in ("buffer", "half"):
            buf = (self.buffers if f.kind == "buffer" else self.half_buffers)[layer][f.source]
            return (buf[f.version] if f.version is not None else buf).data.ptr
        if f.kind == "input_half":
            source = self.x_half if layer == 0 else self.half_buffers[layer - 1][program.output_buffer]
            return source.data.ptr
        if f.kind == "weight":
            return self.weights[layer][f.source][0].data.ptr
        if f.kind == "bias":
            bias = self.weights[layer][f.source][1]
            return 0 if bias is None else bias.data.ptr
        if f.kind == "param":
            return self.vectors[layer][f.source].data.ptr
        if f.kind == "pool":
            return self.pooled[layer].data.ptr if layer in self.pools else 0
        if f.kind == "timing":
            return self._timing_value(layer, f.name)
        if f.kind == "lengths":
            return self.lengths_device.data.ptr
        return self.network.layer_input_size(layer)

    def _layer_input(self, layer: int):
        """What layer `layer` reads: x, the output sequence of the layer below, or the pool after it."""
        if layer == 0:
            return self.x_device
        if layer - 1 in self.pools:
            return self.pooled[layer - 1]
        return self.buffers[layer - 1][self.plan_.program.output_buffer]

    def _layer_steps(self, T: int):
        """Each launch group's step timing (engine/schedules/steps.py), as one LayerSteps per layer: a group starts
        when the one before has finished, so its first layer starts at wavefront step 0."""
        timing, steps = [], T
        group = self.launch_group()
        for first in range(0, self.network.num_layers, group):
            count = min(group, self.network.num_layers - first)
            local = {p - first: pool for p, pool in self.pools.items() if first <= p < first + count}
            try:
                part = layer_steps(count, steps, local)
            except ValueError as e:
                raise BackendError(f"schedule '{self.name}': {e} (T={T}); hint: a longer sequence or a smaller pool "
                                   "window") from None
            timing += part.layers
            steps = part.output_steps
        return timing

    def launch_group(self) -> int:
        """Layers a launch runs (the graph schedule: all of them)."""
        return self.network.num_layers

    def _pool_steps(self, layer: int) -> int:
        return self.pools[layer].steps_out(self.steps_[layer].steps)

    def wavefront_steps(self, first_layer: int) -> int:
        """Wavefront steps of the launch that starts at first_layer (with pools: from the layers' timing)."""
        return WavefrontSteps(tuple(self.steps_[first_layer:first_layer + self.launch_group()]), 0).wavefront

    def _timing_value(self, layer: int, name: str) -> int:
        pool = self.pools.get(layer)
        if name.startswith("pool_"):
            if pool is None:
                return 0
            return {"pool_steps": self._pool_steps(layer), "pool_op": POOL_OPS[pool.op],
                    "pool_window": pool.window, "pool_stride": pool.stride}[name]
        return getattr(self.steps_[layer], name)

    def _check_memory(self, plan: Plan) -> None:
        needed = plan_bytes(plan, untouched(plan.program, self.tiling))
        check_fits(needed, f"schedule '{self.name}' with T={plan.steps}, B={plan.batch}, L={self.network.num_layers}, "
                   f"H={self.network.hidden_size}", "x's steps and batch, hidden_size", on="device",
                   limit=available_device_bytes(self.cupy), hint="run fewer steps or a smaller batch at a time")
        self.bytes = needed

    # ---- the run ----------------------------------------------------------------------------------
    def run(self, x, initial_states: dict | None = None, *, poison: bool = False, lengths=None) -> RunResult:
        """x: (T, B, I), NumPy or CuPy. CuPy arrays come back when x is CuPy, NumPy otherwise.
        poison=True fills every work buffer with NaN first (tests), and runs directly.

        lengths: (B,) the steps of each sequence of a batch padded at the end (engine/backends/lengths.py): the
        kernels built for it (engine/passes/lengths.py) hold each row's states past its end and write 0 as its
        outputs there; they read the lengths from a device buffer of the build, which the run fills first.

        Replay: a run at the (T, B) of the run before (the second and later runs of a loop) is replayed from CUDA
        graphs of the whole run (engine/chunk_replay.py: x copied into a fixed buffer, one graph launch, the outputs
        and final states copied out), so the host issues a few calls instead of every launch, copy and memset of the
        run; the first run at a shape runs directly (a one-off run pays no capture). A run that cannot be captured (a
        projection cublasLt has no algorithm for falls back to cuBLAS through CuPy, which refuses capture) runs
        directly from then on, and `replayed` says why."""
        cupy, network = self.cupy, self.network
        check_gpu_run_inputs(f"schedule '{self.name}'", cupy, network, x, initial_states)
        T, B, _ = x.shape
        steps = check_lengths(lengths, int(T), int(B))
        if steps is not None and self.pools:
            raise BackendError(f"schedule '{self.name}' runs lengths= without pools; hint: the net on "
                               "backend='reference', or its sequences grouped by length and run without lengths")
        key = (int(T), int(B), steps is not None)
        replay = (self.replay and not poison and self._shape == key
                  and not cupy.cuda.get_current_stream().is_capturing())   # inside someone's capture: run directly
        if steps is not None:                   # into the build's buffer, before the launches (and any capture)
            if self._shape != key:
                self._build(*key)
            self.lengths_device.set(steps.astype(np.int32))
        if replay:
            replay = self._replays.get(key) or self._capture(key)
            if replay is not None:
                return self._run_replayed(replay, x, initial_states)
        return self._run_direct(x, initial_states, poison=poison, lengths=key[2])

    def _capture(self, key):
        """The ChunkReplay of a whole run at (T, B) = key, or None (and replay off) where it cannot be captured."""

        def body(x, states):                    # the outputs as views of the program's buffers: copied out once
            result = self._run_direct(x, states.get("run"), copy_out=False, lengths=key[2])
            return result.outputs, {"run": result.final_states}
        # the replay's input buffer is the build's own: the captured run does not copy x again
        replay = whole_run_replay(self, body, key, self.network.input_size,
                                  x=self.x_device.reshape(*key[:2], self.network.input_size))
        if replay is not None:
            self._replays[key] = replay
        return replay

    def _run_replayed(self, replay, x, initial_states: dict | None) -> RunResult:
        outputs, final = launch_replay(self.cupy, replay, x, initial_states)
        return RunResult(outputs=outputs, final_states=final, backend=self.name, info=self._info(int(x.shape[0])))

    def _info(self, T: int) -> dict:
        """RunResult.info: what this build runs (formatted once per build: a replayed run's host time is a few
        calls), and whether it replays."""
        if self._build_info is None:
            self._build_info = {"schedule": self.name, "precision": self.precision, "tiling": self.tiling.describe(),
                                "pools": {p: pool.label for p, pool in self.pools.items()},
                                "blocks": self.tiling.blocks, "launches_per_sequence": self.launches_per_sequence(T),
                                "program": self.plan_.program.key, "bytes": self.bytes,
                                "lengths": self.plan_.program.lengths}
        return {**self._build_info, "replayed": self.replayed}

    def _run_direct(self, x, initial_states: dict | None = None, *, poison: bool = False,
                    copy_out: bool = True, lengths: bool = False) -> RunResult:
        """The run as the host issues it: every copy, memset and launch (replays capture this). copy_out=False: the
        outputs are a view of the program's buffer, which the next run overwrites. lengths: the build whose kernels
        read the lengths (run() has put them in its buffer)."""
        cupy, network = self.cupy, self.network
        T, B, _ = x.shape
        if self._shape != (int(T), int(B), lengths):
            self._build(int(T), int(B), lengths)
        on_gpu = isinstance(x, cupy.ndarray)
        program, L = self.plan_.program, network.num_layers
        # Everything runs on the caller's stream, in order after whatever wrote x: no host round trip.
        if poison:   # NaN everywhere: 0xFFFF is a NaN in fp16 and in bf16
            for bufs, fill in [(b, math.nan) for b in self.buffers] + [(b, 0xFFFF) for b in self.half_buffers]:
                for value in bufs.values():
                    for array in (value if isinstance(value, list) else [value]):
                        array.fill(fill)
            for array in self.pooled.values():
                array.fill(math.nan)
        if not (on_gpu and x.data.ptr == self.x_device.data.ptr):     # (a replay's input is the buffer itself)
            self.x_device[...] = cupy.asarray(x, dtype=cupy.float32).reshape(T * B, network.input_size)
        if self.x_half is not None:
            self._write_half(self.x_half, self.x_device)
        self._init_states(initial_states)
        group = self.tiling.num_layers
        for first in range(0, L, group):        # one launch per group of layers (usually one group)
            if not self.tiling.layer0_in_kernel:
                self._project(first)
            self._launch(T, B, first)
        last = L - 1
        if last in self.pools:
            outputs = self.pooled[last].reshape(self._pool_steps(last), B, network.output_size)
        else:
            outputs = self.buffers[-1][program.output_buffer].reshape(self.steps_[last].steps, B,
                                                                      network.output_size)
        if copy_out:
            outputs = device_copy(cupy, outputs)
        final = {}
        for home in program.homes:
            per_layer = []
            for layer in range(L):
                buf = self.buffers[layer][home.slot.buffer]
                buf = buf[self.steps_[layer].steps % 2] if isinstance(buf, list) else buf
                per_layer.append(buf[:, slot_columns(home.slot, self.plan_.layer_sizes(layer),
                                                     network.state_size(home.state))])
            final[home.state] = cupy.stack(per_layer)
        if not on_gpu:
            outputs = cupy.asnumpy(outputs)
            final = {k: cupy.asnumpy(v) for k, v in final.items()}
        return RunResult(outputs=outputs, final_states=final, backend=self.name, info=self._info(T))

    def _project(self, layer: int) -> None:
        """The layer's input projection for the whole sequence, one cuBLAS GEMM per hoisted GEMM (a launch that
        starts at this layer does not compute it), in the schedule's precision (engine/schedules/project.py)."""
        program = self.plan_.program
        source = self._layer_input(layer)
        for g in program.hoisted_gemms:
            weight, bias = self.weights[layer][g.name]
            project(self.cupy, source, weight, bias, self.buffers[layer][g.out_buffer], self.precision)

    def _write_half(self, target, values) -> None:
        """target (uint16) = values (float32, (rows, K) in blocks of B rows) as the kernels' 16-bit copies: fp16
        or bf16 bit patterns rounded to nearest even, in place, or chunked for the bulk pipeline."""
        bits = round_activations(self.cupy, values, self.precision).view(self.cupy.uint16)
        if not self.tiling.bulk:
            target[...] = bits
            return
        # The source of every element of the chunked copy, once per shape (int32: x at `large` is 13 M elements).
        key = values.shape
        if key not in self._chunked_sources:
            sources = np.arange(values.size, dtype=np.int32).reshape(key)
            self._chunked_sources[key] = self.cupy.asarray(chunked(np, sources, self._shape[1], self.tiling.k_chunk))
        target.ravel()[...] = bits.ravel()[self._chunked_sources[key]]

    def _layout_weight(self, gemm: str, bits: np.ndarray) -> np.ndarray:
        """A packed weight as the kernels read it: row-major (N, K), or chunked per block when the bulk pipeline
        streams it (engine.codegen.wavefront: NC_STREAMED rows a block)."""
        tiling = self.tiling
        tile = next((t for t in tiling.gemms if t.name == gemm), None)
        if not tiling.bulk or tile is None or tile.resident:
            return np.ascontiguousarray(bits)
        return chunked_weight(bits, tile.terms * tiling.units_per_block, tiling.blocks_per_layer, tiling.nc_streamed,
                              tiling.k_chunk)

    def _init_states(self, initial_states: dict | None) -> None:
        self.state_arena.fill(0.0)
        self.half_arena.fill(0)                 # 0x0000 is +0 in fp16 and bf16
        if not initial_states:
            return
        program = self.plan_.program
        for layer, bufs in enumerate(self.buffers):
            sizes = self.plan_.layer_sizes(layer)
            for home in program.homes:
                value = initial_states.get(home.state)
                if value is None:
                    continue
                target = _version0(bufs[home.slot.buffer])
                target[:, slot_columns(home.slot, sizes, self.network.state_size(home.state))] = \
                    self.cupy.asarray(value[layer], dtype=self.cupy.float32)
            for name in {h.slot.buffer for h in program.homes} & set(self.halves):
                self._write_half(_version0(self.half_buffers[layer][name]), _version0(bufs[name]))

    def stage_count(self) -> int:
        return len(stages(self.plan_.program))

    # ---- what a subclass provides -----------------------------------------------------------------
    def _prepare_launch(self, T: int, B: int) -> None:
        raise NotImplementedError

    def _launch(self, T: int, B: int, first_layer: int) -> None:
        """Launch the kernel(s) for the group of layers that starts at first_layer."""
        raise NotImplementedError

    def launches_per_sequence(self, T: int) -> int:
        raise NotImplementedError


def whole_run_replay(owner, body, key: tuple, input_size: int, x=None):
    """The ChunkReplay of body (a whole run: (x, {"run": states}) -> (outputs, {"run": final states})) at key = (T, B,
    lengths), or None where it cannot be captured. owner.replay and owner.replayed (a program's flag and the words its
    runs report) say which: a program that cannot be captured runs directly from then on."""
    try:
        replay = ChunkReplay(owner.cupy, body, (*key[:2], input_size), {}, x=x)
    except CaptureError as e:
        owner.replay = False
        owner.replayed = f"not replayed: the run could not be captured ({e}); runs directly"
        return None
    owner.replayed = f"replayed from CUDA graphs at T={key[0]}, B={key[1]}" + (" with lengths" if key[2] else "")
    return replay


def launch_replay(cupy, replay, x, initial_states: dict | None) -> tuple:
    """A whole run's ChunkReplay (carry "run": the final states) launched on x: x copied into its buffer, the
    initial states into its carry (the states given, zeros for the others; the `first` graph, zero states, where none
    is given), the outputs and final states copied out (the replay rewrites them), as NumPy for a NumPy x."""
    replay.x[...] = cupy.asarray(x, dtype=cupy.float32)
    carried = replay.carry["run"]
    if initial_states:
        for name, target in carried.items():
            value = initial_states.get(name)
            if value is None:
                target.fill(0.0)
            else:
                target[...] = cupy.asarray(value, dtype=cupy.float32)
    outputs = device_copy(cupy, replay.launch(first=not initial_states))
    final = {name: device_copy(cupy, value) for name, value in carried.items()}
    if not isinstance(x, cupy.ndarray):
        outputs, final = cupy.asnumpy(outputs), {k: cupy.asnumpy(v) for k, v in final.items()}
    return outputs, final


def device_copy(cupy, a):
    """A copy of the CuPy array `a` on the current stream: one device-to-device memcpy where `a` is C-contiguous, else
    a.copy(). (ndarray.copy runs an elementwise kernel: 41 us for a 32 MiB output, where a memcpy of the same size took
    16 us; H200, 2026-11-27.)"""
    if not a.flags.c_contiguous:
        return a.copy()
    out = cupy.empty_like(a)
    if a.nbytes:
        out.data.copy_from_device_async(a.data, a.nbytes)
    return out
