"""Backend "fused" of engine.autodiff.record / bptt: the training step as cuBLAS GEMMs and generated kernels.

Plan (engine/autodiff/fused_plan.py) -> CUDA (engine/autodiff/fused_codegen.py) -> this module, which allocates a
layer's buffers, stacks each GEMM's weights, and launches, fp32 on the GPU:

    forward, layer by layer:   the hoisted GEMM over T x B rows; then t = 0 .. T-1: [GEMM, kernel] per stage
    backward, top layer first: t = T-1 .. 0: [kernel, GEMM] per stage; then the split's `after` part on T x B rows
                               (engine.autodiff.step.backward_step through CuPy: one GEMM per weight gradient over
                               every step, one per input adjoint, one sum per bias)

The GEMMs go straight to cuBLAS's sgemm on CuPy's handle and the current stream (strict fp32: the handle's default
math mode, no TF32), so a sum of a GEMM's terms and elementwise ones is one GEMM with beta = 1. The values live in
per-layer buffers at row (t + shift) * B + b, so nothing is copied between steps and the backward reads the
forward's values where the forward wrote them.
"""
from __future__ import annotations

import threading

import numpy as np

from ..ir import SCALAR
from ..ops import apply_elementwise
from .fused_codegen import THREADS, kernel_params, render_module
from .fused_plan import (D_OUTPUT_BUFFER, INPUT_BUFFER, GemmPlan, KernelPlan, Place, TrainingPlan, adjoint_buffer,
                         state_buffer, training_plan)
from .step import backward_step

MAX_BLOCKS = 65535
_modules: dict = {}
_lock = threading.Lock()


def module_for(plan: TrainingPlan):
    """The compiled module of the plan's kernels (IEEE fp32 through engine/codegen/nvrtc.py), cached by source."""
    import cupy
    from ..codegen.nvrtc import load_module

    source = render_module(plan)
    key = (source, cupy.cuda.Device().id)
    with _lock:
        module = _modules.get(key)
    if module is None:
        module = load_module(source)
        for k in plan.forward.kernels + plan.backward.kernels:
            module.get_function(k.name)
        with _lock:
            _modules[key] = module
    return module


class Sgemm:
    """Row-major GEMMs on raw pointers through cuBLAS's sgemm (CuPy's handle, the current stream, host scalars)."""

    def __init__(self, cupy):
        from cupy_backends.cuda.libs import cublas
        self.cublas = cublas
        self.handle = cupy.cuda.device.get_cublas_handle()
        self.scalars = np.array([1.0, 0.0], dtype=np.float32)       # alpha, beta = 0 / alpha, beta = 1 below
        self.one = self.scalars.ctypes.data
        self.zero = self.one + 4

    def bind(self, stream_ptr: int) -> None:
        cublas = self.cublas
        cublas.setStream(self.handle, stream_ptr)
        cublas.setPointerMode(self.handle, cublas.CUBLAS_POINTER_MODE_HOST)

    def __call__(self, a: int, lda: int, w: int, ldw: int, c: int, ldc: int, m: int, n: int, k: int,
                 w_transposed: bool, accumulate: bool) -> None:
        """C (m x n, ldc) (+)= A (m x k, lda) @ W^T (W: n x k, ldw) if w_transposed else A @ W (W: k x n, ldw)."""
        cublas = self.cublas
        op = cublas.CUBLAS_OP_T if w_transposed else cublas.CUBLAS_OP_N
        cublas.sgemm(self.handle, op, cublas.CUBLAS_OP_N, n, m, k, self.one, w, ldw, a, lda,
                     self.one if accumulate else self.zero, c, ldc)


class Layer:
    """One layer's buffers, stacked weights and parameter vectors for a (T, B)."""

    def __init__(self, cupy, plan: TrainingPlan, sizes: dict, T: int, B: int, params: dict, static: dict,
                 poison: bool):
        self.sizes, self.T, self.B = sizes, T, B
        fill = np.nan if poison else 0.0
        self.buffers = {}
        for buf in plan.buffers:
            if buf.name in (INPUT_BUFFER, D_OUTPUT_BUFFER):
                continue                                   # bound to the layer's input / the incoming adjoint
            rows = (T + 1 if buf.blocks == "T+1" else T) * B
            zero = buf.name.startswith("dstate_")          # a state adjoint never written stays zero
            self.buffers[buf.name] = cupy.full((rows, buf.cols.value(sizes)), 0.0 if zero else fill,
                                               dtype=cupy.float32)
        for name, value in params.items():
            if value.ndim == 1:
                self.buffers[f"param_{name}"] = value
        self.buffers.update({f"static_{n}": v for n, v in static.items()})
        self.stacked = {}
        for g in plan.forward.gemms + plan.backward.gemms:
            if g.weights not in self.stacked:
                self.stacked[g.weights] = cupy.ascontiguousarray(
                    cupy.concatenate([params[w] for w in g.weights], axis=0))   # (sum of rows, cols)

    def view(self, place: Place, size: int):
        """A value of every step as (T x B, size) rows: a view of its buffer."""
        buf = self.buffers[place.buffer]
        B, T = self.B, self.T
        start = place.offset.value(self.sizes)
        return buf[place.shift * B:(place.shift + T) * B, start:start + size]


