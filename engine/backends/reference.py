"""The NumPy reference executor: the living definition of what every op and every network means.

It interprets the cell graph node by node, one time step and one layer at a time, in float64 or
float32. Every fast backend is tested against it. With precision="tf32" / "float16" / "bfloat16" it
emulates that mode (engine.codegen.precision): both operands of every matmul are rounded to the mode's
format first (engine.rounding; float32x3: each split into two TF32 parts, three of their products summed); the rest stays in `dtype`, reductions too (the wavefront schedules, which run the
modes, sum a reduction in float32 rather than multiplying by the dense form's matrix: engine/codegen/reductions.py).
"""
from __future__ import annotations

import numpy as np

from ..errors import BackendError
from ..memory import check_run
from ..network import Network
from ..ops import apply_elementwise, matmul_apply
from ..params import Params, check_params
from ..rounding import mode_matmul
from .common import RunResult, check_inputs, check_precision
from .lengths import check_lengths, hold_past_end, step_masks


def step(cell, layer_params: dict[str, np.ndarray], x_t: np.ndarray, states: dict[str, np.ndarray],
         dtype, precision: str = "float32") -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One cell step. x_t: (B, I); states: name -> (B, H). Returns (next states, all node values)."""
    env: dict[str, np.ndarray] = {}
    for name in cell.topo_order:
        node = cell[name]
        if node.op == "input":
            env[name] = x_t
        elif node.op == "state":
            env[name] = states[name]
        elif node.is_param:
            env[name] = layer_params[name].astype(dtype, copy=False)
        elif node.op == "const":
            env[name] = dtype(node.attr("value"))
        elif node.op == "matmul":
            weight, operand = (env[a] for a in node.args)
            # (B, cols) @ (cols, rows) -> (B, rows), or per head; operands rounded (or split) as the mode does
            env[name] = mode_matmul(weight, operand, precision, matmul_apply).astype(dtype, copy=False)
        else:
            env[name] = apply_elementwise(node.op, [env[a] for a in node.args], node.attr_dict).astype(
                dtype, copy=False)
    next_states = {s.name: np.broadcast_to(env[s.next], states[s.name].shape).astype(dtype) for s in cell.states}
    return next_states, env


def run(network: Network, params: Params, x: np.ndarray, initial_states: dict | None = None,
        dtype=np.float64, precision: str = "float32", observe=None, lengths=None) -> RunResult:
    """x: (T, B, I). initial_states: name -> (L, B, size of the state: H, or P), zeros where not given. precision: the mode whose
    matmul rounding to emulate ("float32": none). observe(layer, t, env): called with every node's value after each
    step (first_non_finite looks for the first NaN or Inf). lengths: (B,) steps of each sequence, the rest padding
    (engine/backends/lengths.py): its states stay and its outputs are zero past its end."""
    dtype = np.dtype(dtype).type
    if dtype not in (np.float64, np.float32):
        raise BackendError(f"reference backend supports float64 and float32, not {np.dtype(dtype).name}")
    precision = check_precision(precision)
    check_params(network, params)
    x = check_inputs(network, x, initial_states, xp=np)
    T, B, _ = x.shape
    masks = step_masks(check_lengths(lengths, T, B), T, dtype, np)
    check_run(network, T, B, np.dtype(dtype).itemsize, backend="reference")   # before anything (T, B)-sized
    cell = network.cell
    states = []
    for layer in range(network.num_layers):
        s = {}
        for name in cell.state_names:
            if initial_states is not None and name in initial_states:
                s[name] = np.asarray(initial_states[name], dtype=dtype)[layer].copy()
            else:
                s[name] = np.zeros((B, network.state_size(name)), dtype=dtype)
        states.append(s)
    layer_in = x.astype(dtype)
    for layer in range(network.num_layers):
        out = np.empty((T, B, network.output_size), dtype=dtype)
        for t in range(T):
            next_states, env = step(cell, params[layer], layer_in[t], states[layer], dtype, precision)
            if masks is not None:           # past a sequence's end its states stay, its output is zero
                next_states = hold_past_end(next_states, states[layer], masks[t], np)
            states[layer] = next_states
            if observe is not None:
                observe(layer, t, env)
            out[t] = states[layer][cell.output] if masks is None else np.where(masks[t] > 0, states[layer][cell.output], 0)
        layer_in = out
    final = {name: np.stack([states[l][name] for l in range(network.num_layers)]) for name in cell.state_names}
    return RunResult(outputs=layer_in, final_states=final)


# What a value that turned NaN or Inf inside a cell most likely needs, by the op that made it.
NON_FINITE_HINTS = {
    "exp": "exp overflows float32 past x = 88: subtract a stabilizer first (sLSTM keeps one as its state m), or "
           "use sigmoid or softplus",
    "log": "log of 0 is -Inf and of a negative value NaN: apply softplus or abs first, or add a small positive "
           "offset",
    "sqrt": "sqrt of a negative value is NaN: apply abs or softplus first, or add a small positive offset",
    "rsqrt": "rsqrt of 0 is Inf and of a negative value NaN: add a positive epsilon (LayerNorm adds eps to the "
             "variance)",
    "div": "a division by 0 (or by a value that rounds to it): add a positive epsilon to the denominator",
    "matmul": "the product overflows: scale the weights or the inputs down",
}


def first_non_finite(network: Network, params: Params, x, initial_states: dict | None, dtype=np.float32,
                     precision: str = "float32") -> tuple[int, int, str, str] | None:
    """Where a run that started from finite values first made a NaN or an Inf: (layer, step, node, "NaN"/"Inf")
    of the first node, in the order the cell computes, whose value is not finite. The run is replayed step by
    step on this backend in `dtype` (float32 overflows where float64 would not), so what the GPU made is found
    where the same arithmetic makes it; None when the replay stays finite."""
    def host(value):
        return value.get() if hasattr(value, "get") else value       # CuPy arrays: the replay runs on NumPy

    def look(layer, t, env):
        for name in network.cell.topo_order:
            if not np.all(np.isfinite(env[name])):
                raise _Found((layer, t, name, "NaN" if np.any(np.isnan(env[name])) else "Inf"))

    states = None if initial_states is None else {k: host(v) for k, v in initial_states.items()}
    try:
        with np.errstate(all="ignore"):
            run(network, params, host(x), states, dtype=dtype, precision=precision, observe=look)
    except _Found as found:
        return found.where
    return None


class _Found(Exception):
    """first_non_finite's stop: where the replay met the first NaN or Inf."""

    def __init__(self, where):
        super().__init__(where)
        self.where = where


def non_finite_error(network: Network, params: Params, x, initial_states: dict | None, dtype=np.float32,
                     precision: str = "float32") -> BackendError:
    """The error of a run whose inputs were finite and whose result is not: which node made the first NaN or
    Inf, at which layer and step, and what to do about it."""
    found = first_non_finite(network, params, x, initial_states, dtype, precision)
    if found is None:
        return BackendError("the run's outputs or final states hold NaN or Inf, though its inputs are finite and a "
                            f"{np.dtype(dtype).name} replay on the NumPy reference stays finite; hint: compare "
                            "backend='reference' with this backend on the same inputs, and report the cell if they "
                            "differ")
    layer, t, name, kind = found
    op = network.cell[name].op
    hint = NON_FINITE_HINTS.get(op, "look at this node's arguments at that step (engine.bptt's record keeps "
                                    "every value)")
    return BackendError(f"node '{name}' ({op}) made the first {kind} of the run at layer {layer}, step {t}, from "
                        f"finite inputs; hint: {hint}")
