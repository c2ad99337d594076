"""Programmatic dependent launch (PDL) of the cell kernels that follow a step GEMM: the kernel's blocks may start
while the GEMM's last blocks run, issue the loads that do not read the GEMM's output (the projection's row, the
states), and wait (griddepcontrol.wait, engine/codegen/cuda.py WAIT_MACRO) before reading what the GEMM wrote and
before any store.

    waits = programmatic_waits(program)          # {kernel: the params it reads after the wait}
    launch = ProgrammaticLaunch.on_current_device(cupy)   # None below sm_90 or without cuLaunchKernelEx
    launch(raw_kernel, grid, block, args, stream_ptr)

A kernel qualifies where it comes straight after a step GEMM in a step's order (Program.step_order): then the
launch before it in its stream is that GEMM, and everything earlier has finished when the GEMM began. Its reads of
any step GEMM's output go after the wait. A kernel after another kernel, or first in a step, launches as before.
The CUDA programming guide, "Programmatic Dependent Launch and Synchronization": the dependent may start before the
primary completes only where both sides allow it; the primary here (cuBLAS's) triggers at its blocks' exit.

Measured on an H200 (2026-11-28, benchmarks/probe_step_pdl.py, a bf16 LSTM step of cublasLt's product and the
generated cell kernel, chained in a CUDA graph): 8.18 -> 7.72 us a step at `large`, 21.0 -> 20.5 at blogA, 5.69 ->
5.09 at I = H = 512, B = 16; the wait placed before every load gained nothing, so the gain is the loads issued early.
"""
from __future__ import annotations

import ctypes

from ..errors import BackendError
from ..plan import Program

CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6      # cuda.h, CUlaunchAttributeID


def programmatic_waits(program: Program) -> dict[str, frozenset[str]]:
    """{kernel name: params read after the wait} for every kernel that directly follows a step GEMM."""
    outputs = {g.out_buffer for g in program.gemms if not g.hoisted}
    found, previous = {}, None
    for kind, item in program.step_order():
        if kind == "kernel" and previous == "gemm":
            found[item.name] = frozenset(p.name for p in item.params if p.source in outputs)
        previous = kind
    return found


class _Attribute(ctypes.Structure):          # CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):             # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)), ("count", ctypes.c_uint)]


class ProgrammaticLaunch:
    """cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION set: a CuPy RawKernel launched on
    a stream as a programmatic dependent of the launch before it. Captured into CUDA graphs as a programmatic edge."""

    def __init__(self, lib):
        self.lib = lib
        self.attribute = _Attribute()
        self.attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        self.attribute.value[0] = 1

    @classmethod
    def on_current_device(cls, cupy):
        """The launcher, or None where the device is older than sm_90 (no griddepcontrol) or the driver has no
        cuLaunchKernelEx (before CUDA 12)."""
        if int(cupy.cuda.Device().compute_capability) < 90:
            return None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuLaunchKernelEx        # noqa: B018 -- the symbol's presence is the check
        except (OSError, AttributeError):
            return None
        return cls(lib)

    def __call__(self, kernel, grid: tuple, block: tuple, args, stream_ptr: int) -> None:
        """args: CuPy arrays (passed as their device pointers) and numpy int32 scalars, in the kernel's order."""
        values = [ctypes.c_void_p(a.data.ptr) if hasattr(a, "data") and hasattr(a.data, "ptr")
                  else ctypes.c_int32(int(a)) for a in args]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        config = _Config((ctypes.c_uint * 3)(*grid, *(1,) * (3 - len(grid))),
                         (ctypes.c_uint * 3)(*block, *(1,) * (3 - len(block))), 0, ctypes.c_void_p(stream_ptr),
                         ctypes.pointer(self.attribute), 1)
        status = self.lib.cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(kernel.kernel.ptr), params, None)
        if status != 0:
            raise BackendError(f"cuLaunchKernelEx of kernel '{kernel.name}' returned CUresult {status}; hint: run "
                               "with programmatic=False (engine/schedules/fused_modes.py) and report this")
