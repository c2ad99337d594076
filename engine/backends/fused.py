"""The fused backend: cuBLAS GEMMs + generated fused kernels, hoisted input GEMM, layer wavefront.

It executes a Plan (engine/plan.py) as the passes decided it:
- per layer, the hoisted input projection: one GEMM over all T*B rows for layer 0; for layer l > 0,
  one GEMM per chunk of `plan.chunk_steps` steps, as soon as layer l-1 has produced them;
- per step, for each stage: that stage's GEMMs (cupy.matmul -> cuBLAS), then its generated kernel(s);
- the layers as a wavefront: layer l runs on its own CUDA stream; chunk c of layer l waits (CUDA
  event) for chunk c of layer l-1, and follows chunk c-1 of layer l on its stream. Chunks are
  enqueued diagonal by diagonal (plan.chunk_order()), so every event is recorded before any
  stream waits on it.

The same Executor runs with a NumPy "device" in engine/backends/plan_numpy.py: the CPU tests run the
exact host logic of this backend (buffers, packing, versions, wavefront order) without a GPU.

Arrays: x may be NumPy or CuPy (on the current device). Results are CuPy arrays when x is a CuPy
array and NumPy arrays otherwise. float32 only for now.
"""
from __future__ import annotations

import math

import numpy as np

from ..codegen import compile_module
from ..compiler import make_plan
from ..dense import dense
from ..memory import available_device_bytes, check_fits
from ..network import Network
from ..params import Params
from ..plan import FLOAT_BYTES, Plan, pack_weights, slot_columns
from .common import RunResult, check_float32_gpu_program, check_gpu_run_inputs
from .lengths import check_lengths

THREADS_PER_BLOCK = 256
MAX_BLOCKS = 65535