class Runner:
    """Launches a plan's GEMMs and kernels for one layer at a time, on the GPU (engine/autodiff/fused_numpy.py: the
    same plan run by NumPy, for the CPU tests)."""

    def __init__(self, cupy, plan: TrainingPlan):
        self.xp, self.plan = cupy, plan
        module = module_for(plan)
        self.functions = {k.name: module.get_function(k.name) for k in plan.forward.kernels + plan.backward.kernels}
        self.params = {k.name: kernel_params(k) for k in plan.forward.kernels + plan.backward.kernels}
        self.sgemm = Sgemm(cupy)

    def kernel(self, layer: Layer, kernel: KernelPlan, t: int) -> None:
        sizes, B = layer.sizes, layer.B
        total = B * sizes[kernel.dim]
        blocks = max(1, min(-(-total // THREADS), MAX_BLOCKS))
        args = tuple(layer.buffers[p] for p in self.params[kernel.name])
        self.functions[kernel.name]((blocks,), (THREADS,), args + (
            np.int32(t), np.int32(B), np.int32(sizes["I"]), np.int32(sizes["H"]), np.int32(sizes["P"])))

    def gemm(self, layer: Layer, g: GemmPlan, t: int, forward: bool) -> None:
        sizes, B = layer.sizes, layer.B
        rows = layer.T * B if g.hoisted else B
        block = 0 if g.hoisted else t

        def pointer(place: Place):
            buf = layer.buffers[place.buffer]
            cols = buf.shape[1]
            offset = ((block + place.shift) * B) * cols + place.offset.value(sizes)
            return buf.data.ptr + 4 * offset, cols

        a, lda = pointer(g.operand)
        c, ldc = pointer(g.out)
        w = layer.stacked[g.weights]
        k, n = g.k.value(sizes), g.n.value(sizes)
        # forward: out = operand @ W^T (W stacked: n x k); backward: out (+)= dy @ W (W stacked: k x n)
        self.sgemm(a, lda, w.data.ptr, w.shape[1], c, ldc, rows, n, k, w_transposed=forward,
                   accumulate=g.accumulate)

    def bind(self) -> None:
        self.sgemm.bind(self.xp.cuda.get_current_stream().ptr)

    def forward(self, layer: Layer) -> None:
        self.bind()
        for g in self.plan.forward.hoisted:
            self.gemm(layer, g, 0, forward=True)
        order = self.plan.forward.order
        for t in range(layer.T):
            for kind, item in order:
                if kind == "gemm":
                    self.gemm(layer, item, t, forward=True)
                else:
                    self.kernel(layer, item, t)

    def backward(self, layer: Layer) -> None:
        self.bind()
        order = self.plan.backward.order
        for t in reversed(range(layer.T)):
            for kind, item in order:
                if kind == "gemm":
                    self.gemm(layer, item, t, forward=False)
                else:
                    self.kernel(layer, item, t)


def static_values(cupy, cell, plan: TrainingPlan, params: dict, sizes: dict) -> dict:
    """The values of parameters alone (the same at every step and row), as vectors; a number as a full vector."""
    values: dict = {}
    width = max(sizes.values())
    for name in plan.static:
        node = cell[name]
        args = [params.get(a, values.get(a)) if not cell[a].op == "const" else np.float32(cell[a].attr("value"))
                for a in node.args]
        if node.op == "matmul":
            value = args[0] @ args[1]
        else:
            value = apply_elementwise(node.op, args, node.attr_dict)
        if cell.dims[name] == SCALAR:
            value = cupy.full((width,), float(value), dtype=cupy.float32)
        values[name] = cupy.ascontiguousarray(cupy.asarray(value, dtype=cupy.float32))
    return values


class FusedTape:
    """What record(backend="fused") returns: the outputs and final states now, the gradients from backward()."""

    def __init__(self, network, plan: TrainingPlan, layers: list[Layer], layer_params: list[dict], outputs,
                 final_states: dict, runner: Runner):
        self.network, self.plan, self.split = network, plan, plan.split
        self.layers, self.layer_params, self.runner = layers, layer_params, runner
        self.outputs, self.final_states = outputs, final_states
        self.dtype, self.xp, self.used = np.float32, runner.xp, False

    def backward(self, d_outputs=None, d_final_states: dict | None = None):
        from .bptt import Gradients
        from .checks import check_d_final_states, check_d_outputs
        from .errors import AutodiffError
        if self.used:
            raise AutodiffError("this tape's backward pass has run already, and its saved forward values are gone",
                                hint="record the forward pass again (engine.autodiff.record) for another backward")
        cupy, network, plan = self.xp, self.network, self.plan
        T, B, _ = self.outputs.shape
        d_outputs = check_d_outputs(network, d_outputs, T, B, cupy)
        d_final_states = check_d_final_states(network, d_final_states, B, cupy)
        self.used = True
        if d_outputs is None:
            d_outputs = cupy.zeros((T, B, network.output_size), dtype=cupy.float32)
        cell, L = network.cell, network.num_layers
        grads = [{p.name: cupy.zeros(network.param_shape(l, p.name), dtype=cupy.float32) for p in cell.params}
                 for l in range(L)]
        d_initial = {s: cupy.empty((L, B, network.state_size(s)), dtype=cupy.float32) for s in cell.state_names}
        d_above = cupy.ascontiguousarray(cupy.asarray(d_outputs, dtype=cupy.float32)).reshape(T * B, -1)
        for l in reversed(range(L)):
            layer = self.layers[l]
            layer.buffers[D_OUTPUT_BUFFER] = d_above
            for s in cell.state_names:
                if s in d_final_states:
                    layer.buffers[adjoint_buffer(s)][T * B:] = cupy.asarray(d_final_states[s][l], dtype=cupy.float32)
            self.runner.backward(layer)
            d_above = self._after(layer, l, grads[l], d_initial)
            self.layers[l] = None                          # no layer below reads them: free the memory as we go
        return Gradients(params=grads, x=d_above.reshape(T, B, -1), initial_states=d_initial,
                         outputs=self.outputs, final_states=self.final_states)

    def _after(self, layer: Layer, l: int, grads: dict, d_initial: dict):
        """The split's `after` part on T x B rows; the input's adjoint (T x B, I) for the layer below."""
        cupy, network, plan = self.xp, self.network, self.plan
        cell, graph, split = network.cell, plan.split.graph, plan.split
        T, B, sizes = layer.T, layer.B, layer.sizes

        def size_of(forward_name):
            d = cell.dims[forward_name]
            return sizes[d] if d != SCALAR else 1

        dims = {n.name: n.of for n in graph.nodes} | {i.name: i.of for i in graph.inputs}
        rows = {name: layer.view(plan.back_places[name], size_of(dims[name])) for name in split.recorded}
        saved = {}
        for name in split.saved_after:
            if cell[name].is_param:
                continue                                   # read from the layer's parameters
            place = plan.places[name]
            if place.kind == "literal":
                saved[name] = np.float32(place.literal)
            elif place.kind == "vector":
                saved[name] = layer.buffers[place.buffer]
            else:
                saved[name] = layer.view(place, size_of(name))
        values = backward_step(graph, saved, self.layer_params[l], rows, grads, np.float32, split.after)
        for s in cell.state_names:
            d_initial[s][l] = layer.buffers[adjoint_buffer(s)][:B]
        if graph.input_adjoint is None:
            return cupy.zeros((T * B, network.layer_input_size(l)), dtype=cupy.float32)
        return cupy.ascontiguousarray(values[graph.input_adjoint].reshape(T * B, -1))


def record(network, params, x, initial_states: dict | None, poison: bool = False, runner=None) -> FusedTape:
    """The forward pass on the fused training step (fp32, the GPU; runner: fused_numpy.NumpyRunner runs the same plan
    through NumPy). Inputs already checked by bptt.record."""
    if runner is None:
        import cupy
        runner = Runner(cupy, training_plan(network.cell))
    cupy, plan = runner.xp, runner.plan
    cell = network.cell
    T, B, _ = x.shape
    layer_params = [{k: cupy.ascontiguousarray(cupy.asarray(v, dtype=cupy.float32)) for k, v in params[l].items()}
                    for l in range(network.num_layers)]
    layer_in = cupy.ascontiguousarray(cupy.asarray(x, dtype=cupy.float32)).reshape(T * B, -1)
    layers, finals = [], {s: [] for s in cell.state_names}
    for l in range(network.num_layers):
        sizes = network.layer_sizes(l)
        static = static_values(cupy, cell, plan, layer_params[l], sizes)
        layer = Layer(cupy, plan, sizes, T, B, layer_params[l], static, poison)
        layer.buffers[INPUT_BUFFER] = layer_in
        for s in cell.state_names:
            first = layer.buffers[state_buffer(s)][:B]
            if initial_states and s in initial_states:
                first[...] = cupy.asarray(initial_states[s][l], dtype=cupy.float32)
            else:
                first[...] = 0.0
        runner.forward(layer)
        for s in cell.state_names:
            finals[s].append(layer.buffers[state_buffer(s)][T * B:])
        layer_in = layer.buffers[state_buffer(cell.output)][B:]
        layers.append(layer)
    outputs = layer_in.reshape(T, B, -1)
    final_states = {s: cupy.stack(v) for s, v in finals.items()}
    return FusedTape(network, plan, layers, layer_params, outputs, final_states, runner)
