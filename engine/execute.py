"""Running one Network on a backend by name: the choice ('auto': the autotuned schedule on a GPU, the NumPy
reference elsewhere), the checks every backend shares, and the run. engine.api.run, the net runner and the
multi-GPU pipeline all run a Network through here.

Sits above engine.backends and engine.schedules (it may import them); never imports engine.api, engine.nets,
engine.multigpu, engine.bench, engine.explain or engine.export.
"""
from __future__ import annotations

import contextlib
import logging

import numpy as np

from . import backends, kept
from .arguments import float_dtype, shown
from .backends import reference
from .backends.common import FiniteCheck, RunResult, check_float32_only, check_inputs, check_precision
from .backends.common import check_finite as find_non_finite
from .backends.lengths import RUN_BACKENDS, check_lengths, only_on
from .errors import BackendError
from .network import Network, check_network
from .params import Params, check_params
from .schedules import autotune, fused_modes

log = logging.getLogger("engine")


def run(network: Network, params: Params, x, initial_states: dict | None = None, *,
        backend: str = "auto", dtype=np.float32, precision: str = "float32", check_finite: bool = False,
        lengths=None, allow_tensor_core_fp32: bool = False) -> RunResult:
    """Run the network over x (T, B, I). backend: auto | reference | naive | fused | graph | persistent.

    'auto' runs the autotuned schedule when CuPy sees a GPU (engine.schedules.autotune: it times the
    candidates once per cell, sizes, precision and device, and caches the choice on disk) and the NumPy
    reference otherwise; the choice and its reason are logged and recorded in
    result.info["backend_reason"]. The program it prepares is kept for the next call with the same choice and
    equal parameters (engine/kept.py), so a loop over engine.run prepares once.

    precision: "float32" (strict, the default), "tf32", "float16" or "bfloat16" (engine.codegen.precision:
    matmul operands rounded to that format, fp32 accumulation, cell math and states), or "float32x3" (3xTF32:
    each operand split into two TF32 parts, three tensor-core products, fp32-level error). The schedules run
    every mode on the GPU; the reference emulates it on the CPU; fused runs every mode too (its GEMMs on cuBLAS's
    tensor cores, engine/schedules/fused_modes.py); naive is float32 only.

    allow_tensor_core_fp32=True (backend='auto', precision='float32' only): the autotuner may pick a schedule in
    float32x3 when it is faster and within the float32 tolerance; result.info["precision"] names the mode that
    ran. Off by default: precision='float32' is strict FFMA unless asked.

    result.backend names the backend that ran, and result.info["backend_reason"] why.

    lengths: (B,) the steps of each sequence of a batch padded at the end (engine/backends/lengths.py): its states
    stay after its last step (the final states are its own) and its outputs there are zero. The reference, fused,
    graph and persistent backends run it ('auto' tunes among the schedules that take it); naive and scan refuse it.

    check_finite=True first looks for NaN or Inf in x, the initial states and every parameter, and names the
    first it finds (BackendError), instead of letting it spread through the recurrence; and when the inputs are
    finite but the result is not (log of 0, sqrt of a negative value, exp overflowing inside the cell), it names
    the node that made the first NaN or Inf, with its layer and step (replayed on the NumPy reference).
    """
    check_network(network)
    precision = check_precision(precision)        # the arguments first, then whether this machine can run them
    backends.check_name(backend)
    check_params(network, params)
    if not isinstance(check_finite, bool):
        raise BackendError(f"argument 'check_finite' must be True or False, got {shown(check_finite)}; hint: "
                           "check_finite=True looks for NaN and Inf in the inputs first")
    dtype = float_dtype(dtype)
    allow_tensor_core_fp32 = autotune.check_tensor_core_fp32(allow_tensor_core_fp32, precision)
    if allow_tensor_core_fp32 and backend != "auto":
        raise BackendError(f"allow_tensor_core_fp32=True lets backend='auto' choose float32x3; backend={backend!r} "
                           "runs one mode; hint: precision='float32x3' runs that backend in it")
    name, reason = backends.select(backend)
    if check_finite:
        check_inputs(network, x, initial_states, xp=np)        # shapes and dtypes only, NumPy or CuPy alike
        find_non_finite(network, params, x, initial_states)
    if lengths is not None:
        if name != "auto" and name not in RUN_BACKENDS:
            raise only_on(name, "engine.run")
        check_inputs(network, x, initial_states, xp=np)
        check_lengths(lengths, int(x.shape[0]), int(x.shape[1]))
    if name == "auto":
        if np.dtype(dtype) != np.float32:
            raise BackendError(f"the GPU schedules compute in float32, not {np.dtype(dtype).name}; hint: use "
                               "dtype=np.float32, or backend='reference' for float64")
        shape = getattr(x, "shape", None)
        if not isinstance(shape, tuple) or len(shape) != 3:
            check_inputs(network, x, initial_states, xp=np)      # raises the named error
        choice = autotune.tune(network, params, int(shape[0]), int(shape[1]), precision=precision,
                               lengths=lengths is not None, allow_tensor_core_fp32=allow_tensor_core_fp32)
        name, reason = choice.schedule, f"{reason}: {choice.why}"
        log.info(reason)
        key = (choice.key, choice.schedule, repr(choice.config), choice.precision)
        entry = kept.PROGRAMS.take(key, params)          # the program a call before prepared (engine/kept.py)
        if entry is None:
            entry = kept.Kept(autotune.prepare(choice.candidate, network, params, precision=precision),
                              kept.parameter_copy(params))
        precision = choice.precision or precision        # float32x3 when allowed and chosen
        program = entry.program
        result = program.run(x, initial_states) if lengths is None else program.run(x, initial_states,
                                                                                     lengths=lengths)
        kept.PROGRAMS.put(key, entry)
    else:
        if backend == "auto":
            log.warning(reason)
        module = backends.get(name)
        # check_finite names the node that made a NaN or Inf below: NumPy's own warnings about it are noise then
        with np.errstate(all="ignore") if check_finite else contextlib.nullcontext():
            if name == "reference":
                result = module.run(network, params, x, initial_states, dtype=dtype, precision=precision,
                                    lengths=lengths)
            elif name == "fused" and precision != "float32":      # the fused backend's mode path
                result = fused_modes.run(network, params, x, initial_states, dtype=dtype, precision=precision,
                                         lengths=lengths)
            elif lengths is not None:        # graph, persistent or fused (the others refused it above)
                options = {"precision": precision} if name in backends.SCHEDULE_BACKENDS else {}
                if not options:
                    check_float32_only(f"backend '{name}'", precision)
                result = module.run(network, params, x, initial_states, dtype=dtype, lengths=lengths, **options)
            elif name in backends.SCHEDULE_BACKENDS:
                result = module.run(network, params, x, initial_states, dtype=dtype, precision=precision)
            else:
                check_float32_only(f"backend '{name}'", precision)
                result = module.run(network, params, x, initial_states, dtype=dtype)
    result.backend = name
    result.info = dict(result.info or {}, backend_reason=reason, precision=precision)
    if check_finite and not FiniteCheck([("outputs", result.outputs), *result.final_states.items()]).all_finite():
        raise reference.non_finite_error(network, params, x, initial_states,
                                         dtype=np.float64 if np.dtype(dtype) == np.float64 else np.float32,
                                         precision=precision)
    return result

