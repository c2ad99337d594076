"""What every backend shares: the result type and the checks of its arguments."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backends
from ..arguments import shown
from ..codegen.cuda import KERNELS_DIR
from ..codegen.nvrtc import load_module
from ..codegen.precision import PRECISIONS
from ..codegen.precision import precision as lookup
from ..errors import BackendError, CompileError
from ..network import Network
from ..ops import array_module
from ..params import check_params


@dataclass
class RunResult:
    outputs: Any                       # (T, B, H): the last layer's output state at every step
    final_states: dict[str, Any]       # state name -> (L, B, H)
    backend: str = "reference"
    info: dict | None = None


def check_precision(precision) -> str:
    """The canonical name of a precision mode ("bf16" -> "bfloat16"); BackendError naming the flag otherwise."""
    try:
        return lookup(precision).name
    except CompileError:
        raise BackendError(f"argument 'precision' is {precision!r}; hint: use one of {', '.join(PRECISIONS)}") from None


def check_training_precision(what: str, precision) -> str:
    """check_precision for the training step, which runs the GEMMs of the reduced modes on cuBLAS, operands rounded to
    the mode: float32x3 (3xTF32) would need three split GEMMs each, and is refused by name."""
    name = check_precision(precision)
    if lookup(name).split:
        raise BackendError(f"{what} does not train in precision {name!r} (3xTF32: the training step does not split its "
                           "GEMMs in three); hint: precision='float32' for "
                           "fp32 accuracy, or 'tf32' for tensor cores")
    return name


def check_float32_only(what: str, precision) -> None:
    """For the backends that compute in strict float32 only (naive, fused)."""
    if check_precision(precision) != "float32":
        raise BackendError(f"{what} computes in strict float32 only, not precision={precision!r}; hint: use "
                           "backend='persistent', 'graph', 'scan' (a linear recurrence) or 'auto' for reduced "
                           "precision, or backend='reference' for its emulation on the CPU")


def check_float32_gpu_program(what: str, network: Network, params, dtype) -> None:
    """What every float32 GPU program checks before it builds anything: the dtype, a usable GPU, the
    network and its parameters. `what` names it in the messages ("backend 'fused'", "schedule 'graph'")."""
    if np.dtype(dtype) != np.float32:
        raise BackendError(f"{what} computes in float32 only, not {np.dtype(dtype).name}; "
                           "hint: use dtype=np.float32, or backend='reference' for float64")
    if not isinstance(network, Network):
        raise BackendError(f"argument 'network' must be an engine Network, got {type(network).__name__}")
    ok, why = backends.gpu_status()
    if not ok:
        raise BackendError(f"{what} needs a GPU: {why}. hint: use backend='reference' on the CPU")
    check_params(network, params)


def check_gpu_run_inputs(what: str, cupy, network: Network, x, initial_states) -> None:
    """x and initial_states of a GPU run: CuPy arrays on the current GPU (NumPy is copied over), right shapes."""
    device = cupy.cuda.Device().id
    named = [("x", x)] + [(f"initial_states['{n}']", v) for n, v in (initial_states or {}).items()]
    for name, value in named:
        if isinstance(value, cupy.ndarray) and value.device.id != device:
            raise BackendError(f"argument '{name}' is on GPU {value.device.id}, but {what} runs on GPU {device}; "
                               f"hint: move it with cupy.asarray under `with cupy.cuda.Device({device}):`")
    check_inputs(network, x, initial_states, xp=cupy)


def array_module_of(value):
    """numpy, or cupy for a CuPy array (the GPU backends and the GPU training loop return and take them)."""
    return array_module(value)


def _first_bad(value) -> tuple[int, tuple] | None:
    """(count, index of the first) of the non-finite elements of a NumPy or CuPy array, or None."""
    if type(value).__module__.split(".")[0] == "cupy":
        import cupy as xp  # deferred: CuPy is optional (no GPU in CI)
    else:
        xp, value = np, np.asarray(value, dtype=np.float64)
    bad = ~xp.isfinite(value)
    count = int(bad.sum())
    if not count:
        return None
    return count, tuple(int(i) for i in xp.argwhere(bad)[0])


ALL_FINITE_FILE = KERNELS_DIR / "all_finite.cu"
_ALL_FINITE_KERNELS: dict = {}      # device id -> {dtype: kernel}
_FINITE_BLOCKS = 128              # blocks per array; each loops over its share (a few hundred thousand elements)


class _Flags:
    """What a check of one set of arrays launches with: the uploaded address and size tables (a launch a dtype), the
    flags on the GPU, their pinned host copy and the event behind the copy. Kept for the same arrays' next check (a
    training step checks the same arrays every step): a check then costs a memset, a launch a dtype, a copy and an
    event record (0.13-0.17 ms of host time a step before, with the allocations). busy from a launch until its
    result is read; a busy one is never reused (a new one takes its place in the cache)."""

    def __init__(self, cupy, groups: list):
        self.bad = cupy.zeros(max(sum(len(arrays) for _, arrays in groups), 1), dtype=cupy.int32)
        self.launches, first = [], 0          # (kernel dtype, table, arrays, their flags)
        for dtype, arrays in groups:
            table = cupy.asarray(np.array([[a.data.ptr for a in arrays], [a.size for a in arrays]], dtype=np.int64))
            self.launches.append((dtype, table, len(arrays), self.bad[first:first + len(arrays)]))
            first += len(arrays)
        self.host = np.frombuffer(cupy.cuda.alloc_pinned_memory(self.bad.nbytes), dtype=np.int32, count=self.bad.size)
        self.event = cupy.cuda.Event(disable_timing=True)
        self.busy, self.kept = False, True


class _PendingFlags:
    """The flags of one launch of kernels/all_finite.cu, on their way to pinned host memory behind an event."""

    def __init__(self, cupy, flags: _Flags):
        stream = cupy.cuda.get_current_stream()
        cupy.cuda.runtime.memcpyAsync(flags.host.ctypes.data, flags.bad.data.ptr, flags.bad.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        flags.event.record(stream)
        self.flags, self.result = flags, None

    def all_finite(self) -> bool:
        if self.result is None:
            self.flags.event.synchronize()            # waits for the check alone, not the work queued after it
            self.result = not self.flags.host.any()
            self.flags.busy = False                   # read: the next check of these arrays may take it
        return self.result


def _launch_all_finite(values: list):
    """One kernel launch per dtype over a table of the arrays (a reduction per array cost ~50 us of host time
    each: 4 ms a step for a 4-layer LSTM); _PendingFlags to read later, or None when a value is not a CuPy array
    of float16/32/64 (the caller then looks value by value). The arrays of an earlier check, by address, size, dtype
    and strides, launch with that check's kept _Flags: no per-array checks or uploads on the host."""
    if not values or any(type(v).__module__.split(".")[0] != "cupy" for v in values):
        return None                                   # NumPy values: looked at in raise_if_bad (no CuPy import)
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    device = cupy.cuda.runtime.getDevice()
    key = (device, tuple((v.data.ptr, v.size, v.dtype.char, v.strides) for v in values))
    with _FINITE_LOCK:
        flags = _FINITE_TABLES.pop(key, None)
        if flags is not None and not flags.busy:
            flags.busy = True
            _FINITE_TABLES[key] = flags               # the latest last
        else:
            flags = None
    if flags is None:
        flags = _new_flags(cupy, device, values)
        if flags is None:
            return None
        with _FINITE_LOCK:
            if flags.kept:
                while len(_FINITE_TABLES) >= FINITE_TABLES:
                    _FINITE_TABLES.pop(next(iter(_FINITE_TABLES)))
                _FINITE_TABLES[key] = flags
    kernels = _ALL_FINITE_KERNELS[device]
    stream = cupy.cuda.get_current_stream()
    cupy.cuda.runtime.memsetAsync(flags.bad.data.ptr, 0, flags.bad.nbytes, stream.ptr)
    for dtype, table, count, bad in flags.launches:
        kernels[dtype]((_FINITE_BLOCKS, count), (256,), (table[0], table[1], bad))
    return _PendingFlags(cupy, flags)


