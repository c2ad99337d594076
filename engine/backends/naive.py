"""The naive CuPy backend: one kernel launch per IR op per step, nothing grouped, fused or hoisted.

It walks the cell graph in topological order exactly as the NumPy reference does, for every layer
(in sequence) and every time step: each matmul is one cupy.matmul (cuBLAS), each elementwise op is
its own ElementwiseKernel whose body is the op's CUDA expression from engine/ops.py. It is the
baseline that shows what the passes (GEMM grouping, input hoisting, fusion, wavefront) buy.

Per step, a cell with m matmuls and e elementwise ops costs m + e + 1 launches (the +1 copies the
output state into the output sequence), so a network costs L * T * (m + e + 1) launches.

It also runs in float64: the benchmark uses that as the GPU reference for divergence curves, since
the NumPy reference is too slow at benchmark sizes. Only the spelling of float-only CUDA functions
changes for float64 (see `double_spelling`); the helpers of kernels/cell_ops.cuh get double
overloads in kernels/naive_ops.cuh.

CuPy is imported lazily, so this module imports on machines without a GPU.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..dense import block_diagonal
from ..errors import BackendError
from ..ir import CellGraph
from ..memory import available_device_bytes, check_fits, parameter_bytes, run_bytes
from ..network import Network
from ..ops import OPS, apply_elementwise
from ..params import Params, check_params
from .common import RunResult, check_inputs

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
# The device helpers the op table's CUDA expressions call (sigmoidf_, ...), shared with the fused
# backend's generated kernels, then their double overloads for the float64 mode.
PREAMBLE_FILES = (KERNELS_DIR / "cell_ops.cuh", KERNELS_DIR / "naive_ops.cuh")
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}

# Float-only CUDA math spelled for double. The op table writes its expressions for float; this is
# the only place that knows how to respell them (the GPU tests compare every op in float64 against
# NumPy, so a missed function shows up as float-sized error).
_DOUBLE_FUNCTIONS = (("tanhf(", "tanh("), ("fmaxf(", "fmax("), ("fminf(", "fmin("), ("expf(", "exp("),
                     ("logf(", "log("), ("fabsf(", "fabs("), ("rsqrtf(", "rsqrt("), ("sqrtf(", "sqrt("),
                     ("log1pf(", "log1p("))
_FLOAT_LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)f\b")


def double_spelling(expression: str) -> str:
    """Respell a float CUDA expression for double: tanhf -> tanh, 1.0f -> 1.0, ..."""
    for float_name, double_name in _DOUBLE_FUNCTIONS:
        expression = expression.replace(float_name, double_name)
    return _FLOAT_LITERAL.sub(r"\1", expression)


def c_literal(value: float, dtype) -> str:
    """A number as a typed C literal, e.g. ((float)0.5)."""
    value = float(value)
    if not math.isfinite(value):
        raise BackendError(f"cannot use the non-finite number {value!r} in a kernel",)
    return f"(({C_TYPES[np.dtype(dtype)]}){value!r})"


@dataclass(frozen=True)
class KernelSource:
    """The pieces of one cupy.ElementwiseKernel (readable on its own, testable without a GPU)."""

    name: str
    in_params: str          # e.g. "float32 a, float32 b"
    out_params: str         # e.g. "float32 out"
    operation: str          # e.g. "out = (a + b);"


def elementwise_source(op: str, ports: tuple, factor: float | None, dtype) -> KernelSource:
    """The kernel for one elementwise op. ports: per argument, None (an array) or a number (a const
    baked into the kernel). Arrays keep the op's port names (a, b, x) as kernel parameter names."""
    dtype = np.dtype(dtype)
    spec = OPS[op]
    fields: dict[str, str] = {}
    in_params = []
    for port, const in zip(spec.ports, ports):
        if const is None:
            fields[port] = port
            in_params.append(f"{dtype.name} {port}")
        else:
            fields[port] = c_literal(const, dtype)
    if "factor" in spec.attrs:
        fields["factor"] = c_literal(factor, dtype)
    expression = spec.cuda.format(**fields)
    if dtype == np.dtype(np.float64):
        expression = double_spelling(expression)
    baked = "_k" if any(c is not None for c in ports) or factor is not None else ""
    return KernelSource(name=f"naive_{op}{baked}_{dtype.name}", in_params=", ".join(in_params),
                        out_params=f"{dtype.name} out", operation=f"out = {expression};")


@lru_cache(maxsize=1)
def preamble() -> str:
    """The source pasted in front of every naive kernel (read once from kernels/)."""
    parts = []
    for path in PREAMBLE_FILES:
        try:
            parts.append(path.read_text())
        except OSError as e:
            raise BackendError(f"cannot read the device helpers {path}: {e}. "
                               "hint: run from a full checkout of the repository") from e
    return "\n".join(parts)


