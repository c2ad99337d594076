"""Convert parameters to and from PyTorch's nn.LSTM / nn.GRU / nn.RNN state_dict layout.

The block order comes from the preset's TorchLayout (data), never from a convention here.
Works on NumPy arrays; torch itself is only needed by callers that build the module.

    weight_ih_l{k}: (blocks * H, I or H)   the layout's weight_ih names, stacked by rows in order
    weight_hh_l{k}: (blocks * H, H)
    bias_ih_l{k}, bias_hh_l{k}: (blocks * H,)
"""
from __future__ import annotations

import numpy as np

from .errors import BackendError
from .gallery import TorchLayout
from .network import Network
from .params import Params, check_params

# (state_dict key prefix, TorchLayout field) in the order PyTorch lists them.
_KEYS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def check_layout(network: Network, layout: TorchLayout) -> None:
    """Every parameter of the cell appears in exactly one block, and the states map onto the cell's."""
    cell = network.cell
    params = [p.name for p in cell.params]
    listed = [name for key in _KEYS for name in getattr(layout, key)]
    for name in listed:
        if name not in params:
            raise BackendError(f"TorchLayout names '{name}', which is not a parameter of cell '{cell.name}'. "
                               f"hint: parameters are {', '.join(params)}")
    for name in params:
        if listed.count(name) != 1:
            raise BackendError(f"TorchLayout of cell '{cell.name}' lists parameter '{name}' {listed.count(name)} "
                               "time(s); every parameter must be in exactly one block")
    for theirs, ours in layout.state_map:
        if ours not in cell.state_names:
            raise BackendError(f"TorchLayout maps torch state '{theirs}' to '{ours}', which is not a state of "
                               f"cell '{cell.name}' (states: {', '.join(cell.state_names)})")


def to_torch_state_dict(network: Network, params: Params, layout: TorchLayout) -> dict[str, np.ndarray]:
    """Our per-gate parameters -> {"weight_ih_l0": (blocks*H, I), ...} as NumPy arrays."""
    check_layout(network, layout)
    check_params(network, params)
    out: dict[str, np.ndarray] = {}
    for layer in range(network.num_layers):
        p = params[layer]
        for key in _KEYS:
            out[f"{key}_l{layer}"] = np.concatenate([np.asarray(p[n]) for n in getattr(layout, key)], axis=0)
    return out


def from_torch_state_dict(network: Network, state_dict: dict, layout: TorchLayout) -> Params:
    """A torch module's state_dict (tensors or arrays) -> our Params, split into per-gate blocks."""
    check_layout(network, layout)
    layers = []
    H = network.hidden_size
    for layer in range(network.num_layers):
        values: dict[str, np.ndarray] = {}
        for key in _KEYS:
            names = getattr(layout, key)
            full = f"{key}_l{layer}"
            if full not in state_dict:
                raise BackendError(f"state_dict has no '{full}'; is it a {layout.module} with "
                                   f"{network.num_layers} layer(s) and bias=True?")
            array = state_dict[full]
            array = array.detach().cpu().numpy() if hasattr(array, "detach") else np.asarray(array)
            if array.shape[0] != H * len(names):
                raise BackendError(f"'{full}' has {array.shape[0]} rows, expected {H * len(names)} "
                                   f"({len(names)} blocks of hidden size {H})")
            for k, name in enumerate(names):
                block = array[k * H:(k + 1) * H].copy()
                want = network.param_shape(layer, name)
                if block.shape != want:
                    raise BackendError(f"'{full}' block {k} ('{name}') has shape {block.shape}, expected {want}; "
                                       f"hint: check input_size={network.input_size} and num_layers")
                values[name] = block
        layers.append(values)
    return Params(layers)