def _new_flags(cupy, device: int, values: list):
    """The _Flags of a check of `values` (busy), their tables uploaded; None where a value cannot be checked by the
    kernel (another dtype, another GPU's memory) or there are more arrays than a grid's y dimension. kept: whether
    its tables read the values themselves (no contiguous copy was made), so that a later check may reuse it."""
    kernels = _ALL_FINITE_KERNELS.get(device)
    if kernels is None:                               # compiled and loaded once a device
        module = load_module(ALL_FINITE_FILE.read_text())
        kernels = _ALL_FINITE_KERNELS[device] = {np.dtype(np.float32): module.get_function("all_finite_f32"),
                                                 np.dtype(np.float64): module.get_function("all_finite_f64"),
                                                 np.dtype(np.float16): module.get_function("all_finite_f16")}
    groups: dict = {}
    kept = True
    for v in values:
        if v.dtype not in kernels or v.device.id != device:
            return None                               # the kernel reads raw pointers: this GPU's memory only
        if v.size:
            if not v.flags.c_contiguous:
                v, kept = cupy.ascontiguousarray(v), False
            groups.setdefault(v.dtype, []).append(v)
    if sum(len(arrays) for arrays in groups.values()) > 65535:
        return None
    flags = _Flags(cupy, list(groups.items()))
    flags.busy, flags.kept = True, kept
    return flags


_FINITE_TABLES: dict = {}       # (device, the arrays' addresses, sizes, dtypes, strides) -> _Flags, the latest last
_FINITE_LOCK = threading.Lock()
FINITE_TABLES = 16              # kept: the same arrays are checked step after step (params, x, d_outputs)


