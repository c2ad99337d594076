"""A network's fused training step for one (T, B): every layer's memory (engine/autodiff/fused_layer.py) and the
step's launches, captured once as CUDA graphs and replayed. The layers run as a wavefront both ways
(engine/autodiff/wavefront.py: layer l's chunk of WAVEFRONT_CHUNK steps after the layer below's, a stream a layer),
launched as CUDA graphs of 1, 2, 4, ... diagonals; or layer by layer, a graph a layer and direction (a one-layer
network, WAVEFRONT off), where a layer's backward graph ends with its input adjoint's GEMM; a cell whose input adjoint is
not one GEMM leaves it to the interpreter after each layer's backward. A layer's steps may run as persistent launches
(engine/autodiff/persistent.py). The values live in per-layer buffers at row (t + shift) * B + b, so nothing is copied
between steps and the backward reads the forward's values where the forward wrote them; a step's inputs and
parameters go in with one launch of kernels/copy_pieces.cu. engine/autodiff/fused_cache.py keeps programs for reuse.
"""
from __future__ import annotations

import numpy as np

from .fused_gradients import gradient_layout, gradient_views
from .fused_layer import Layer, float32_contiguous
from .fused_plan import D_INPUT_BUFFER, D_OUTPUT_BUFFER, INPUT_BUFFER, LENGTHS
from .persistent import persistent_launch
from .stage_fusion import stage_weights
from .wavefront import backward_wavefront, diagonal_pieces, forward_wavefront

WAVEFRONT_CHUNK = 8      # steps a chunk of the wavefront