class Executor:
    """Runs a Plan on a device. The device supplies arrays, GEMMs, kernel launches, streams and events."""

    def __init__(self, plan: Plan, device, ahead: int | None = None):
        self.plan, self.program, self.device = plan, plan.program, device
        self.order = tuple(plan.program.step_order())      # the same every step: built once, not per step
        # steps a piece of layer 0's projection, issued ahead on the device's projection stream (_project_ahead);
        # None: one GEMM over the whole sequence before layer 0's first step
        self.ahead = ahead if ahead and ahead < plan.steps else None

    # ---- set-up ---------------------------------------------------------------------------------
    def _allocate(self, poison: bool) -> list[dict]:
        plan, device = self.plan, self.device
        T, B = plan.steps, plan.batch
        fill = math.nan if poison else 0.0
        layers = []
        for layer in range(plan.network.num_layers):
            sizes = plan.layer_sizes(layer)
            buffers = {}
            for buf in self.program.buffers:
                if buf.name == self.program.input_buffer:
                    continue
                shape = (T * B if buf.rows == "sequence" else B, buf.cols(sizes))
                copies = 2 if buf.double else 1
                arrays = [device.full(shape, fill) for _ in range(copies)]
                buffers[buf.name] = arrays if buf.double else arrays[0]
            layers.append(buffers)
        return layers

    def _upload_params(self, params: Params) -> tuple[list[dict], list[dict]]:
        """Per layer: {gemm: (P^T (K, N), bias (N,) or None)} and {parameter: (D,) vector}."""
        plan, device = self.plan, self.device
        weights, vectors = [], []
        for layer in range(plan.network.num_layers):
            packed = pack_weights(self.program, plan.network, params, layer)
            weights.append({name: (device.asarray(np.ascontiguousarray(p.weight.T)),
                                   None if p.bias is None else device.asarray(p.bias))
                            for name, p in packed.items()})
            vectors.append({name: device.asarray(np.asarray(params[layer][name]))
                            for name in self.program.kernel_params})
        return weights, vectors

    def _init_states(self, layers: list[dict], initial_states: dict | None) -> None:
        plan = self.plan
        for layer, buffers in enumerate(layers):
            sizes = plan.layer_sizes(layer)
            for home in self.program.homes:
                target = self._version(buffers[home.slot.buffer], "cur", 0)
                cols = slot_columns(home.slot, sizes, plan.network.state_size(home.state))
                value = None if initial_states is None else initial_states.get(home.state)
                if value is None:
                    target[:, cols] = 0.0
                else:
                    target[:, cols] = self.device.asarray(value[layer])

    @staticmethod
    def _version(buffer, version: str | None, t: int):
        if not isinstance(buffer, list):
            return buffer
        return buffer[(t + (1 if version == "next" else 0)) % 2]

    # ---- the run --------------------------------------------------------------------------------
    def load(self, params: Params) -> None:
        """Pack and upload the parameters (once; later runs reuse them)."""
        self.weights, self.vectors = self._upload_params(params)

    def run(self, params: Params | None, x, initial_states: dict | None = None, poison: bool = False, lengths=None):
        """x: (T, B, I) device array. Returns (outputs (T, B, H), {state: (L, B, H)}) as device arrays.

        params=None reuses the parameters of the last load(). lengths: (B,) the sequences' steps, which the kernels
        of a Program compiled with lengths take (engine/passes/lengths.py)."""
        plan, device = self.plan, self.device
        T, B, L = plan.steps, plan.batch, plan.network.num_layers
        if self.program.lengths != (lengths is not None):
            raise ValueError("the plan's kernels take lengths exactly when the run is given them")
        self.lengths = None if lengths is None else device.int32(lengths)
        self.layers = self._allocate(poison)
        if params is not None:
            self.load(params)
        self.inputs = [x.reshape(T * B, plan.network.input_size)]
        for layer in range(1, L):
            self.inputs.append(self.layers[layer - 1][self.program.output_buffer])
        self._init_states(self.layers, initial_states)
        device.synchronize()      # the set-up ran on the default stream; the layer streams do not wait for it
        pieces = self._project_ahead()
        done = {}
        for diagonal in plan.chunk_order():
            for layer, chunk in diagonal:
                with device.stream(layer):
                    if layer > 0:
                        device.wait(layer, done[(layer - 1, chunk)])
                    self._project(layer, chunk)
                    for t in plan.chunk_range(chunk):
                        if layer == 0 and t in pieces:
                            device.wait_ahead(pieces[t])
                        self._step(layer, t)
                    done[(layer, chunk)] = device.record(layer)
        device.synchronize()
        outputs = self.layers[-1][self.program.output_buffer].reshape(T, B, plan.network.output_size)
        final = {}
        for home in self.program.homes:
            per_layer = []
            for layer in range(L):
                buf = self._version(self.layers[layer][home.slot.buffer], "cur", T)
                per_layer.append(buf[:, slot_columns(home.slot, plan.layer_sizes(layer),
                                                     plan.network.state_size(home.state))])
            final[home.state] = device.xp.stack(per_layer)
        return outputs, final

    def _project_ahead(self) -> dict:
        """Layer 0's hoisted GEMMs in pieces of self.ahead steps on the device's projection stream, all issued before
        the first step: {a piece's first step: the event its steps wait for}. The steps of one piece then run while
        the next is projected (the steps leave the tensor cores mostly idle). {} where self.ahead is None. The first
        piece takes the whole GPU (nothing else runs yet); the device may plan the others for fewer SMs
        (projection_stream(shared=True): fused_modes' projection_sms, off by default)."""
        if self.ahead is None:
            return {}
        plan, device = self.plan, self.device
        B, pieces = plan.batch, {}
        for first in range(0, plan.steps, self.ahead):
            rows = slice(first * B, min(first + self.ahead, plan.steps) * B)
            with device.projection_stream(shared=first > 0):
                for gemm in self.program.hoisted_gemms:
                    weight, bias = self.weights[0][gemm.name]
                    self._gemm_bias(self.inputs[0][rows], weight, bias, self.layers[0][gemm.out_buffer][rows])
                pieces[first] = device.record_ahead()
        return pieces

    def _project(self, layer: int, chunk: int) -> None:
        """The hoisted GEMMs: layer 0 projects the whole sequence with its first chunk (or in pieces ahead:
        _project_ahead)."""
        plan = self.plan
        B = plan.batch
        if layer == 0:
            if chunk > 0 or self.ahead is not None:
                return
            rows = slice(0, plan.steps * B)
        else:
            steps = plan.chunk_range(chunk)
            rows = slice(steps.start * B, steps.stop * B)
        for gemm in self.program.hoisted_gemms:
            weight, bias = self.weights[layer][gemm.name]
            out = self.layers[layer][gemm.out_buffer][rows]
            self._timed(layer, gemm.name, rows.start // B, self._gemm_bias, self.inputs[layer][rows], weight, bias, out)

    def _step(self, layer: int, t: int) -> None:
        sizes = self.plan.layer_sizes(layer)
        for kind, item in self.order:
            if kind == "gemm":
                self._step_gemm(layer, item, t)
                continue
            args = self._kernel_args(layer, item, t)
            if self.program.lengths:
                args.append(self.lengths)
            self._timed(layer, item.name, t, self.device.launch, item, args, t, self.plan.batch, sizes)

    def _step_gemm(self, layer: int, item, t: int) -> None:
        buffers = self.layers[layer]
        weight, _ = self.weights[layer][item.name]
        operands = self._version(buffers[item.in_buffer], "cur", t)
        self._timed(layer, item.name, t, self.device.gemm, operands, weight, buffers[item.out_buffer])

    def _kernel_args(self, layer: int, item, t: int) -> list:
        """A step kernel's pointer arguments at step t, in its params' order."""
        buffers = self.layers[layer]
        args = []
        for p in item.params:
            if p.kind == "param":
                args.append(self.vectors[layer][p.source])
            elif p.source == self.program.input_buffer:
                args.append(self.inputs[layer])
            else:
                args.append(self._version(buffers[p.source], p.version, t))
        return args

    def _gemm_bias(self, operands, weight, bias, out) -> None:
        self.device.gemm(operands, weight, out)
        if bias is not None:
            self.device.add_bias(out, bias)

    def _timed(self, layer: int, name: str, t: int, work, *args) -> None:
        """work(*args); with a device whose `trace` is a list, bracketed in timing events on the layer's stream.
        A plain call when not tracing: this runs for every launch of every step."""
        trace = getattr(self.device, "trace", None)
        if trace is None:
            work(*args)
            return
        start = self.device.record(layer, timing=True)
        work(*args)
        trace.append((name, layer, t, start, self.device.record(layer, timing=True)))


def plan_bytes(plan: Plan, untouched=frozenset()) -> int:
    """Device memory the run allocates: buffers (but those in `untouched`, one element each), packed weights,
    parameter vectors and the input."""
    program, network = plan.program, plan.network
    T, B = plan.steps, plan.batch
    total = T * B * network.input_size
    for layer in range(network.num_layers):
        sizes = network.layer_sizes(layer)
        for buf in program.buffers:
            if buf.name == program.input_buffer or buf.name in untouched:
                continue
            rows = T * B if buf.rows == "sequence" else B
            total += rows * buf.cols(sizes) * (2 if buf.double else 1)
        for g in program.gemms:
            total += g.n(sizes) * g.k(sizes) + (g.n(sizes) if g.has_bias else 0)
        for name in program.kernel_params:
            total += sizes[network.cell[name].attr("dim", "H")]
    return total * FLOAT_BYTES


def fitting_plan(cupy, network: Network, T: int, B: int, options: dict, lengths: bool) -> tuple[Plan, int]:
    """(the fused plan at (T, B) with `options` (passes, layout, chunk_steps), the device bytes it needs), checked
    to fit the current GPU's free memory (a named error otherwise)."""
    plan = make_plan(network, T, B, options["passes"], layout=options["layout"], chunk_steps=options["chunk_steps"],
                     lengths=lengths)
    needed = plan_bytes(plan)
    check_fits(needed, f"backend 'fused' with T={T}, B={B}, L={network.num_layers}, H={network.hidden_size}",
               "x's steps and batch, hidden_size", on="device", limit=available_device_bytes(cupy),
               hint="run fewer steps or a smaller batch at a time")
    return plan, needed


class CupyDevice:
    """CuPy arrays, cuBLAS through cupy.matmul, generated kernels from one RawModule, a stream per layer."""

    def __init__(self, cupy, module, num_layers: int, streams: bool, projection: bool = False):
        self.xp = cupy
        self.projection = projection       # the kernels take P too (codegen.cuda: cells with projected states)
        self.module = module
        self.functions: dict = {}
        self.streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(num_layers)] if streams else None
        self.trace: list | None = None     # a list turns on per-stage timing events (engine.bench.timeline)

    def full(self, shape, value):
        return self.xp.full(shape, value, dtype=self.xp.float32)

    def asarray(self, value):
        return self.xp.ascontiguousarray(self.xp.asarray(value, dtype=self.xp.float32))

    def int32(self, values):
        return self.xp.asarray(values, dtype=self.xp.int32)

    def gemm(self, x, weight_t, out):
        self.xp.matmul(x, weight_t, out=out)          # (M, K) @ (K, N) -> (M, N), cuBLAS

    def add_bias(self, out, bias):
        out += bias

    def launch(self, kernel, args, t: int, batch: int, sizes: dict) -> None:
        function, grid, arguments = self.launch_arguments(kernel, args, t, batch, sizes)
        function(grid, (THREADS_PER_BLOCK,), arguments)

    def launch_arguments(self, kernel, args, t: int, batch: int, sizes: dict) -> tuple:
        """(the kernel's RawKernel, its grid, its whole argument tuple) for a launch at step t: the pointers, then
        t, B and the layer's sizes; blocks of THREADS_PER_BLOCK."""
        function = self.functions.get(kernel.name)
        if function is None:
            function = self.functions[kernel.name] = self.module.get_function(kernel.name)
        total = batch * sizes[kernel.dim]
        blocks = max(1, min(-(-total // THREADS_PER_BLOCK), MAX_BLOCKS))
        sizes_args = (np.int32(sizes["I"]), np.int32(sizes["H"]))
        if self.projection:
            sizes_args += (np.int32(sizes["P"]),)
        return function, (blocks,), tuple(args) + (np.int32(t), np.int32(batch)) + sizes_args

    def stream(self, layer: int):
        if self.streams is None:
            return _NoStream()
        return self.streams[layer]

    def record(self, layer: int, timing: bool = False):
        event = self.xp.cuda.Event(disable_timing=not timing)
        event.record(self.streams[layer] if self.streams else None)
        return event

    def wait(self, layer: int, event) -> None:
        if self.streams is not None:
            self.streams[layer].wait_event(event)

    def synchronize(self) -> None:
        if self.streams:
            for s in self.streams:
                s.synchronize()
        self.xp.cuda.get_current_stream().synchronize()


class _NoStream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FusedProgram:
    """A network with its parameters uploaded once; run(x) can then be called (and timed) many times.

    The plan, the compiled module and the packed weights are built for the (T, B) of the first x and
    rebuilt only when a later x has another (T, B)."""

    def __init__(self, network: Network, params: Params, dtype=np.float32, *, passes=None,
                 layout: str = "blocked", chunk_steps: int | None = None):
        check_float32_gpu_program("backend 'fused'", network, params, dtype)
        network, params = dense(network, params)      # heads as block-diagonal weights, reductions as matmuls
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        self.cupy, self.network, self.params = cupy, network, params
        self.options = dict(passes=passes, layout=layout, chunk_steps=chunk_steps)
        self._shape = None
        self._executor = None

    def executor(self, T: int, B: int, lengths: bool = False) -> Executor:
        """The executor for (T, B), its kernels compiled to take lengths or not."""
        if self._shape != (T, B, lengths):
            cupy, network = self.cupy, self.network
            plan, needed = fitting_plan(cupy, network, T, B, self.options, lengths)
            module = compile_module(plan.program)
            device = CupyDevice(cupy, module, network.num_layers,
                                streams=network.num_layers > 1 and plan.num_chunks > 1,
                                projection=network.cell.uses_projection)
            executor = Executor(plan, device)
            executor.load(self.params)
            executor.bytes = needed
            self._shape, self._executor = (T, B, lengths), executor
        return self._executor

    def run(self, x, initial_states: dict | None = None, *, poison: bool = False, lengths=None) -> RunResult:
        """x: (T, B, I), NumPy or CuPy. CuPy arrays come back when x is CuPy, NumPy otherwise.
        poison=True fills every work buffer with NaN first (tests). lengths: (B,) the steps of each sequence of a
        batch padded at the end (engine/backends/lengths.py)."""
        cupy, network = self.cupy, self.network
        check_gpu_run_inputs("backend 'fused'", cupy, network, x, initial_states)
        T, B, _ = x.shape
        steps = check_lengths(lengths, int(T), int(B))
        executor = self.executor(int(T), int(B), steps is not None)
        on_gpu = isinstance(x, cupy.ndarray)
        x_device = executor.device.asarray(x)
        outputs, final = executor.run(None, x_device, initial_states, poison=poison, lengths=steps)
        if not on_gpu:
            outputs = cupy.asnumpy(outputs)
            final = {k: cupy.asnumpy(v) for k, v in final.items()}
        plan = executor.plan
        info = {"launches_per_step": plan.launches_per_step, "chunk_steps": plan.chunk_steps,
                "program": plan.program.key, "bytes": executor.bytes, "lengths": plan.program.lengths}
        return RunResult(outputs=outputs, final_states=final, backend="fused", info=info)


def prepare(network: Network, params: Params, dtype=np.float32, *, passes=None, layout: str = "blocked",
            chunk_steps: int | None = None) -> FusedProgram:
    """Plan, compile and upload once; the result's run(x) is what the benchmark times."""
    return FusedProgram(network, params, dtype, passes=passes, layout=layout, chunk_steps=chunk_steps)


def run(network: Network, params: Params, x, initial_states: dict | None = None, dtype=np.float32, *,
        passes=None, layout: str = "blocked", chunk_steps: int | None = None, poison: bool = False,
        lengths=None) -> RunResult:
    """x: (T, B, I), NumPy or CuPy. initial_states: name -> (L, B, H), zeros where not given.

    passes/layout/chunk_steps select the plan (see engine.compiler.make_plan). poison=True fills every
    work buffer with NaN first, so a value read before it is written shows up in the result (tests).
    lengths: (B,) the steps of each sequence of a batch padded at the end (engine/backends/lengths.py).
    """
    program = prepare(network, params, dtype, passes=passes, layout=layout, chunk_steps=chunk_steps)
    return program.run(x, initial_states, poison=poison, lengths=lengths)
