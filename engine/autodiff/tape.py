"""The step-by-step reference of record and Tape.backward (backend "reference" on NumPy, "naive" through CuPy, op by
op): the forward pass runs engine.backends.reference.step layer by layer and keeps, for every step, the forward values
the backward graph reads (BackwardGraph.saved); the reverse pass interprets the backward graph: the top layer first,
t = T-1 .. 0, each step fed by d_outputs (top layer) or the input adjoints of the layer above, and by the states'
adjoints carried from step t+1. engine/autodiff/bptt.py chooses this or the fused step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.lengths import hold_past_end
from ..backends.reference import step
from ..network import Network
from .checks import start_backward
from .gradients import Gradients
from .hoist import BackwardSplit
from .step import backward_step


@dataclass
class Tape:
    """What the forward pass keeps for the reverse pass (record), and the reverse pass itself (backward)."""
    network: Network
    split: BackwardSplit                       # the backward graph (split.graph) and what runs where
    layer_params: list                         # [layer]: name -> array of the pass's dtype and array module
    saved: list[list[dict]]                    # [layer][t]: forward name -> value
    outputs: object                            # (T, B, output size)
    final_states: dict                         # name -> (L, B, size)
    dtype: type
    xp: object                                 # numpy or cupy
    used: bool = False
    masks: list | None = None                  # [t]: (B, 1), 1 within each sequence, 0 past its end (lengths=)
    precision: str = "float32"                 # the mode whose matmul rounding both passes emulate

    def backward(self, d_outputs=None, d_final_states: dict | None = None, input_gradient: bool = True) -> Gradients:
        """The gradients, given the loss's gradients with respect to the outputs (T, B, output size; None: zeros)
        and final states (name -> (L, B, size); None or names left out: zeros). input_gradient=False: gradients.x
        is None (the fast tapes leave its GEMM out; this interpreter drops it). Once: the saved values go."""
        d_outputs, d_final_states, finite = start_backward(self, d_outputs, d_final_states)
        finite.raise_if_bad()
        network, xp, dtype = self.network, self.xp, self.dtype
        T, B, _ = self.outputs.shape
        if d_outputs is None:
            d_outputs = xp.zeros((T, B, network.output_size), dtype=dtype)
        gradients = reverse(network, self, d_outputs.astype(dtype, copy=False), d_final_states, dtype, xp)
        if not input_gradient:
            gradients.x = None
        return gradients



def _initial_state(network: Network, initial_states: dict, name: str, layer: int, batch: int, dtype, xp):
    if name in initial_states:
        return initial_states[name][layer].copy()
    return xp.zeros((batch, network.state_size(name)), dtype=dtype)


def forward(network: Network, split: BackwardSplit, layer_params, x, initial_states, dtype, xp,
            masks: list | None = None, precision: str = "float32") -> Tape:
    """masks (engine/backends/lengths.py step_masks): past a sequence's end its states stay and its outputs are 0.
    precision: a mode of engine.codegen.precision, emulated: every matmul's operands rounded to its format (the
    reference's step), both ways (the backward's matmuls too: engine/autodiff/step.py)."""
    cell, graph = network.cell, split.graph
    T, B, _ = x.shape
    # Parameters and constants are read from layer_params and the graph; only per-step values are kept.
    per_step = [n for n in graph.saved if not (cell[n].is_param or cell[n].op == "const")]
    constants = {n: dtype(cell[n].attr("value")) for n in graph.saved if cell[n].op == "const"}
    saved: list[list[dict[str, np.ndarray]]] = []
    finals: list[dict[str, np.ndarray]] = []
    layer_in = x                                                          # (T, B, I)
    for layer in range(network.num_layers):
        states = {s: _initial_state(network, initial_states, s, layer, B, dtype, xp) for s in cell.state_names}
        out = xp.empty((T, B, network.output_size), dtype=dtype)
        steps = []
        for t in range(T):
            next_states, values = step(cell, layer_params[layer], layer_in[t], states, dtype, precision)
            steps.append({**{n: values[n] for n in per_step}, **constants})
            if masks is not None:
                next_states = hold_past_end(next_states, states, masks[t], xp)
            states = next_states
            out[t] = states[cell.output] if masks is None else xp.where(masks[t] > 0, states[cell.output], 0)
        saved.append(steps)
        finals.append(states)
        layer_in = out
    final_states = {s: xp.stack([finals[l][s] for l in range(network.num_layers)]) for s in cell.state_names}
    return Tape(network, split, layer_params, saved, layer_in, final_states, dtype, xp, masks=masks,
                precision=precision)


def reverse(network: Network, tape: Tape, d_outputs, d_final_states: dict, dtype, xp) -> Gradients:
    """Layer by layer from the top: the reverse sweep over t runs the split's per-step nodes (what the states'
    adjoints at t-1 need) and keeps the values the rest reads; then the rest runs once on T x B rows (the weight
    gradients as one product a matmul, the input's adjoint for the layer below, the bias sums)."""
    cell, split, layer_params = network.cell, tape.split, tape.layer_params
    graph = split.graph
    T, B, _ = d_outputs.shape
    L = network.num_layers
    grads = [{p.name: xp.zeros(network.param_shape(l, p.name), dtype=dtype) for p in cell.params} for l in range(L)]
    d_initial = {s: xp.empty((L, B, network.state_size(s)), dtype=dtype) for s in cell.state_names}
    d_above = d_outputs                                                   # (T, B, output size)
    for layer in reversed(range(L)):
        carry = {s: (d_final_states[s][layer].astype(dtype) if s in d_final_states
                     else xp.zeros((B, network.state_size(s)), dtype=dtype)) for s in cell.state_names}
        kept: dict[str, object] = {}                                      # name -> (T, B, size)
        for t in reversed(range(T)):
            # Past a sequence's end a step is the identity on its states and its output is 0: the states'
            # adjoints pass through it, and the cell sees no adjoint there (so it adds nothing to any gradient).
            mask = None if tape.masks is None else tape.masks[t]
            passed = None if mask is None else {s: carry[s] * (1 - mask) for s in carry}
            incoming = {graph.output_input: d_above[t] if mask is None else d_above[t] * mask,
                        **{graph.carry_input(s): carry[s] if mask is None else carry[s] * mask for s in carry}}
            values = backward_step(graph, tape.saved[layer][t], layer_params[layer], incoming, grads[layer], dtype,
                                   split.per_step, tape.precision)
            for name in split.recorded:
                value = values[name]
                if name not in kept:
                    kept[name] = xp.empty((T, B) + tuple(value.shape[-1:]), dtype=dtype)
                kept[name][t] = value
            carry = {s: values[name] if name else xp.zeros_like(carry[s]) for s, name in graph.state_adjoints}
            if passed is not None:
                carry = {s: carry[s] + passed[s] for s in carry}
        rows = {name: value.reshape(T * B, -1) for name, value in kept.items()}           # row t * B + b
        values = backward_step(graph, _stacked(cell, tape.saved[layer], split.saved_after, B, xp),
                               layer_params[layer], rows, grads[layer], dtype, split.after, tape.precision)
        d_in = (values[graph.input_adjoint].reshape(T, B, -1) if graph.input_adjoint is not None
                else xp.zeros((T, B, network.layer_input_size(layer)), dtype=dtype))
        tape.saved[layer] = []                      # no layer below reads them: free the memory as we go
        for s in cell.state_names:
            d_initial[s][layer] = carry[s]
        d_above = d_in
    return Gradients(params=grads, x=d_above, initial_states=d_initial, outputs=tape.outputs,
                     final_states=tape.final_states)


def _stacked(cell, saved_steps: list[dict], names: tuple[str, ...], batch: int, xp) -> dict:
    """The forward values `names` of every step as (T x B, size) rows, row t * B + b; constants (and values of
    parameters alone, the same at every step) as they are."""
    stacked = {}
    for name in names:
        if cell[name].is_param:
            continue                                  # read from the layer's parameters
        first = saved_steps[0][name]
        if getattr(first, "ndim", 0) == 2 and first.shape[0] == batch:
            stacked[name] = xp.stack([step[name] for step in saved_steps]).reshape(len(saved_steps) * batch, -1)
        else:
            stacked[name] = first
    return stacked