class Program:
    """A network's fused training step for one (T, B): every layer's persistent buffers, and each layer's forward
    and backward captured once as a CUDA graph and replayed (one launch instead of T x launches a step from Python).
    Where capture fails (a cuBLAS that refuses it), the same launches go one by one; `capture_error` says why. A
    program serves one tape at a time: `busy` from record until the tape's backward, or until the tape is dropped."""

    def __init__(self, network, runner, T: int, B: int, poison: bool, wavefront: bool = False):
        xp, cell = runner.xp, network.cell
        self.network, self.runner, self.T, self.B = network, runner, T, B
        self.wavefront = wavefront and network.num_layers > 1
        self.input = xp.full((T * B, network.input_size), np.nan if poison else 0.0, dtype=xp.float32)
        self.fused = runner.fuses(network, B)     # the steps run fused stages (engine/autodiff/stage_fusion.py)
        # lengths= (a plan made with them, engine/autodiff/fused_lengths.py): the (B,) steps of each sequence, which
        # every layer's kernels read beside their buffers; load() copies each call's in
        self.lengths = xp.full((B,), T, dtype=np.int32) if runner.plan.lengths else None
        self.layers: list[Layer] = []
        for l in range(network.num_layers):
            shapes = {p.name: network.param_shape(l, p.name) for p in cell.params}
            sizes = network.layer_sizes(l)
            layer = Layer(xp, runner.plan, sizes, shapes, T, B, poison, runner.scratch_size(sizes, B),
                          stage_weights(runner.stages, runner.interleaved) if self.fused else ())
            layer.fused, layer.interleaved = self.fused, runner.interleaved
            layer.buffers[INPUT_BUFFER] = self.input if l == 0 else self.layers[-1].output()
            if self.lengths is not None:
                layer.buffers[LENGTHS] = self.lengths
            self.layers.append(layer)
        if self.wavefront:
            runner.prepare_streams(network.num_layers)
        runner.prepare_rounding(self.layers)      # a reduced mode's rounded operands (engine/autodiff/cublas.py)
        # a layer's steps, chunk by chunk, as persistent launches each way where it qualifies
        # (engine/autodiff/persistent.py; PERSISTENT): all the GPU's SMs layer by layer, a share of them a layer in
        # the wavefront (they run at once)
        blocks = max(1, runner.sms // len(self.layers)) if self.wavefront and hasattr(runner, "sms") else \
            getattr(runner, "sms", 0)
        for layer in self.layers:
            layer.persistent = tuple(persistent_launch(runner, layer.sizes, B, blocks, forward)
                                     for forward in (True, False))
        # the x gradient, written by layer 0's input GEMM; each layer's input GEMM writes the d_out of the layer
        # below (backward()), in the wavefront and layer by layer alike
        self.d_input = None
        self.input_gradient = True                # backward(): layer 0's input adjoint (x's gradient) too
        if runner.plan.input_gemm is not None:
            self.d_input = xp.full((T * B, network.input_size), np.nan if poison else 0.0, dtype=xp.float32)
            for l, layer in enumerate(self.layers):
                layer.buffers[D_INPUT_BUFFER] = (self.d_input if l == 0 else
                                                 self.layers[l - 1].buffers[D_OUTPUT_BUFFER])
        self.graphs: dict = {}
        self.capture_error: str | None = None
        self.grad_flat = self.after_graph = self.after_error = None    # Program.after's buffers and graph
        self.initial_views = [{s: layer.state(s, 0) for s in cell.state_names} for layer in self.layers]
        self.copy_geometry = None                 # load()'s destinations (Runner.copy_geometry), once
        self.lay_out = runner.lay_out_table(self.layers)   # the fused-stage weights' lay-out (fixed addresses)
        self.busy = False
        arrays = [self.input] + ([self.d_input] if self.d_input is not None else [])
        arrays += [a for layer in self.layers for a in
                                 [*layer.buffers.values(), *layer.stacked.values(), *layer.stage_weights.values(),
                                  layer.scratch]]
        self.bytes = sum(a.nbytes for a in {id(a): a for a in arrays if a.base is None}.values())

    def release(self) -> None:
        self.busy = False

    @property
    def persistent(self) -> list | None:
        """Each layer's (forward, backward) persistent launches, None for a layer with neither; None where no layer
        has one (engine/autodiff/persistent.py)."""
        pairs = [layer.persistent if any(layer.persistent) else None for layer in self.layers]
        return pairs if any(pairs) else None

    def captures_after(self) -> bool:
        """Whether the wavefront's after part (weight and bias gradients, peepholes', the initial states' adjoints)
        runs as one captured graph into buffers of the program: on the GPU, where it is GEMMs and table launches alone
        (plan.after_rest empty: nothing left to the interpreter, whose CuPy calls allocate)."""
        return self.d_input is not None and self.runner.can_capture and not self.runner.plan.after_rest

    def after(self):
        """The after part of every layer as one graph (captured once, replayed): the gradients zeroed, each layer's
        GradGemms and column_dots launch into them, each state's adjoint entering step 0 into d_initial. Returns the
        program's (gradient buffer, per-layer {param: view}, {state: (L, B, size)}): the caller copies them out (the
        next backward of this program overwrites them)."""
        xp, runner, plan, network = self.runner.xp, self.runner, self.runner.plan, self.network
        if self.grad_flat is None:
            self.grad_flat = xp.zeros(max(gradient_layout(network)[0], 1), dtype=xp.float32)
            self.grad_views, self.grad_stacks = gradient_views(xp, network, self.grad_flat)
            self.d_initial = {s: xp.empty((len(self.layers), self.B, network.state_size(s)), dtype=xp.float32)
                              for s in network.cell.state_names}
            self.dot_tables = [runner.column_dots_table(layer, plan.column_dots, self.grad_views[l])
                               if plan.column_dots else None for l, layer in enumerate(self.layers)]
            runner.ones(self.T * self.B)                       # the bias GEMMs' other factor, made before capture
            self.bytes += self.grad_flat.nbytes + sum(a.nbytes for a in self.d_initial.values())

        def issue():
            runner.bind()
            self.grad_flat.fill(0.0)
            for l, layer in enumerate(self.layers):
                for index, g in enumerate(plan.grad_gemms):
                    runner.grad_gemm(layer, g, self.grad_stacks[l][index])
                if self.dot_tables[l] is not None:
                    runner.launch_column_dots(layer, self.dot_tables[l])
                for s in network.cell.state_names:
                    self.d_initial[s][l] = layer.state(s, 0, adjoint=True)
        stream = xp.cuda.get_current_stream()
        if stream.is_capturing():       # the caller captures a graph itself: the launches go into it
            issue()
            return self.grad_flat, self.grad_views, self.d_initial
        if self.after_graph is None and self.after_error is None and self.capture_error is None:
            try:
                self.after_graph = runner.capture(issue)
            except Exception as e:      # noqa: BLE001 - launched one by one instead, the step's graphs untouched
                self.after_error = f"{type(e).__name__}: {e}"
        if self.after_graph is not None:
            self.after_graph.launch(stream)
        else:
            issue()
        return self.grad_flat, self.grad_views, self.d_initial

    def load(self, params, x, initial_states: dict | None, lengths=None) -> None:
        """x, every layer's parameters and initial states into the program's buffers: one copy launch for all; and
        the lengths (B,), for a plan made with them."""
        xp, cell = self.runner.xp, self.network.cell
        if (lengths is None) != (self.lengths is None):
            raise ValueError("a program made with lengths takes them, and only it")
        if lengths is not None:
            self.lengths[...] = xp.asarray(lengths, dtype=np.int32)
        copies = [(self.input, float32_contiguous(xp, x))]
        for l, layer in enumerate(self.layers):
            copies += layer.load(cell, params[l])
            for s in cell.state_names:
                given = initial_states is not None and s in initial_states
                copies.append((self.initial_views[l][s],
                               float32_contiguous(xp, initial_states[s][l]) if given else None))
        if self.copy_geometry is None:            # the same destinations every call, in the same order
            self.copy_geometry = [self.runner.copy_geometry(target) for target, _ in copies]
        self.runner.copy(copies, self.copy_geometry)
        self.runner.lay_out_weights(self.layers, self.lay_out)
        self.runner.round_weights(self.layers)
        for layer in self.layers:
            for launch in layer.persistent:
                if launch is not None:
                    launch.lay_out(layer)

    def forward(self) -> None:
        """Every layer's forward: layer by layer, or as one wavefront over all layers (self.wavefront); with
        persistent launches (self.persistent), a launch a layer and chunk (Runner.forward_steps)."""
        if not self.wavefront:
            for l in range(len(self.layers)):
                self.launch(l, "forward")
            return
        self._wavefront("forward", forward_wavefront, self.runner.wavefront_forward)

    def backward(self) -> None:
        """Every layer's backward and input adjoint (needs self.d_input; layer 0's only where self.input_gradient,
        else x's gradient is left uncomputed): one reverse wavefront, or layer by layer
        from the top, a graph a layer (a one-layer network: its backward, then its input adjoint as one GEMM over
        the T x B rows, instead of the interpreter's matmul a term)."""
        if self.wavefront:
            self._wavefront("backward", backward_wavefront, self.runner.wavefront_backward)
            return
        for l in reversed(range(len(self.layers))):
            self.launch(l, "backward", input_adjoint=l > 0 or self.input_gradient)

    def _wavefront(self, direction: str, order, issue) -> None:
        """A wavefront of WAVEFRONT_CHUNK-step chunks, a graph per piece of diagonals (diagonal_pieces)."""
        C, L = WAVEFRONT_CHUNK, len(self.layers)
        chunks = [range(t, min(t + C, self.T)) for t in range(0, self.T, C)]
        skip = direction == "backward" and not self.input_gradient      # layer 0's input adjoint
        for k, piece in enumerate(diagonal_pieces(order(L, len(chunks)), L, len(chunks))):
            if skip:
                self._replay((direction, "wavefront", k, skip),
                             lambda piece=piece: issue(self.layers, chunks, piece, input_gradient=False))
            else:
                self._replay((direction, "wavefront", k), lambda piece=piece: issue(self.layers, chunks, piece))

    def launch(self, l: int, direction: str, input_adjoint: bool = False) -> None:
        """Layer l's forward or backward step loop (input_adjoint: the backward, then its input adjoint's GEMM): its
        graph replayed, or the launches one by one. One key a layer, direction and input adjoint."""
        layer, runner = self.layers[l], self.runner
        if direction == "forward":
            self._replay((l, direction), lambda: runner.forward(layer))
        else:
            self._replay((l, direction, input_adjoint), lambda: runner.backward(layer, input_adjoint))

    def _replay(self, key, issue) -> None:
        """issue() captured once into the graph `key` and replayed; issued directly where capture is not possible."""
        runner = self.runner
        if not runner.can_capture or self.capture_error is not None:
            issue()
            return
        stream = runner.xp.cuda.get_current_stream()
        if stream.is_capturing():        # the caller captures a graph itself: the launches go into it
            issue()
            return
        graph = self.graphs.get(key)
        if graph is None:
            try:
                graph = self.graphs[key] = runner.capture(issue)
            except Exception as e:      # a cuBLAS or driver that refuses stream capture: launch one by one
                self.capture_error = f"{type(e).__name__}: {e}"
                issue()
                return
        graph.launch(stream)
