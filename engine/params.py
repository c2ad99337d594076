"""Parameters of a network: one {name: array} dict per layer.

Initialized deterministically from a seed, uniform in +-1/sqrt(H) as PyTorch does; saved and loaded
as .npz with keys "layer{l}.{name}".
"""
from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .arguments import float_dtype, integer
from .errors import BackendError
from .files import DAMAGED_ARCHIVE, check_destination, error_of, read_bytes, write_with
from .memory import check_fits, parameter_bytes
from .network import Network, check_network

PARAMS_HINT = "pass a .npz written by Params.save (keys 'layer0.W_ii', ...)"


@dataclass
class Params:
    layers: list[dict[str, np.ndarray]]

    def __post_init__(self):
        if isinstance(self.layers, dict) or not isinstance(self.layers, (list, tuple)) or not all(
                isinstance(layer, dict) for layer in self.layers):
            raise BackendError(f"Params takes a list of {{parameter name: array}} dicts, one per layer, got "
                               f"{type(self.layers).__name__}; hint: engine.init_params(network), "
                               "engine.Params.load(path), or Params([{'W_ii': ..., ...}, ...])")
        self.layers = list(self.layers)

    def __getitem__(self, layer: int) -> dict[str, np.ndarray]:
        return self.layers[layer]

    def astype(self, dtype) -> "Params":
        return Params([{k: v.astype(dtype) for k, v in layer.items()} for layer in self.layers])

    def flat(self) -> dict[str, np.ndarray]:
        return {f"layer{l}.{k}": v for l, layer in enumerate(self.layers) for k, v in layer.items()}

    def save(self, path: str | Path) -> Path:
        """An .npz with keys "layer{l}.{name}", written atomically (engine.files): a failed save leaves the file
        that was there, and no temporary."""
        check_destination(path, "parameter file", example="params.npz")
        return write_with(path, lambda f: np.savez(f, **self.flat()), "parameter file")

    @staticmethod
    def load(path: str | Path, network: Network | None = None) -> "Params":
        data = read_bytes(path, "parameter file", error=error_of(BackendError), hint=PARAMS_HINT)
        try:
            layers = read_npz(data)
        except DAMAGED_ARCHIVE as e:  # a damaged or foreign file
            raise BackendError(f"parameter file {str(path)!r} is not a readable .npz archive ({type(e).__name__}: "
                               f"{str(e)[:200]}); hint: {PARAMS_HINT}") from None
        except KeyError as e:
            raise BackendError(f"parameter file {str(path)!r}: {e.args[0]}; hint: keys look like 'layer0.W_ii'") \
                from None
        if layers is None:
            raise BackendError(f"parameter file {str(path)!r} is a single array, not an .npz archive; "
                               f"hint: {PARAMS_HINT}")
        if sorted(layers) != list(range(len(layers))):
            raise BackendError(f"parameter file {path}: layers {sorted(layers)} are not numbered 0..{len(layers) - 1}"
                               "; hint: keys look like 'layer0.W_ii', 'layer1.W_ii', ... without gaps")
        params = Params([layers[i] for i in sorted(layers)])
        if network is not None:
            check_params(network, params)
        return params


def read_npz(data: bytes) -> dict[int, dict[str, np.ndarray]] | None:
    """{layer: {name: array}} of an .npz archive's bytes (None for a single .npy array). Raises what np.load raises
    for a damaged file, and KeyError naming a key that is not 'layer<l>.<name>'."""
    archive = np.load(io.BytesIO(data), allow_pickle=False)
    if not isinstance(archive, np.lib.npyio.NpzFile):
        return None
    layers: dict[int, dict[str, np.ndarray]] = {}
    with archive:
        for key in archive.files:
            head, _, name = key.partition(".")
            if not head.startswith("layer") or not head[5:].isdigit() or not name:
                raise KeyError(f"key '{key}' is not 'layer<l>.<name>'")
            value = archive[key]
            if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiu":   # a member not in .npy form
                raise ValueError(f"'{key}' holds {getattr(value, 'dtype', type(value).__name__)}, not an array of "
                                 "numbers")
            layers.setdefault(int(head[5:]), {})[name] = value
    return layers


def init_params(network: Network, seed: int = 0, dtype=np.float64) -> Params:
    """Every parameter of every layer, uniform in +-1/sqrt(H) from `seed`; refused before allocating when the
    parameters cannot fit in memory (engine.memory)."""
    check_network(network)
    seed = integer(seed, "seed", low=0, high=None)
    dtype = float_dtype(dtype, "dtype")
    check_fits(parameter_bytes(network, dtype.itemsize),
               f"storing the parameters of {network.num_layers} layer(s) of hidden_size {network.hidden_size}",
               "hidden_size, num_layers", on="host", hint="a smaller hidden_size or fewer layers, or dtype=np.float32")
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
    check_network(network)
    if not isinstance(params, Params):
        raise BackendError(f"argument 'params' must be engine.Params, got {type(params).__name__}; hint: "
                           "engine.init_params(network), engine.Params.load(path), or Params([{name: array}, ...])")
    if len(params.layers) != network.num_layers:
        raise BackendError(f"params has {len(params.layers)} layer(s), the network has {network.num_layers}; "
                           "hint: make them for this network with engine.init_params(network)")
    for layer, name, want in expected_shapes(network):
        if name not in params.layers[layer]:
            raise BackendError(f"params: layer {layer} has no parameter '{name}'; hint: the cell's parameters are "
                               f"{', '.join(p.name for p in network.cell.params)}")
        value = params.layers[layer][name]
        got = tuple(value.shape) if hasattr(value, "shape") else None   # CuPy's too, without a copy
        kind = getattr(getattr(value, "dtype", None), "kind", None)
        if got is None or kind not in ("f", "i", "u"):
            raise BackendError(f"params: layer {layer} parameter '{name}' must be a NumPy or CuPy array of numbers, "
                               f"got {type(value).__name__}" + (f" of {value.dtype}" if kind else "") +
                               "; hint: a float array, e.g. from engine.init_params(network)")
        if got != want:
            raise BackendError(f"params: layer {layer} parameter '{name}' has shape {got}, expected {want}; hint: "
                               "make them for this network's sizes with engine.init_params(network)")


@functools.lru_cache(maxsize=256)
def expected_shapes(network: Network) -> tuple[tuple[int, str, tuple[int, ...]], ...]:
    """(layer, parameter, shape) of every parameter of the network (a training step checks them every call)."""
    return tuple((layer, p.name, network.param_shape(layer, p.name)) for layer in range(network.num_layers)
                 for p in network.cell.params)
