"""Convert parameters to and from PyTorch's nn.LSTM / nn.GRU / nn.RNN state_dict layout.

The block order comes from the preset's TorchLayout (data), never from a convention here.
Works on NumPy arrays; torch itself is only needed by callers that build the module.
"""
from __future__ import annotations

import numpy as np

from .errors import BackendError
from .gallery import TorchLayout
from .network import Network
from .params import Params


def to_torch_state_dict(network: Network, params: Params, layout: TorchLayout) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for layer in range(network.num_layers):
        p = params[layer]
        for key, names in (("weight_ih", layout.weight_ih), ("weight_hh", layout.weight_hh),
                           ("bias_ih", layout.bias_ih), ("bias_hh", layout.bias_hh)):
            out[f"{key}_l{layer}"] = np.concatenate([np.asarray(p[n]) for n in names], axis=0)
    return out


def from_torch_state_dict(network: Network, state_dict: dict, layout: TorchLayout) -> Params:
    layers = []
    H = network.hidden_size
    for layer in range(network.num_layers):
        values: dict[str, np.ndarray] = {}
        for key, names in (("weight_ih", layout.weight_ih), ("weight_hh", layout.weight_hh),
                           ("bias_ih", layout.bias_ih), ("bias_hh", layout.bias_hh)):
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
                values[name] = array[k * H:(k + 1) * H].copy()
        layers.append(values)
    return Params(layers)
