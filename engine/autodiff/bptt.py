"""Backpropagation through time on the NumPy reference: gradients of a loss with respect to a network's
parameters, input and initial states, given the loss's gradients with respect to the outputs and final states.
backend="naive" runs the same interpreters on the GPU through CuPy, one array operation per node (a correct,
slow baseline for the generated backward kernels to come, and what the torch.nn.Module wrapper runs today).

The forward pass runs engine.backends.reference.step layer by layer and keeps, for every step, the forward values
the backward graph reads (BackwardGraph.saved). The reverse pass interprets the backward graph: the top layer
first, t = T-1 .. 0, each step fed by d_outputs (top layer) or the input adjoints of the layer above, and by the
states' adjoints carried from step t+1.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..backends.common import FiniteCheck, check_inputs, inputs_named
from ..backends.reference import step
from ..errors import BackendError
from ..network import Network
from ..params import Params, check_params
from .checks import check_bptt_memory, check_dtype, check_network, start_backward
from .derive import backward_graph
from .hoist import BackwardSplit, split_backward
from .step import backward_step


@dataclass
class Gradients:
    """NumPy arrays from backend="reference", CuPy arrays (on the GPU) from backend="naive"."""
    params: list[dict[str, np.ndarray]]    # per layer: parameter name -> gradient, the parameter's shape
    x: np.ndarray                          # (T, B, I)
    initial_states: dict[str, np.ndarray]  # state name -> (L, B, size)
    outputs: np.ndarray                    # (T, B, output size): the forward outputs of the same pass
    final_states: dict[str, np.ndarray]    # state name -> (L, B, size): the forward final states


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

    def backward(self, d_outputs=None, d_final_states: dict | None = None) -> Gradients:
        """The gradients, given the loss's gradients with respect to the outputs (T, B, output size; None: zeros)
        and final states (name -> (L, B, size); None or names left out: zeros). Once: the saved values go."""
        d_outputs, d_final_states, finite = start_backward(self, d_outputs, d_final_states)
        finite.raise_if_bad()
        network, xp, dtype = self.network, self.xp, self.dtype
        T, B, _ = self.outputs.shape
        if d_outputs is None:
            d_outputs = xp.zeros((T, B, network.output_size), dtype=dtype)
        return _reverse(network, self, d_outputs.astype(dtype, copy=False), d_final_states, dtype, xp)


# NumPy on the host; the same interpreter on the GPU through CuPy, op by op; the generated training step (fp32, GPU:
# engine/autodiff/fused.py)
BACKENDS = ("reference", "naive", "fused")


def bptt(network: Network, params: Params, x, initial_states: dict | None = None, d_outputs=None,
         d_final_states: dict | None = None, dtype=np.float64, backend: str = "reference") -> Gradients:
    """x: (T, B, I). initial_states: name -> (L, B, size), zeros where not given (as engine.run). d_outputs:
    (T, B, output size), the loss's gradient with respect to the top layer's outputs (None: zeros), or a function
    of the forward outputs (T, B, output size) that returns it: a loss that needs the outputs first (training) then
    costs one forward pass, not two. d_final_states: name -> (L, B, size) (None or names left out: zeros).
    backend="naive": the same interpreter on the GPU (CuPy arrays in, or NumPy ones copied over; CuPy arrays out).
    One call is record(...) then Tape.backward(...)."""
    tape = record(network, params, x, initial_states, dtype=dtype, backend=backend)
    if callable(d_outputs):
        d_outputs = d_outputs(tape.outputs)
    return tape.backward(d_outputs, d_final_states)


def record(network: Network, params: Params, x, initial_states: dict | None = None, dtype=np.float64,
           backend: str = "reference") -> "Tape":
    """The forward pass of bptt, keeping what its reverse pass reads: tape.outputs (T, B, output size) and
    tape.final_states now, the gradients later from tape.backward(d_outputs, d_final_states), once (the saved
    values are freed as it goes). What a torch.autograd.Function needs: forward now, backward when asked."""
    dtype = check_dtype(dtype)
    network = check_network(network)
    if backend == "fused" and dtype != np.float32:
        raise BackendError(f"bptt(backend='fused') runs in float32, got dtype={np.dtype(dtype).name}; "
                           "hint: dtype=np.float32, or backend='naive' for float64 on the GPU")
    xp = array_module(backend)
    if xp is np and type(x).__module__.split(".")[0] == "cupy":
        raise BackendError("argument 'x' is a CuPy array (on the GPU), and backend='reference' runs on the host; "
                           "hint: backend='naive' keeps it on the GPU, or pass x.get()")
    check_params(network, params)
    x = check_inputs(network, x, initial_states, xp=xp)
    T, B, _ = x.shape
    finite = FiniteCheck(inputs_named(network, params, x, initial_states))
    if backend != "fused":
        finite.raise_if_bad()
    split = derived(network.cell)

    def check_memory():
        check_bptt_memory(network, split, T, B, np.dtype(dtype).itemsize, on="host" if xp is np else "device")

    if backend == "fused":         # asks the check once the forward is queued: the GPU runs it meanwhile
        from . import fused        # the memory check where a program is made (a cached one holds its memory)
        return fused.record(network, params, x, initial_states, finite=finite, check_memory=check_memory)
    check_memory()
    layer_params = [{k: xp.asarray(v, dtype=dtype) for k, v in params[l].items()} for l in range(network.num_layers)]
    states = {s: xp.asarray(v, dtype=dtype) for s, v in (initial_states or {}).items()}
    return _forward(network, split, layer_params, xp.asarray(x, dtype=dtype), states, dtype, xp)


@functools.lru_cache(maxsize=64)
def derived(cell) -> BackwardSplit:
    """The cell's backward graph, split (engine.autodiff.hoist): a pure function of the frozen cell, so derived
    once, not at every training step."""
    return split_backward(backward_graph(cell))


def array_module(backend: str):
    """NumPy for "reference", CuPy for "naive" and "fused"; BackendError saying why the GPU cannot be used."""
    if backend == "reference":
        return np
    if backend not in BACKENDS:
        raise BackendError(f"argument 'backend' of bptt must be one of {', '.join(BACKENDS)}, got {backend!r}")
    from ..backends import gpu_status
    ok, reason = gpu_status()
    if not ok:
        raise BackendError(f"bptt(backend={backend!r}) needs a CUDA GPU with CuPy: {reason}; hint: backend='reference'")
    import cupy
    return cupy


def _initial_state(network: Network, initial_states: dict, name: str, layer: int, batch: int, dtype, xp):
    if name in initial_states:
        return initial_states[name][layer].copy()
    return xp.zeros((batch, network.state_size(name)), dtype=dtype)


def _forward(network: Network, split: BackwardSplit, layer_params, x, initial_states, dtype, xp) -> "Tape":
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
            next_states, values = step(cell, layer_params[layer], layer_in[t], states, dtype)
            steps.append({**{n: values[n] for n in per_step}, **constants})
            states = next_states
            out[t] = states[cell.output]
        saved.append(steps)
        finals.append(states)
        layer_in = out
    final_states = {s: xp.stack([finals[l][s] for l in range(network.num_layers)]) for s in cell.state_names}
    return Tape(network, split, layer_params, saved, layer_in, final_states, dtype, xp)


def _reverse(network: Network, tape: Tape, d_outputs, d_final_states: dict, dtype, xp) -> Gradients:
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
            incoming = {graph.output_input: d_above[t], **{graph.carry_input(s): carry[s] for s in carry}}
            values = backward_step(graph, tape.saved[layer][t], layer_params[layer], incoming, grads[layer], dtype,
                                   split.per_step)
            for name in split.recorded:
                value = values[name]
                if name not in kept:
                    kept[name] = xp.empty((T, B) + tuple(value.shape[-1:]), dtype=dtype)
                kept[name][t] = value
            carry = {s: values[name] if name else xp.zeros_like(carry[s]) for s, name in graph.state_adjoints}
        rows = {name: value.reshape(T * B, -1) for name, value in kept.items()}           # row t * B + b
        values = backward_step(graph, _stacked(cell, tape.saved[layer], split.saved_after, B, xp),
                               layer_params[layer], rows, grads[layer], dtype, split.after)
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