def _cupy():
    """CuPy, or a BackendError saying why the GPU backend cannot run here."""
    try:
        import cupy  # deferred: CuPy is optional (no GPU in CI)
    except Exception as e:  # ImportError, or a broken CUDA install
        raise BackendError(f"the naive backend needs CuPy and a CUDA GPU ({type(e).__name__}: {e}). "
                           "hint: use backend='reference' on the CPU") from e
    return cupy


@lru_cache(maxsize=None)
def _kernel(source: KernelSource):
    cupy = _cupy()
    return cupy.ElementwiseKernel(source.in_params, source.out_params, source.operation, name=source.name,
                                  preamble=preamble())


# ---- the per-step program ------------------------------------------------------------------

@dataclass(frozen=True)
class Instruction:
    """One op of the step. kind: 'matmul' (args: operand, weight), 'elementwise' (args: the array
    arguments, in port order), 'reduction' (sum_h, mean_h: args, the operand) or 'const' (a value computed from
    consts only, baked into users)."""

    node: str
    kind: str
    args: tuple[str, ...] = ()
    kernel: KernelSource | None = None
    value: float | None = None


def step_program(cell: CellGraph, dtype) -> tuple[Instruction, ...]:
    """The cell's step as a list of launches, in topological order. Pure: no GPU needed."""
    constants: dict[str, float] = {n.name: float(n.attr("value")) for n in cell.nodes if n.op == "const"}
    program: list[Instruction] = []
    for name in cell.topo_order:
        node = cell[name]
        if node.is_leaf:
            continue
        if node.op == "matmul":
            weight, operand = node.args
            program.append(Instruction(name, "matmul", (operand, weight)))
            continue
        if OPS[node.op].kind == "reduction":       # a row's sum or mean: CuPy's reduction, then repeat across H
            program.append(Instruction(name, "reduction", node.args))
            continue
        if all(a in constants for a in node.args):
            # Only numbers go in: one number comes out, the same at every step.
            value = float(apply_elementwise(node.op, [np.float64(constants[a]) for a in node.args],
                                            node.attr_dict))
            constants[name] = value
            program.append(Instruction(name, "const", value=value))
            continue
        ports = tuple(constants.get(a) for a in node.args)
        kernel = elementwise_source(node.op, ports, node.attr("factor"), dtype)
        arrays = tuple(a for a in node.args if a not in constants)
        program.append(Instruction(name, "elementwise", arrays, kernel))
    return tuple(program)


def launches_per_step(cell: CellGraph) -> int:
    """Kernel launches of one layer step: one per matmul and elementwise op, plus the output copy."""
    return sum(1 for i in step_program(cell, np.float32) if i.kind != "const") + 1


# ---- memory ----------------------------------------------------------------------------------

def estimate_bytes(network: Network, steps: int, batch: int, dtype) -> int:
    """An upper bound of the device memory one run needs (engine.memory.run_bytes of a GPU backend: parameters,
    input, two layers' outputs, states and one step's temporaries)."""
    return run_bytes(network, steps, batch, np.dtype(dtype).itemsize, backend="naive")


def check_memory(need: int, what: str) -> None:
    """Raise BackendError before allocating if the device cannot hold `need` bytes."""
    check_fits(need, what, "x's steps and batch, hidden_size", on="device", limit=available_device_bytes(_cupy()),
               hint="reduce the batch, the number of steps or the hidden size")


# ---- running -----------------------------------------------------------------------------------

def _check_dtype(dtype) -> np.dtype:
    try:
        dtype = np.dtype(dtype)
    except TypeError as e:
        raise BackendError(f"argument 'dtype': {dtype!r} is not a dtype") from e
    if dtype not in DTYPES:
        raise BackendError(f"argument 'dtype': the naive backend runs float32 and float64, not {dtype.name}. "
                           "hint: use dtype=np.float32")
    return dtype


