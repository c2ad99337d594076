"""The plan interpreter: runs a compiled Plan with NumPy, on the CPU.

It is the `fused` backend's Executor (engine/backends/fused.py) with a NumPy device: the same
buffers, packed weights, operand layout, double-buffer versions and wavefront order, with each
generated kernel evaluated from the statements it was generated from. Comparing it with the NumPy
reference proves the passes (grouping, packing, bias folding, placement of every value) on a
machine without a GPU; the GPU tests then only have to show that the CUDA says what the statements
say. It is not a registered backend: call engine.backends.plan_numpy.run directly.

Its streams are bookkeeping only, but they check what CUDA would not: that no stream waits on an
event that was never recorded (CUDA would silently not wait).
"""
from __future__ import annotations

import numpy as np

from ..compiler import make_plan
from ..dense import dense
from ..errors import BackendError
from ..network import Network
from ..ops import apply_elementwise
from ..params import Params
from ..plan import Kernel, slot_columns
from .common import RunResult, check_inputs
from .fused import Executor
from .lengths import check_lengths


class NumpyDevice:
    xp = np

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.recorded: set = set()
        self.launches = 0

    def full(self, shape, value):
        return np.full(shape, value, dtype=self.dtype)

    def asarray(self, value):
        return np.ascontiguousarray(np.asarray(value, dtype=self.dtype))

    def int32(self, values):
        return np.asarray(values, dtype=np.int32)

    def gemm(self, x, weight_t, out):
        out[...] = x @ weight_t
        self.launches += 1

    def add_bias(self, out, bias):
        out += bias
        self.launches += 1

    def launch(self, kernel: Kernel, args, t: int, batch: int, sizes: dict) -> None:
        lengths = args[len(kernel.params)] if len(args) > len(kernel.params) else None     # after the buffers
        evaluate_kernel(kernel, dict(zip((p.name for p in kernel.params), args)), t, batch, sizes, self.dtype,
                        lengths)
        self.launches += 1

    def stream(self, layer: int):
        return _Stream()

    def record(self, layer: int):
        token = object()
        self.recorded.add(token)
        return token

    def wait(self, layer: int, event) -> None:
        if event not in self.recorded:
            raise AssertionError(f"layer {layer} waits on an event that was never recorded")

    def synchronize(self) -> None:
        pass


class _Stream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _view(array, access, t: int, batch: int, sizes: dict, dim_size: int):
    cols = slot_columns(access, sizes, dim_size)
    if access.rows == "vector":
        return array[cols]
    rows = slice(t * batch, (t + 1) * batch) if access.rows == "sequence" else slice(0, batch)
    return array[rows, cols]


def evaluate_kernel(kernel: Kernel, args: dict, t: int, batch: int, sizes: dict, dtype, lengths=None) -> None:
    """Do what the generated kernel does, for all (b, j) at once: loads, statements, stores (past a row's end, the
    held value of a store that holds: lengths (B,), engine/passes/lengths.py)."""
    d = sizes[kernel.dim]
    env: dict = {}
    for load in kernel.loads:
        if load.literal is not None:
            env[load.var] = dtype.type(load.literal)
        else:
            env[load.var] = _view(args[load.access.param], load.access, t, batch, sizes, d).astype(dtype)
    for st in kernel.statements:
        values = [env[a] for a in st.args]
        if st.op == "sum":
            result = values[0]
            for v in values[1:]:
                result = result + v
        else:
            result = apply_elementwise(st.op, values, dict(st.attrs))
        env[st.var] = np.asarray(result, dtype=dtype)
    within = None if lengths is None else (t < np.asarray(lengths))[:, None]       # (B, 1)
    for store in kernel.stores:
        target = _view(args[store.access.param], store.access, t, batch, sizes, d)
        value = env[store.var] if store.past_end is None else np.where(within, env[store.var], env[store.past_end])
        target[...] = np.broadcast_to(value, target.shape)


def run(network: Network, params: Params, x: np.ndarray, initial_states: dict | None = None,
        dtype=np.float64, *, passes=None, layout: str = "blocked", chunk_steps: int | None = None,
        poison: bool = True, lengths=None) -> RunResult:
    """Execute the Plan in NumPy. dtype float64 (exact comparison with the reference) or float32. lengths: (B,) the
    steps of each sequence of a batch padded at the end, run by the kernels compiled for it
    (engine/passes/lengths.py)."""
    if np.dtype(dtype) not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise BackendError(f"the plan interpreter runs float64 or float32, not {np.dtype(dtype).name}")
    check_inputs(network, x, initial_states, xp=np)
    network, params = dense(network, params)      # heads as block-diagonal weights, reductions as matmuls
    T, B, _ = x.shape
    steps = check_lengths(lengths, int(T), int(B))
    plan = make_plan(network, int(T), int(B), passes, layout=layout, chunk_steps=chunk_steps,
                     lengths=steps is not None)
    device = NumpyDevice(dtype)
    outputs, final = Executor(plan, device).run(params, device.asarray(x), initial_states, poison=poison,
                                                lengths=steps)
    info = {"plan": plan, "launches": device.launches}
    return RunResult(outputs=outputs.copy(), final_states={k: v.copy() for k, v in final.items()},
                     backend="plan_numpy", info=info)
