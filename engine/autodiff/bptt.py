"""Backpropagation through time: gradients of a loss with respect to a network's parameters, input and initial
states, given the loss's gradients with respect to the outputs and final states. This module chooses the backend:
"reference" (NumPy) and "naive" (the same interpreters on the GPU through CuPy, one array operation per node: a
correct, slow baseline, what the torch.nn.Module wrapper runs in float64) run the step-by-step reference of
engine/autodiff/tape.py; "fused" (fp32, the GPU) the generated training step of engine/autodiff/fused_tape.py.

precision= (engine/codegen/precision.py: "float32", "tf32", "float16", "bfloat16"; bf16, fp16 too): every operand of
every matmul of both passes rounded to the mode's format, products summed in fp32; parameters, states, gradients and
the rest of the math stay in `dtype`. "fused" runs it (its cuBLAS GEMMs on tensor cores); "reference" emulates it
(engine.rounding), the yardstick of the fused step's CPU and GPU tests; "naive" runs float32 only.
"""
from __future__ import annotations

import numpy as np

from .. import backends
from ..backends.common import FiniteCheck, check_inputs, check_training_precision, inputs_named
from ..backends.lengths import check_lengths, step_masks
from ..errors import BackendError
from ..network import Network
from ..params import Params, check_params
from . import fused_tape
from .checks import check_bptt_memory, check_dtype, check_input_gradient, check_network
from .gradients import Gradients
from .hoist import derived
from .tape import Tape, forward

# NumPy on the host; the same interpreter on the GPU through CuPy, op by op; the generated training step (fp32, GPU:
# engine/autodiff/fused_tape.py)
BACKENDS = ("reference", "naive", "fused")


def bptt(network: Network, params: Params, x, initial_states: dict | None = None, d_outputs=None,
         d_final_states: dict | None = None, dtype=np.float64, backend: str = "reference",
         lengths=None, precision: str = "float32", input_gradient: bool = True) -> Gradients:
    """x: (T, B, I). initial_states: name -> (L, B, size), zeros where not given (as engine.run). d_outputs:
    (T, B, output size), the loss's gradient with respect to the top layer's outputs (None: zeros), or a function
    of the forward outputs (T, B, output size) that returns it: a loss that needs the outputs first (training) then
    costs one forward pass, not two. d_final_states: name -> (L, B, size) (None or names left out: zeros).
    backend="naive": the same interpreter on the GPU (CuPy arrays in, or NumPy ones copied over; CuPy arrays out).
    lengths: (B,) the steps of each sequence of a batch padded at the end (engine/backends/lengths.py; every backend:
    the fused step through kernels that hold the rows past their end, engine/autodiff/fused_lengths.py). precision:
    the matmuls' mode (the module's docstring). input_gradient=False: x's gradient is not computed (gradients.x is
    None; the fused step leaves layer 0's input adjoint GEMM out), as when x is data. One call is record(...) then
    Tape.backward(...)."""
    check_input_gradient(input_gradient)
    tape = record(network, params, x, initial_states, dtype=dtype, backend=backend, lengths=lengths,
                  precision=precision)
    if callable(d_outputs):
        d_outputs = d_outputs(tape.outputs)
    return tape.backward(d_outputs, d_final_states, input_gradient=input_gradient)


def record(network: Network, params: Params, x, initial_states: dict | None = None, dtype=np.float64,
           backend: str = "reference", lengths=None, precision: str = "float32") -> Tape:
    """The forward pass of bptt, keeping what its reverse pass reads: tape.outputs (T, B, output size) and
    tape.final_states now, the gradients later from tape.backward(d_outputs, d_final_states), once (the saved
    values are freed as it goes). What a torch.autograd.Function needs: forward now, backward when asked."""
    dtype = check_dtype(dtype)
    network = check_network(network)
    check_backend(backend)
    precision = check_training_precision("bptt", precision)
    if backend == "naive" and precision != "float32":
        raise BackendError(f"bptt(backend='naive') computes in float32 or float64 only, not precision={precision!r}; "
                           "hint: backend='fused' runs the mode on the GPU, backend='reference' emulates it")
    if backend == "fused" and dtype != np.float32:
        raise BackendError(f"bptt(backend='fused') runs in float32, got dtype={np.dtype(dtype).name}; "
                           "hint: dtype=np.float32, or backend='naive' for float64 on the GPU")
    xp = array_module(backend)
    if xp is np and type(x).__module__.split(".")[0] == "cupy":
        raise BackendError("argument 'x' is a CuPy array (on the GPU), and backend='reference' runs on the host; "
                           "hint: backend='naive' keeps it on the GPU, or pass x.get()")
    check_params(network, params)
    x = check_inputs(network, x, initial_states, xp=xp)
    T, B, _ = x.shape
    lengths = check_lengths(lengths, T, B)
    finite = FiniteCheck(inputs_named(network, params, x, initial_states))
    if backend != "fused":
        finite.raise_if_bad()
    split = derived(network.cell)

    def check_memory():
        check_bptt_memory(network, split, T, B, np.dtype(dtype).itemsize, on="host" if xp is np else "device")

    if backend == "fused":         # asks the check once the forward is queued: the GPU runs it meanwhile; check_memory
        # where a program is made (a cached one holds its memory)
        return fused_tape.record(network, params, x, initial_states, finite=finite, check_memory=check_memory,
                                 lengths=lengths, precision=precision)
    check_memory()
    layer_params = [{k: xp.asarray(v, dtype=dtype) for k, v in params[l].items()} for l in range(network.num_layers)]
    states = {s: xp.asarray(v, dtype=dtype) for s, v in (initial_states or {}).items()}
    return forward(network, split, layer_params, xp.asarray(x, dtype=dtype), states, dtype, xp,
                   step_masks(lengths, T, dtype, xp), precision)


def check_backend(backend) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise BackendError(f"argument 'backend' of bptt must be one of {', '.join(BACKENDS)}, got "
                           f"{repr(backend)[:60]}; hint: backend='reference' runs NumPy on the CPU")
    return backend


def array_module(backend: str):
    """NumPy for "reference", CuPy for "naive" and "fused"; BackendError saying why the GPU cannot be used."""
    if check_backend(backend) == "reference":
        return np
    ok, reason = backends.gpu_status()       # looked up at call time (tests stand in a GPU)
    if not ok:
        raise BackendError(f"bptt(backend={backend!r}) needs a CUDA GPU with CuPy: {reason}; hint: backend='reference'")
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    return cupy