class NaiveProgram:
    """A network with its parameters on the GPU, ready to run many inputs (what the benchmark times).

    Weights are stored transposed, (cols, rows), so that each matmul is a plain operand @ weight.
    """

    def __init__(self, network: Network, params: Params, dtype=np.float32):
        if not isinstance(network, Network):
            raise BackendError(f"argument 'network' must be an engine Network, got {type(network).__name__}")
        if not isinstance(params, Params):
            raise BackendError(f"argument 'params' must be engine Params, got {type(params).__name__}")
        self.dtype = _check_dtype(dtype)
        if network.cell.uses_projection:
            raise BackendError(f"backend 'naive' keeps every state H wide and does not take cells with projected "
                               f"states (cell '{network.cell.name}' has values of size P); hint: use "
                               "backend='fused' on the GPU or backend='reference'")
        check_params(network, params)
        cupy = self._cupy = _cupy()
        self.network = network
        self.program = step_program(network.cell, self.dtype)
        check_memory(parameter_bytes(network, self.dtype.itemsize), "the naive backend's parameters")
        self.layers: list[dict] = []
        for layer in range(network.num_layers):
            values = {}
            for p in network.cell.params:
                host = np.asarray(params[layer][p.name])
                if p.op == "weight":
                    host = np.ascontiguousarray(block_diagonal(host).T)        # (cols, rows); heads as blocks
                values[p.name] = cupy.asarray(host, dtype=self.dtype)
            self.layers.append(values)

    def run(self, x, initial_states: dict | None = None, *, poison: bool = False) -> RunResult:
        """x: (T, B, I), NumPy or CuPy. Returns CuPy arrays. poison=True fills the output with NaN
        first, so an element the run never writes cannot pass a comparison."""
        cupy = self._cupy
        network, cell = self.network, self.network.cell
        x = check_inputs(network, x, initial_states, xp=cupy)
        T, B, _ = x.shape
        H = network.hidden_size
        check_memory(estimate_bytes(network, T, B, self.dtype) - parameter_bytes(network, self.dtype.itemsize),
                     f"the naive backend with T={T}, B={B}")
        layer_in = cupy.asarray(x, dtype=self.dtype)                    # (T, B, I)
        finals: dict[str, list] = {name: [] for name in cell.state_names}
        for layer in range(network.num_layers):
            states = {}
            for name in cell.state_names:
                if initial_states is not None and name in initial_states:
                    states[name] = cupy.array(initial_states[name][layer], dtype=self.dtype)  # (B, H)
                else:
                    states[name] = cupy.zeros((B, H), dtype=self.dtype)
            out = cupy.full((T, B, H), np.nan, dtype=self.dtype) if poison else cupy.empty((T, B, H), self.dtype)
            for t in range(T):
                states = self._step(layer, layer_in[t], states, B)
                out[t] = states[cell.output]
            for name in cell.state_names:
                finals[name].append(states[name])
            layer_in = out
        final_states = {name: cupy.stack(values) for name, values in finals.items()}  # (L, B, H)
        return RunResult(outputs=layer_in, final_states=final_states, backend="naive",
                         info={"dtype": self.dtype.name, "launches_per_step": launches_per_step(cell)})

    def _step(self, layer: int, x_t, states: dict, batch: int) -> dict:
        """One cell step: one launch per op. x_t: (B, I); states: name -> (B, H)."""
        cupy = self._cupy
        cell = self.network.cell
        env = {cell.input.name: x_t, **states, **self.layers[layer]}
        for instruction in self.program:
            if instruction.kind == "matmul":
                operand, weight = (env[a] for a in instruction.args)
                env[instruction.node] = cupy.matmul(operand, weight)       # (B, cols) @ (cols, rows)
            elif instruction.kind == "elementwise":
                env[instruction.node] = _kernel(instruction.kernel)(*(env[a] for a in instruction.args))
            elif instruction.kind == "reduction":
                env[instruction.node] = OPS[cell[instruction.node].op].numpy(env[instruction.args[0]])
        shape = (batch, self.network.hidden_size)
        next_states = {}
        for s in cell.states:
            value = env[s.next]
            if value.shape != shape:          # a next value computed from parameters only
                value = cupy.ascontiguousarray(cupy.broadcast_to(value, shape))
            next_states[s.name] = value
        return next_states


def prepare(network: Network, params: Params, dtype=np.float32) -> NaiveProgram:
    """Upload the parameters once; the result's run(x) can then be called (and timed) many times."""
    return NaiveProgram(network, params, dtype)


def run(network: Network, params: Params, x, initial_states: dict | None = None,
        dtype=np.float32) -> RunResult:
    """x: (T, B, I). initial_states: name -> (L, B, H), zeros where not given. Returns NumPy arrays,
    like the reference backend."""
    cupy = _cupy()
    dtype = _check_dtype(dtype)
    if not isinstance(network, Network):
        raise BackendError(f"argument 'network' must be an engine Network, got {type(network).__name__}")
    check_inputs(network, x, initial_states, xp=cupy)
    T, B, _ = x.shape
    check_memory(estimate_bytes(network, T, B, dtype), f"the naive backend with T={T}, B={B}")
    result = prepare(network, params, dtype).run(x, initial_states)
    return RunResult(outputs=cupy.asnumpy(result.outputs),
                     final_states={k: cupy.asnumpy(v) for k, v in result.final_states.items()},
                     backend="naive", info=result.info)
