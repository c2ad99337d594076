"""Backend "fused" of engine.autodiff.record / bptt: the training step as cuBLAS GEMMs and generated kernels, fp32 on
the GPU. record() runs the forward and returns a FusedTape, whose backward() gives the Gradients:

    forward, a chunk of steps at a time:  the input GEMM over the chunk's rows; then per step [GEMM, kernel] a stage
    backward, the last chunk first:       per step [kernel, GEMM] a stage; then the chunk's input adjoint as one GEMM
                                          into the layer below's d_out
    after the sweep, a layer at a time:   the weight and bias gradients as one GEMM per operand (plan.grad_gemms), the
                                          rest of the split's `after` part through engine.autodiff.step on T x B rows

Plan (engine/autodiff/fused_planner.py) -> CUDA (fused_codegen.py) -> launches (fused_runner.py) on a layer's
buffers (fused_layer.py), a (network, T, B)'s as a Program (fused_program.py: CUDA graphs, the wavefront), cached
(fused_cache.py). WAVEFRONT = False runs the layers one after another instead of as a wavefront.

A precision mode (record(precision=...), TrainingPlan.precision) changes the GEMMs alone: their operands rounded to it
before cuBLAS (the runner), and the operands' rounding in the after part's interpreted matmuls (engine/autodiff/step.py); every buffer,
kernel and the rest of the math stay fp32. Fused stages (stage_fusion) then stay apart, and of the persistent launches
(persistent.py) only the head-local ones are taken, whose GEMMs round their operands to the mode
(persistent_heads.py); the others multiply in fp32.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..backends.common import check_precision
from ..dense import compact_gradients, dense
from ..dims import SCALAR
from ..errors import BackendError
from .checks import start_backward
from .fused_cache import acquire, gpu_runner
from .fused_gradients import gradient_views, zero_gradients
from .fused_layer import Layer
from .fused_plan import D_OUTPUT_BUFFER
from .fused_planner import training_plan
from .fused_program import Program
from .gradients import Gradients
from .step import backward_step

WAVEFRONT = True         # the layers as a wavefront both ways (Program(wavefront=...)): faster on the H100 at every
                         # anchor timed (benchmarks/NOTES.md, 2026-11-24 22:25); False: layer by layer


class FusedTape:
    """What record(backend="fused") returns: the outputs and final states now (copies: the program's buffers are
    reused by the next record), the gradients from backward()."""

    def __init__(self, network, program: Program, outputs, final_states: dict, source=None, within=None):
        self.network, self.program, self.plan = network, program, program.runner.plan
        self.within = within            # lengths=: (T x B, 1), whether step t lies within sequence b
        self.source = network if source is None else source      # the network whose parameters the gradients are of
        self.split = self.plan.split
        self.outputs, self.final_states = outputs, final_states
        self.dtype, self.xp, self.used = np.float32, program.runner.xp, False
        self._release = weakref.finalize(self, program.release)     # a tape dropped unused frees its program

    def backward(self, d_outputs=None, d_final_states: dict | None = None, input_gradient: bool = True):
        """As Tape.backward; input_gradient=False: x's gradient is not computed (layer 0's input adjoint GEMM is
        left out), gradients.x is None."""
        d_outputs, d_final_states, finite = start_backward(self, d_outputs, d_final_states)
        release = True
        try:
            self.program.input_gradient = input_gradient
            gradients = self._backward(d_outputs, d_final_states)     # x None where not asked (_x_gradient, _after)
            if self.source is not self.network:      # the dense form's: back to the cell's own parameters and shapes
                gradients.params = compact_gradients(self.source, gradients.params)
            try:                   # asked once the backward is queued: the GPU runs it meanwhile
                finite.raise_if_bad()
            except BackendError:   # the forward's values are intact: the tape can take a corrected gradient
                self.used, release = False, False
                raise
            return gradients
        finally:
            if release:
                self._release()

    def _backward(self, d_outputs, d_final_states: dict):
        xp, network, program = self.xp, self.network, self.program
        T, B, _ = self.outputs.shape
        cell, L = network.cell, network.num_layers
        d_above = None if d_outputs is None else xp.asarray(d_outputs, dtype=xp.float32).reshape(T * B, -1)
        if d_above is not None and self.within is not None:      # the loss's gradient past the ends is ignored
            d_above = xp.where(self.within, d_above, xp.float32(0))
        if program.captures_after():              # the reverse wavefront and a captured after part
            return self._backward_captured(d_above, d_final_states)
        grads, self.stacked_grads = zero_gradients(xp, network)
        d_initial = {s: xp.empty((L, B, network.state_size(s)), dtype=xp.float32) for s in cell.state_names}
        if program.d_input is not None:           # every layer's backward and input adjoint, then the rest
            return self._backward_in_program(d_above, d_final_states, grads, d_initial)
        for l in reversed(range(L)):
            layer = program.layers[l]
            layer.buffers[D_OUTPUT_BUFFER][...] = 0.0 if d_above is None else d_above
            self._seed_states(layer, l, d_final_states)
            program.launch(l, "backward")
            d_above = self._after(layer, l, grads[l], d_initial)
        return Gradients(params=grads, x=None if d_above is None else d_above.reshape(T, B, -1),
                         initial_states=d_initial,
                         outputs=self.outputs, final_states=self.final_states)

    def _x_gradient(self):
        """x's gradient out of the program's buffer (a copy: the buffer serves the next record), where asked."""
        program = self.program
        if not program.input_gradient:
            return None
        return self.xp.array(program.d_input).reshape(program.T, program.B, -1)

    def _reverse_sweep(self, d_above, d_final_states: dict) -> None:
        """Every layer's backward and input adjoint (a reverse wavefront, or layer by layer from the top): the top
        layer's d_out and every layer's final state adjoints in, then the program's backward graphs."""
        program = self.program
        program.layers[-1].buffers[D_OUTPUT_BUFFER][...] = 0.0 if d_above is None else d_above
        for l, layer in enumerate(program.layers):
            self._seed_states(layer, l, d_final_states)
        program.backward()

    def _backward_in_program(self, d_above, d_final_states: dict, grads: list, d_initial: dict):
        program = self.program
        self._reverse_sweep(d_above, d_final_states)
        for l, layer in enumerate(program.layers):
            self._after(layer, l, grads[l], d_initial, nodes=self.plan.after_rest)
        return Gradients(params=grads, x=self._x_gradient(), initial_states=d_initial,
                         outputs=self.outputs, final_states=self.final_states)

    def _backward_captured(self, d_above, d_final_states: dict):
        """The reverse sweep, then the after part as one replayed graph (Program.after), its gradients and
        initial states' adjoints copied out of the program's buffers: one copy and a view a parameter instead of a
        cuBLAS call a GradGemm, a table upload a layer and a copy a state from Python (lstm_fgr at `lat`: 0.9 ms of
        host time a step; benchmarks/NOTES.md, 2026-11-25 02:13)."""
        xp, program = self.xp, self.program
        self._reverse_sweep(d_above, d_final_states)
        flat, _, d_initial = program.after()
        grads, _ = gradient_views(xp, self.network, flat.copy())
        return Gradients(params=grads, x=self._x_gradient(),
                         initial_states={s: v.copy() for s, v in d_initial.items()}, outputs=self.outputs,
                         final_states=self.final_states)

    def _seed_states(self, layer: Layer, l: int, d_final_states: dict) -> None:
        """Each state's adjoint entering layer l's last step: d_final_states, or zero."""
        xp, T = self.xp, layer.T
        for s in self.network.cell.state_names:
            last = layer.state(s, T, adjoint=True)
            last[...] = xp.asarray(d_final_states[s][l], dtype=xp.float32) if s in d_final_states else 0.0

    def _after(self, layer: Layer, l: int, grads: dict, d_initial: dict, nodes=None):
        """The split's `after` part on T x B rows (or `nodes` of it); the input's adjoint (T x B, I) for the layer
        below, when the after part computes it."""
        xp, network, plan = self.xp, self.network, self.plan
        cell, graph, split = network.cell, plan.split.graph, plan.split
        T, B, sizes = layer.T, layer.B, layer.sizes

        def size_of(forward_name):
            d = cell.dims[forward_name]
            return sizes[d] if d != SCALAR else 1

        todo = plan.after_layers if nodes is None else nodes
        skip = nodes is None and l == 0 and not self.program.input_gradient     # x's gradient not asked for
        if skip:
            todo = gradient_nodes(todo)
        read = {a for n in todo for a in n.args}              # views of what is read only (host time)
        if nodes is None and not skip:
            read.add(graph.input_adjoint)                     # returned; recorded when the step loop computes it
        dims = {n.name: n.of for n in graph.nodes} | {i.name: i.of for i in graph.inputs}
        rows = {name: layer.view(plan.back_places[name], size_of(dims[name])) for name in split.recorded
                if name in read}
        saved = {}
        for name in split.saved_after:
            if cell[name].is_param or name not in read:
                continue                                   # a parameter is read from the layer's parameters
            place = plan.places[name]
            if place.kind == "literal":
                saved[name] = np.float32(place.literal)
            elif place.kind == "vector":
                saved[name] = layer.buffers[place.buffer]
            else:
                saved[name] = layer.view(place, size_of(name))
        runner = self.program.runner
        runner.bind()
        for index, g in enumerate(plan.grad_gemms):       # the stacked weight and bias gradients, a GEMM each
            runner.grad_gemm(layer, g, self.stacked_grads[l][index])
        if plan.column_dots:                              # vector parameters' (peepholes'), one launch
            runner.column_dots(layer, plan.column_dots, grads)
        values = backward_step(graph, saved, layer.params, rows, grads, np.float32, todo, plan.precision,
                               plan.fixed_weights)
        for s in cell.state_names:
            d_initial[s][l] = layer.state(s, 0, adjoint=True)
        if nodes is not None or skip:
            return None
        if graph.input_adjoint is None:
            return xp.zeros((T * B, network.layer_input_size(l)), dtype=xp.float32)
        return xp.ascontiguousarray(values[graph.input_adjoint].reshape(T * B, -1))


