"""The checks bptt makes before any work: its arguments (errors name the argument) and the host memory its saved
forward values need."""
from __future__ import annotations

import numpy as np

from .. import memory
from ..arguments import shown
from ..backends.common import FiniteCheck
from ..errors import BackendError
from ..network import Network
from .errors import AutodiffError
from .graph import BackwardGraph
from .hoist import BackwardSplit


def check_dtype(dtype) -> type:
    try:
        dtype = np.dtype(dtype).type
    except (TypeError, ValueError, SyntaxError):      # np.dtype(",") parses the string as a Python literal
        dtype = None
    if dtype not in (np.float64, np.float32):
        raise BackendError(f"argument 'dtype': bptt computes in float64 or float32, not "
                           f"{np.dtype(dtype).name if dtype is not None else 'a dtype'}; "
                           "hint: dtype=np.float64 (the default) for gradient checks, np.float32 for speed")
    return dtype


def check_input_gradient(value) -> bool:
    if not isinstance(value, bool):
        raise BackendError(f"argument 'input_gradient' of bptt must be True or False, got {shown(value)}; "
                           "hint: False where x is data and its gradient is not wanted")
    return value


def check_network(network) -> Network:
    if not isinstance(network, Network):
        raise BackendError(f"argument 'network' must be an engine Network, got {type(network).__name__}; hint: "
                           "engine.Network(cell, input_size, hidden_size, num_layers)")
    return network


GRADIENT_HINT = "check the loss gradient that produced it (bptt would spread it to every earlier step)"


def _float_array(name: str, value, want: tuple[int, ...], layout: str, xp, unchecked: list):
    """value as an array of xp, its shape and dtype checked; (name, value) appended to `unchecked`, for the
    FiniteCheck of its finiteness."""
    shape = getattr(value, "shape", None)
    if shape is None:
        raise BackendError(f"argument '{name}' must be an array of shape {want} {layout}, got {type(value).__name__}")
    if tuple(shape) != want:
        raise BackendError(f"argument '{name}' has shape {tuple(shape)}, expected {want} {layout}; hint: the "
                           "gradient of the loss with respect to the forward value, of the same shape")
    kind = getattr(value, "dtype", None)
    if kind is None or kind.kind != "f":
        raise BackendError(f"argument '{name}' must be a floating-point array, got dtype {kind}")
    value = xp.asarray(value)
    unchecked.append((f"argument '{name}'", value))
    return value


def check_d_outputs(network: Network, d_outputs, steps: int, batch: int, xp, unchecked: list):
    """d_outputs: (T, B, output size) or None; as an array of xp (NumPy, or CuPy for the GPU)."""
    if d_outputs is None:
        return None
    return _float_array("d_outputs", d_outputs, (steps, batch, network.output_size), "(T, B, output size)", xp,
                        unchecked)


def check_d_final_states(network: Network, d_final_states, batch: int, xp, unchecked: list) -> dict:
    """d_final_states: {state name: (L, B, size)}; names left out (or None) are zeros."""
    if d_final_states is None:
        return {}
    if not isinstance(d_final_states, dict):
        raise BackendError("argument 'd_final_states' must be a dict {state name: (L, B, size) array}, got "
                           f"{type(d_final_states).__name__}")
    cell = network.cell
    checked = {}
    for name, value in d_final_states.items():
        if name not in cell.state_names:
            raise BackendError(f"d_final_states: '{name}' is not a state of cell '{cell.name}' "
                               f"(states: {', '.join(cell.state_names)}); hint: leave out states the loss does "
                               "not read")
        want = (network.num_layers, batch, network.state_size(name))
        checked[name] = _float_array(f"d_final_states['{name}']", value, want, "(L, B, size)", xp, unchecked)
    return checked


def start_backward(tape, d_outputs, d_final_states: dict | None) -> tuple:
    """A tape's backward pass runs once: AutodiffError if it has run; else (d_outputs or None, d_final_states,
    their FiniteCheck), checked against the tape's outputs but for their finiteness, which the caller asks of the
    FiniteCheck (at once, or once it has queued the work they feed), and the tape marked used."""
    if tape.used:
        raise AutodiffError("this tape's backward pass has run already, and its saved forward values are gone",
                            hint="record the forward pass again (engine.autodiff.record) for another backward")
    T, B, _ = tape.outputs.shape
    unchecked: list = []
    d_outputs = check_d_outputs(tape.network, d_outputs, T, B, tape.xp, unchecked)
    d_final_states = check_d_final_states(tape.network, d_final_states, B, tape.xp, unchecked)
    tape.used = True
    return d_outputs, d_final_states, FiniteCheck(unchecked, GRADIENT_HINT)


def saved_floats_per_row(network: Network, graph: BackwardGraph) -> int:
    """The numbers one batch row of one step of one layer keeps for the backward: its saved forward values
    (parameters and constants are kept once, not per step)."""
    cell = network.cell
    sizes = {"H": network.hidden_size, "P": network.projection_size, "I": network.input_size}
    per_row = 0
    for name in graph.saved:
        node = cell[name]
        if node.is_param or node.op == "const":
            continue
        dim = cell.dims[name]
        per_row += max(network.output_size, network.input_size) if dim == "I" else sizes.get(dim, 0)
    return per_row


def device_free_bytes() -> int | None:
    """Free memory of the current CUDA device plus what CuPy's pool holds and could reuse, or None."""
    return memory.available_device_bytes()


def check_bptt_memory(network: Network, split: BackwardSplit, steps: int, batch: int, itemsize: int,
                      on: str = "host") -> None:
    """Refuse, before allocating, a pass whose saved forward values cannot fit (on the host, or on the GPU:
    on="device"): every layer's saved values at every step, plus the input, the outputs and two adjoint
    sequences."""
    per_step = saved_floats_per_row(network, split.graph)
    widest = max(network.input_size, network.hidden_size, network.projection_size)
    # One layer at a time also keeps the step values its after-the-sweep part reads (engine.autodiff.hoist), and
    # their stacked copies: at most `widest` numbers each.
    kept = 2 * len(split.recorded) * widest
    needed = itemsize * steps * batch * (network.num_layers * per_step + 4 * widest + kept)
    available = memory.available_host_bytes() if on == "host" else device_free_bytes()
    if available is not None and needed > available:
        raise BackendError(f"bptt needs about {needed:,} bytes of {on} memory to keep the forward values of T={steps}, "
                           f"B={batch}, L={network.num_layers} ({per_step} numbers a row, a step and a layer), but "
                           f"only {available:,} are available; hint: truncate the sequence (run bptt on chunks of "
                           "steps, carrying the states), use a smaller batch, or dtype=np.float32")
