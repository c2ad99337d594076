"""Backpropagation through time on the NumPy reference: gradients of a loss with respect to a network's
parameters, input and initial states, given the loss's gradients with respect to the outputs and final states.

The forward pass runs engine.backends.reference.step layer by layer and keeps, for every step, the forward values
the backward graph reads (BackwardGraph.saved). The reverse pass interprets the backward graph: the top layer
first, t = T-1 .. 0, each step fed by d_outputs (top layer) or the input adjoints of the layer above, and by the
states' adjoints carried from step t+1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.common import check_finite, check_inputs
from ..backends.reference import step
from ..network import Network
from ..params import Params, check_params
from .checks import check_bptt_memory, check_d_final_states, check_d_outputs, check_dtype, check_network
from .derive import backward_graph
from .graph import BackwardGraph
from .step import backward_step


@dataclass
class Gradients:
    params: list[dict[str, np.ndarray]]    # per layer: parameter name -> gradient, the parameter's shape
    x: np.ndarray                          # (T, B, I)
    initial_states: dict[str, np.ndarray]  # state name -> (L, B, size)
    outputs: np.ndarray                    # (T, B, output size): the forward outputs of the same pass
    final_states: dict[str, np.ndarray]    # state name -> (L, B, size): the forward final states


@dataclass
class _Tape:
    """What the forward pass keeps for the reverse pass."""
    saved: list[list[dict[str, np.ndarray]]]   # [layer][t]: forward name -> value
    outputs: np.ndarray                        # (T, B, output size)
    final_states: dict[str, np.ndarray]        # name -> (L, B, size)


def bptt(network: Network, params: Params, x: np.ndarray, initial_states: dict | None = None,
         d_outputs: np.ndarray | None = None, d_final_states: dict | None = None, dtype=np.float64) -> Gradients:
    """x: (T, B, I). initial_states: name -> (L, B, size), zeros where not given (as engine.run). d_outputs:
    (T, B, output size), the loss's gradient with respect to the top layer's outputs (None: zeros), or a function
    of the forward outputs (T, B, output size) that returns it: a loss that needs the outputs first (training) then
    costs one forward pass, not two. d_final_states: name -> (L, B, size) (None or names left out: zeros)."""
    dtype = check_dtype(dtype)
    network = check_network(network)
    check_params(network, params)
    x = check_inputs(network, x, initial_states, xp=np)
    T, B, _ = x.shape
    loss_gradient = d_outputs if callable(d_outputs) else None
    d_outputs = None if loss_gradient else check_d_outputs(network, d_outputs, T, B)
    d_final_states = check_d_final_states(network, d_final_states, B)
    check_finite(network, params, x, initial_states)
    graph = backward_graph(network.cell)
    check_bptt_memory(network, graph, T, B, np.dtype(dtype).itemsize)

    layer_params = [{k: np.asarray(v, dtype=dtype) for k, v in params[l].items()} for l in range(network.num_layers)]
    tape = _forward(network, graph, layer_params, x.astype(dtype), initial_states, dtype)
    if loss_gradient is not None:
        d_outputs = check_d_outputs(network, loss_gradient(tape.outputs), T, B)
    if d_outputs is None:
        d_outputs = np.zeros((T, B, network.output_size), dtype=dtype)
    return _reverse(network, graph, layer_params, tape, d_outputs.astype(dtype, copy=False), d_final_states, dtype)


def _initial_state(network: Network, initial_states: dict | None, name: str, layer: int, batch: int, dtype):
    if initial_states is not None and name in initial_states:
        return np.asarray(initial_states[name], dtype=dtype)[layer].copy()
    return np.zeros((batch, network.state_size(name)), dtype=dtype)


def _forward(network: Network, graph: BackwardGraph, layer_params, x: np.ndarray, initial_states, dtype) -> _Tape:
    cell = network.cell
    T, B, _ = x.shape
    # Parameters and constants are read from layer_params and the graph; only per-step values are kept.
    per_step = [n for n in graph.saved if not (cell[n].is_param or cell[n].op == "const")]
    constants = {n: dtype(cell[n].attr("value")) for n in graph.saved if cell[n].op == "const"}
    saved: list[list[dict[str, np.ndarray]]] = []
    finals: list[dict[str, np.ndarray]] = []
    layer_in = x                                                          # (T, B, I)
    for layer in range(network.num_layers):
        states = {s: _initial_state(network, initial_states, s, layer, B, dtype) for s in cell.state_names}
        out = np.empty((T, B, network.output_size), dtype=dtype)
        steps = []
        for t in range(T):
            next_states, values = step(cell, layer_params[layer], layer_in[t], states, dtype)
            steps.append({**{n: values[n] for n in per_step}, **constants})
            states = next_states
            out[t] = states[cell.output]
        saved.append(steps)
        finals.append(states)
        layer_in = out
    final_states = {s: np.stack([finals[l][s] for l in range(network.num_layers)]) for s in cell.state_names}
    return _Tape(saved, layer_in, final_states)


def _reverse(network: Network, graph: BackwardGraph, layer_params, tape: _Tape, d_outputs: np.ndarray,
             d_final_states: dict[str, np.ndarray], dtype) -> Gradients:
    cell = network.cell
    T, B, _ = d_outputs.shape
    L = network.num_layers
    grads = [{p.name: np.zeros(network.param_shape(l, p.name), dtype=dtype) for p in cell.params} for l in range(L)]
    d_initial = {s: np.empty((L, B, network.state_size(s)), dtype=dtype) for s in cell.state_names}
    d_above = d_outputs                                                   # (T, B, output size)
    for layer in reversed(range(L)):
        carry = {s: (d_final_states[s][layer].astype(dtype) if s in d_final_states
                     else np.zeros((B, network.state_size(s)), dtype=dtype)) for s in cell.state_names}
        d_in = np.zeros((T, B, network.layer_input_size(layer)), dtype=dtype)
        for t in reversed(range(T)):
            incoming = {graph.output_input: d_above[t], **{graph.carry_input(s): carry[s] for s in carry}}
            values = backward_step(graph, tape.saved[layer][t], layer_params[layer], incoming, grads[layer], dtype)
            carry = {s: values[name] if name else np.zeros_like(carry[s]) for s, name in graph.state_adjoints}
            if graph.input_adjoint is not None:
                d_in[t] = values[graph.input_adjoint]
        tape.saved[layer] = []                      # no layer below reads them: free the memory as we go
        for s in cell.state_names:
            d_initial[s][layer] = carry[s]
        d_above = d_in
    return Gradients(params=grads, x=d_above, initial_states=d_initial, outputs=tape.outputs,
                     final_states=tape.final_states)
