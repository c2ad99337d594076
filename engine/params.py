"""Parameters of a network: one {name: array} dict per layer.

Initialized deterministically from a seed, uniform in +-1/sqrt(H) as PyTorch does; saved and loaded
as .npz with keys "layer{l}.{name}".
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import BackendError
from .network import Network


@dataclass
class Params:
    layers: list[dict[str, np.ndarray]]

    def __getitem__(self, layer: int) -> dict[str, np.ndarray]:
        return self.layers[layer]

    def astype(self, dtype) -> "Params":
        return Params([{k: v.astype(dtype) for k, v in layer.items()} for layer in self.layers])

    def flat(self) -> dict[str, np.ndarray]:
        return {f"layer{l}.{k}": v for l, layer in enumerate(self.layers) for k, v in layer.items()}

    def save(self, path: str | Path) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, **self.flat())
        tmp.replace(path)

    @staticmethod
    def load(path: str | Path, network: Network | None = None) -> "Params":
        try:
            data = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise BackendError(f"cannot read parameter file {str(path)!r}: {e}. "
                               "hint: pass a .npz written by Params.save") from None
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise BackendError(f"parameter file {str(path)!r} is a single array, not an .npz archive. "
                               "hint: pass a .npz written by Params.save")
        with data:
            layers: dict[int, dict[str, np.ndarray]] = {}
            for key in data.files:
                head, _, name = key.partition(".")
                if not head.startswith("layer") or not head[5:].isdigit() or not name:
                    raise BackendError(f"parameter file {path}: key '{key}' is not 'layer<l>.<name>'. "
                                       "hint: keys look like 'layer0.W_ii'")
                layers.setdefault(int(head[5:]), {})[name] = data[key]
        if sorted(layers) != list(range(len(layers))):
            raise BackendError(f"parameter file {path}: layers {sorted(layers)} are not numbered 0..{len(layers) - 1}")
        params = Params([layers[i] for i in sorted(layers)])
        if network is not None:
            check_params(network, params)
        return params


def init_params(network: Network, seed: int = 0, dtype=np.float64) -> Params:
    rng = np.random.default_rng(seed)
    k = 1.0 / np.sqrt(network.hidden_size)
    layers = []
    for layer in range(network.num_layers):
        values = {}
        for p in network.cell.params:
            shape = network.param_shape(layer, p.name)
            values[p.name] = rng.uniform(-k, k, size=shape).astype(dtype)
        layers.append(values)
    return Params(layers)


def check_params(network: Network, params: Params) -> None:
    """Raise BackendError naming the layer and parameter if anything is missing or mis-shaped."""
    if len(params.layers) != network.num_layers:
        raise BackendError(f"params has {len(params.layers)} layer(s), the network has {network.num_layers}")
    for layer, name, want in expected_shapes(network):
        if name not in params.layers[layer]:
            raise BackendError(f"params: layer {layer} has no parameter '{name}'",)
        value = params.layers[layer][name]
        got = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)   # CuPy's too, without a copy
        if got != want:
            raise BackendError(f"params: layer {layer} parameter '{name}' has shape {got}, expected {want}")


@functools.lru_cache(maxsize=256)
def expected_shapes(network: Network) -> tuple[tuple[int, str, tuple[int, ...]], ...]:
    """(layer, parameter, shape) of every parameter of the network (a training step checks them every call)."""
    return tuple((layer, p.name, network.param_shape(layer, p.name)) for layer in range(network.num_layers)
                 for p in network.cell.params)