INPUT_HINT = "check where it was computed or loaded (the run would spread it to every later step)"


class FiniteCheck:
    """NaN or Inf in named values (name, array), BackendError naming the first bad one and its first bad index. On
    the GPU the check is launched now and read by raise_if_bad(): work queued in between runs on the GPU after the
    check while the host waits for the check alone (a training step queues its forward before it asks, instead of
    idling the GPU at a synchronisation). NumPy values are looked at in raise_if_bad()."""

    def __init__(self, named: list[tuple[str, Any]], hint: str = INPUT_HINT):
        self.named, self.hint = named, hint
        # The CuPy values in one launch; NumPy ones (parameters kept on the host beside x on the GPU) on the host,
        # so that a mix does not send the GPU's arrays through a reduction each with a synchronisation.
        on_gpu = [value for _, value in named if type(value).__module__.split(".")[0] == "cupy"]
        self.host = [(name, value) for name, value in named if type(value).__module__.split(".")[0] != "cupy"]
        self.pending = _launch_all_finite(on_gpu)
        if self.pending is None:
            self.host = named

    def all_finite(self) -> bool:
        if self.pending is not None and not self.pending.all_finite():
            return False
        return all(_first_bad(value) is None for _, value in self.host)

    def raise_if_bad(self) -> None:
        if self.all_finite():
            return
        for name, value in self.named:
            found = _first_bad(value)
            if found:
                count, first = found
                raise BackendError(f"{name} has {count} NaN or Inf value(s), the first at index {first}; "
                                   f"hint: {self.hint}")


def inputs_named(network: Network, params, x, initial_states) -> list[tuple[str, Any]]:
    """x, the initial states and every parameter, each with the name an error gives it."""
    named = [("x", x)] + [(f"initial_states['{n}']", v) for n, v in (initial_states or {}).items()]
    for layer in range(network.num_layers):
        named += [(f"params layer {layer} '{p.name}'", params.layers[layer][p.name]) for p in network.cell.params]
    return named


def check_finite(network: Network, params, x, initial_states) -> None:
    """NaN or Inf in x, an initial state or a parameter: BackendError naming which and where (the run's
    check_finite=True; off by default, as it reads every input once more)."""
    FiniteCheck(inputs_named(network, params, x, initial_states)).raise_if_bad()


def check_inputs(network: Network, x, initial_states, xp) -> Any:
    """Validate x (T, B, I) and initial states (L, B, H) before any work; errors name the argument."""
    shape = getattr(x, "shape", None)
    if not isinstance(shape, tuple):          # not an array (a class has a 'shape' descriptor, not a tuple)
        raise BackendError(f"argument 'x' must be an array of shape (T, B, {network.input_size}), "
                           f"got {type(x).__name__}; hint: np.asarray(x, dtype=np.float32)")
    if len(shape) != 3:
        raise BackendError(f"argument 'x' must have 3 dimensions (T, B, I), got shape {tuple(shape)}; hint: "
                           "steps first, then the batch, then the features (x[:, None, :] for a batch of one)")
    T, B, I = shape
    if I != network.input_size:
        raise BackendError(f"argument 'x' has input size {I}, the network expects {network.input_size}; hint: "
                           "x's last axis is the network's input_size")
    if T < 1 or B < 1:
        raise BackendError(f"argument 'x' has shape {tuple(shape)}: T and B must be at least 1; hint: give at least "
                           "one step of one sequence")
    kind = getattr(x, "dtype", None)
    if getattr(kind, "kind", None) != "f":
        raise BackendError(f"argument 'x' must be a floating-point array, got dtype {kind}; hint: "
                           "x.astype(np.float32)")
    if initial_states is not None:
        if not isinstance(initial_states, dict):
            raise BackendError("argument 'initial_states' must be a dict {state name: (L, B, H) array}, got "
                               f"{type(initial_states).__name__}; hint: e.g. {{'h': np.zeros((L, B, H))}}, or None "
                               "for zeros")
        for name, value in initial_states.items():
            if not isinstance(name, str) or name not in network.cell.state_names:
                raise BackendError(f"initial_states: {shown(name)} is not a state of cell '{network.cell.name}'; "
                                   f"hint: its states are {', '.join(network.cell.state_names)}")
            want = (network.num_layers, B, network.state_size(name))
            if tuple(getattr(value, "shape", ())) != want:
                raise BackendError(f"initial_states['{name}'] has shape {tuple(getattr(value, 'shape', ()))}, "
                                   f"expected {want}; hint: (num_layers, batch, state size) arrays")
            if getattr(getattr(value, "dtype", None), "kind", None) not in ("f", "i", "u"):
                raise BackendError(f"initial_states['{name}'] must be an array of numbers, got dtype "
                                   f"{getattr(value, 'dtype', None)}; hint: a float array")
    return x
