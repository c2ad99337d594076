"""How much memory a network needs, and whether it fits: one estimate, asked before anything large is allocated.

    estimate(network, steps, batch, dtype=np.float32, backend="reference")  ->  MemoryEstimate
    check_fits(needed, what, argument, on="host")                          ->  BackendError when it cannot fit

`parameter_bytes` counts the parameters (engine.init_params allocates them), `run_bytes` what one run of a
backend allocates besides them (the input in the run's dtype, the outputs of two layers alive at a time, the states
and one step's values). The limit is the memory available now: on the host what the OS reports as available
(Linux MemAvailable), on the GPU the device's free memory plus what CuPy's pool holds and can reuse. Where the limit
cannot be read, nothing is refused here (the allocation itself says so). The app calls `estimate` to size its
limits; init_params, engine.run, the backends and the benchmark runner call the same functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import BackendError
from .network import Network

HOST_BACKENDS = ("reference",)       # the others allocate on the GPU


def size_text(n: int | float) -> str:
    """A byte count for a person: '8.0 TiB', '512.0 MiB', '1,000 bytes'."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{int(n):,} bytes"


def available_host_bytes() -> int | None:
    """Memory the OS says is available now (Linux: MemAvailable), or None where it cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_device_bytes(cupy=None) -> int | None:
    """Free memory of the current CUDA device plus what CuPy's pool holds and could reuse, or None without a GPU."""
    if cupy is None:
        try:
            import cupy  # deferred: CuPy is optional (no GPU in CI)
        except ImportError:
            return None
    try:
        free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free + cupy.get_default_memory_pool().free_bytes())
    except Exception:  # noqa: BLE001 - no device to ask (no driver, no GPU): the allocation itself will say
        return None


def limit_bytes(on: str = "host") -> int | None:
    """What a request may allocate now: on="host" or on="device"; None where it cannot be read."""
    return available_host_bytes() if on == "host" else available_device_bytes()


def parameter_bytes(network: Network, itemsize: int = 8) -> int:
    """Bytes of every parameter of the network."""
    return network.num_params() * itemsize


def run_bytes(network: Network, steps: int, batch: int, itemsize: int, backend: str = "reference") -> int:
    """Bytes one run allocates besides the parameters: on the host (reference) the input in the run's dtype, two
    layers' outputs and one step's node values; on the GPU also the states and the parameters' copies."""
    H = max(network.hidden_size, network.projection_size)
    I = network.input_size
    widest = max(H, I)
    nodes = len(network.cell.nodes)
    if backend in HOST_BACKENDS:
        return itemsize * (steps * batch * (I + 2 * H) + 4 * nodes * batch * widest)
    states = len(network.cell.states)
    ops = sum(1 for n in network.cell.nodes if not n.is_leaf)
    elements = (parameter_bytes(network, 1)                     # the parameters, copied to the device
                + steps * batch * I                             # x, converted to the dtype
                + 2 * steps * batch * H                         # this layer's and the previous layer's outputs
                + (2 + network.num_layers) * states * batch * H  # states now and next, final states
                + ops * batch * widest)                         # one step's temporaries
    return elements * itemsize


@dataclass(frozen=True)
class MemoryEstimate:
    """What a network needs, in bytes, against the limit of where it runs (None: unknown)."""

    parameters: int
    run: int
    on: str                      # "host" or "device"
    limit: int | None

    @property
    def total(self) -> int:
        return self.parameters + self.run

    @property
    def fits(self) -> bool:
        return self.limit is None or self.total <= self.limit


def estimate(network: Network, steps: int = 1, batch: int = 1, *, dtype=np.float32,
             backend: str = "reference") -> MemoryEstimate:
    """The parameters' and one run's bytes for (steps, batch) on `backend`, and the limit where it runs."""
    itemsize = np.dtype(dtype).itemsize
    on = "host" if backend in HOST_BACKENDS else "device"
    return MemoryEstimate(parameter_bytes(network, itemsize), run_bytes(network, steps, batch, itemsize, backend),
                          on, limit_bytes(on))


def check_fits(needed: int, what: str, argument: str, *, on: str = "host", limit: int | None = None,
               hint: str = "smaller sizes") -> None:
    """BackendError before allocating when `needed` bytes cannot fit: the arguments that set the size, what needs
    it, the figure and the limit. `limit` overrides the memory available now (None: read it)."""
    limit = limit_bytes(on) if limit is None else limit
    if limit is not None and needed > limit:
        where = "available host memory" if on == "host" else "free GPU memory"
        raise BackendError(f"{argument}: {what} needs {size_text(needed)}, the limit is {size_text(limit)} "
                           f"({where} now); hint: {hint}")


def check_run(network: Network, steps: int, batch: int, itemsize: int, backend: str = "reference") -> None:
    """Refuse, before allocating, a run of `backend` over (steps, batch) that cannot fit."""
    on = "host" if backend in HOST_BACKENDS else "device"
    check_fits(run_bytes(network, steps, batch, itemsize, backend),
               f"the {backend} run with T={steps}, B={batch}, I={network.input_size}, H={network.hidden_size}, "
               f"L={network.num_layers}", "x's steps and batch, hidden_size", on=on,
               hint="run fewer steps or a smaller batch at a time, or a smaller hidden_size"
                    + (", or dtype=np.float32" if itemsize > 4 else ""))