def record(network, params, x, initial_states: dict | None, poison: bool = False, runner=None,
           wavefront: bool | None = None, finite=None, check_memory=None, lengths=None,
           precision: str | None = None) -> FusedTape:
    """The forward pass on the fused training step (fp32, the GPU; runner: fused_numpy.NumpyRunner runs the same plan
    through NumPy). wavefront: the layers' forward as a wavefront of chunks on a stream a layer (default WAVEFRONT).
    Inputs already checked by bptt.record but for finite, their FiniteCheck, asked once the forward is queued;
    check_memory, called before a new program is made (bptt.record's memory check). A cell of heads or reductions
    runs in its dense form (engine/dense.py); the gradients come back in the cell's own parameters and shapes.
    lengths: (B,) host integers, checked (engine/backends/lengths.py): the plan whose kernels hold the rows past their
    end (engine/autodiff/fused_lengths.py; a runner given must run such a plan), the outputs there 0. precision: the
    GEMMs' mode (the module's docstring; None: float32, or the mode of the runner given, whose plan holds it)."""
    source = network
    network, params = dense(network, params)
    if runner is None:
        runner = gpu_runner(training_plan(network.cell, lengths is not None, precision or "float32"))
    elif precision is not None and check_precision(precision) != runner.plan.precision:
        raise BackendError(f"record(precision={precision!r}) was given a runner whose plan runs "
                           f"{runner.plan.precision}; hint: make its plan with training_plan(..., "
                           f"precision={precision!r}), or leave precision out")
    xp, cell = runner.xp, network.cell
    T, B, _ = x.shape
    program = acquire(network, runner, T, B, poison, WAVEFRONT if wavefront is None else wavefront, check_memory)
    try:
        program.load(params, x, initial_states, lengths)
        program.forward()
        if finite is not None:
            finite.raise_if_bad()
    except BaseException:
        program.release()
        raise
    outputs = xp.array(program.layers[-1].output()).reshape(T, B, -1)   # copies: the buffers serve the next record
    within = None
    if lengths is not None:         # the layer's output past a sequence's end holds its state: the outputs are 0 there
        within = xp.arange(T, dtype=np.int32)[:, None] < program.lengths[None, :]
        outputs = xp.where(within[:, :, None], outputs, xp.float32(0))
        within = within.reshape(T * B, 1)
    final_states = {s: xp.stack([layer.state(s, T) for layer in program.layers]) for s in cell.state_names}
    return FusedTape(network, program, outputs, final_states, source, within)


def gradient_nodes(nodes: tuple) -> tuple:
    """The part of an after part's nodes that the parameters' gradients need (the nodes that add into a gradient and
    what they read), in order: layer 0's, without the input's adjoint, where x's gradient is not asked for."""
    names, wanted, kept = {n.name for n in nodes}, set(), []
    for node in reversed(nodes):
        if node.accumulates or node.name in wanted:
            kept.append(node)
            wanted.update(a for a in node.args if a in names)
    return tuple(reversed(kept))
