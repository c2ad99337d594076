"""The fused backend in a precision mode: each step's matrix products on cuBLAS's tensor-core GEMMs, the generated
elementwise kernels between them, the whole run replayed from CUDA graphs.

    program = prepare(network, params, precision="bfloat16")      # engine.run(backend="fused", precision=...)
    program.run(x).outputs

It is engine/backends/fused.py's Executor (the same plan, buffers, packed weights, generated kernels and order)
with a device whose GEMMs take the mode (engine/codegen/precision.py): cublasLt multiplies operands in the mode's
format by the weight, stored once in that format, summing in fp32 (engine/schedules/cublaslt.py); the hoisted
projections round their input first (kernels/round_operands.cu, into a buffer of the run's own) and add their bias
in cublasLt's epilogue. A step's operand needs no rounding launch: the cell's kernels write it a second time in the
mode's format as they write its fp32 values (engine/codegen/operand_copies.py). The elementwise math and the states
stay float32, as in every schedule's modes. A reduction's fixed matrix (engine/dense.py) is a sum, which no mode
rounds: its GEMMs stay strict fp32. Layers run on their own streams, chunk by chunk (the fused backend's wavefront),
each with its own cublasLt workspace. On sm_90 and later a kernel that follows a step GEMM is launched as its
programmatic dependent (engine/codegen/programmatic.py): its loads of the projection's row and the states are issued
while the GEMM finishes. A one-layer network projects its input in pieces on a stream of its own, ahead of the steps
that wait for them (Executor._project_ahead), so the first step need not wait for the whole sequence's projection.

Why it exists: where a layer's recurrent weight does not fit on chip (H = 1024 with B = 128, H = 2560), the wavefront
schedules stream it through their own tile GEMMs every step, and a step's product is a skinny GEMM (B rows) whose
floor is the weight's bytes. cuBLAS runs that GEMM closer to the bandwidth: on an H200 (2026-11-27,
benchmarks/probe_step_cublas.py) a bf16 step of the blogA LSTM (2560 x 10240) took 18.4 us against 32 us a step of the
persistent schedule. At `large` in bf16 this path is 1.30x (LSTM) and 1.58x (GRU) cuDNN bf16, where the persistent
schedule is 1.05x / 1.06x (H100, 2026-11-28, benchmarks/results/fused-modes-20261128-H200-H100/). Where the weights
fit on chip the wavefront schedules stay ahead; the autotuner times both.

Replay: the first run at a (T, B) runs directly (every launch issued from Python: ~40 us of host time a step, more
than the GPU's work); the second captures the run into CUDA graphs (engine/chunk_replay.py) and every later run is
one graph launch, x copied into a fixed buffer and the outputs copied out. lengths= are copied into a fixed buffer
before the launch, so runs with lengths replay too.

float32x3 multiplies TF32 parts (engine/schedules/split_products.py): the weights are stored as their two parts
stacked, [W_hi; W_lo]; the kernels write a step's operand as its two parts, [h_hi; h_lo]; one strided-batched TF32
GEMM multiplies both by W_hi in K chunks, one more h_hi by W_lo, and the cell kernels fold the products as they
read them (x3_fold="kernel"; "launch": one small kernel of its own). The projections split their input into a buffer of the run's own and make three TF32 products into their output
(x_hi W_lo with the bias, then x_lo W_hi, then x_hi W_hi in K chunks, each added by cublasLt's fp32 epilogue).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np

from ..arguments import integer, shown
from ..backends.common import RunResult, check_float32_gpu_program, check_gpu_run_inputs, check_precision
from ..backends.fused import THREADS_PER_BLOCK, CupyDevice, Executor, fitting_plan
from ..backends.lengths import check_lengths
from ..backends.plan_numpy import NumpyDevice
from ..codegen import GENERATOR_VERSION
from ..codegen.nvrtc import load_module
from ..codegen.operand_copies import copied_buffers, operand_copies, render_copies_module
from ..codegen.programmatic import ProgrammaticLaunch, programmatic_waits
from ..dense import dense
from ..errors import BackendError
from ..memory import available_device_bytes, check_fits
from ..network import Network
from ..params import Params
from ..plan import pack_weights
from ..rounding import mode_matmul
from .base import launch_replay, whole_run_replay
from .cublaslt import WORKSPACE, LtProjection, Product
from .project import LT_OPERANDS, operand_dtype, round_into
from .split_products import (
    X3_CHUNK,
    X3_FOLDS,
    Left,
    chunking,
    fold,
    left_bytes,
    left_products,
    partial_size,
    read_places,
    slice_calls,
    split_bytes,
    split_calls,
    split_into,
    stack_split,
    stacked_calls,
    stacked_product_numpy,
)

MODES = ("tf32", "float16", "bfloat16", "float32x3")
# the modes the autotuner times this backend in (float32x3 only where a user allows it, and each candidate's error held
# against float64 there: autotune.X3Gate)
TUNED_MODES = ("tf32", "float16", "bfloat16", "float32x3")
X3_PRODUCTS = LT_OPERANDS["tf32"]       # float32x3's parts are TF32 values: fp32 storage, TF32 tensor-core products
AHEAD_PIECES = 8         # layer 0's projection ahead of the steps in at most this many pieces (Executor._project_ahead)
AHEAD_ROWS = 2048        # of at least this many rows (T x B) each, so that each piece is still a large GEMM


def ahead_steps(T: int, B: int) -> int | None:
    """The steps a piece of layer 0's projection, or None where one piece would cover the sequence. On an H200
    (2026-11-28, benchmarks/probe_fused_ahead.py) the pieces made blogA 2-4 % faster in bf16 and one layer at B = 16,
    T = 1024 8-10 %; at `large` and `mid` (several layers) they cost up to 1.4 %, so FusedModeProgram uses them for
    one-layer networks."""
    steps = max(-(-T // AHEAD_PIECES), -(-AHEAD_ROWS // B))
    return steps if steps < T else None


def check_fused_mode(precision) -> str:
    """The mode's canonical name (every mode runs on the fused backend); BackendError naming the flag otherwise."""
    return check_precision(precision)


@dataclass(frozen=True)
class ModeWeight:
    """A packed GEMM weight as the mode multiplies it: `stored` (N, K), in the mode's storage unless `exact` (a
    reduction's fixed matrix: strict fp32)."""
    stored: object
    exact: bool


def fixed_gemms(program, cell) -> dict[str, bool]:
    """Per GEMM of the program: True where all its weights are a reduction's fixed matrices (strict in every mode).
    A GEMM that mixes one with a learned weight has no single mode: BackendError."""
    found = {}
    for gemm in program.gemms:
        kinds = {bool(cell[cell[m].args[0]].attr("fixed", None)) for t in gemm.terms for m in t.matmuls}
        if len(kinds) > 1:
            raise BackendError(f"backend 'fused' in a precision mode cannot run GEMM '{gemm.name}' of cell "
                               f"'{cell.name}': it multiplies a reduction's fixed matrix and a learned weight in one "
                               "product; hint: use backend='persistent' or 'graph' for this cell in a mode")
        found[gemm.name] = kinds == {True}
    return found


class ModeExecutor(Executor):
    """The fused Executor with its weights kept as ModeWeight and its projections' bias in the GEMM. copies ({kernel:
    {param: (copy, type, function)}}, engine/codegen/operand_copies.py): the kernels also write the step GEMMs'
    operands in the mode's format, which the GEMMs then read as they are; without them (the NumPy device) each step
    GEMM rounds its operand first."""

    def __init__(self, plan, device, copies=None, fixed: dict | None = None, ahead: int | None = None,
                 left: dict | None = None):
        super().__init__(plan, device, ahead)
        self.fixed = fixed_gemms(self.program, self.program.cell) if fixed is None else fixed
        self.left = left or {}             # {step GEMM: Left}: products the kernels sum as they read them
        copies = copies or {}
        self.copied = copied_buffers(self.program, copies)
        # per kernel, the (buffer, version) of each copy argument, in render_kernel's order after its own params
        params = {(k.name, p.name): p for k in self.program.kernels for p in k.params}
        self.copy_sources = {kernel: [(params[(kernel, name)].source, params[(kernel, name)].version) for name in named]
                             for kernel, named in copies.items()}

    def _allocate(self, poison: bool) -> list[dict]:
        layers = super()._allocate(poison)
        self.copy_arrays = []
        for buffers in layers:
            copies = {}
            for name in self.copied:
                source = buffers[name]
                versions = source if isinstance(source, list) else [source]
                arrays = [self.device.operand_like(v, poison) for v in versions]
                copies[name] = arrays if isinstance(source, list) else arrays[0]
            self.copy_arrays.append(copies)
        for layer, buffers in enumerate(layers):        # products left in planes or as P: their buffers, flat
            sizes = self.plan.layer_sizes(layer)
            for gemm in self.program.gemms:
                if gemm.name in self.left:
                    floats = self.left[gemm.name].floats(self.plan.batch, gemm.n(sizes))
                    buffers[gemm.out_buffer] = self.device.full((floats,), math.nan if poison else 0.0)
        return layers

    def _init_states(self, layers: list[dict], initial_states: dict | None) -> None:
        super()._init_states(layers, initial_states)
        for buffers, copies in zip(layers, self.copy_arrays):   # the operands of step 0, as the kernels write later ones
            for name, copy in copies.items():
                self.device.round_copy(self._version(buffers[name], "cur", 0), self._version(copy, "cur", 0))

    def _step_gemm(self, layer: int, item, t: int) -> None:
        copies = self.copy_arrays[layer]
        if item.in_buffer not in copies:
            super()._step_gemm(layer, item, t)
            return
        weight, _ = self.weights[layer][item.name]
        self._timed(layer, item.name, t, self.device.product, self._version(copies[item.in_buffer], "cur", t),
                    weight, self.layers[layer][item.out_buffer], self.left.get(item.name))

    def _kernel_args(self, layer: int, item, t: int) -> list:
        """The kernel's own arguments, then its copies' (render_kernel puts them after the kernel's params)."""
        args = super()._kernel_args(layer, item, t)
        for source, version in self.copy_sources.get(item.name, ()):
            args.append(self._version(self.copy_arrays[layer][source], version, t))
        return args

    def _upload_params(self, params: Params):
        plan, device, fixed = self.plan, self.device, self.fixed
        weights, vectors = [], []
        for layer in range(plan.network.num_layers):
            packed = pack_weights(self.program, plan.network, params, layer)
            weights.append({name: (device.mode_weight(p.weight, fixed[name]),
                                   None if p.bias is None else device.asarray(p.bias))
                            for name, p in packed.items()})
            vectors.append({name: device.asarray(np.asarray(params[layer][name]))
                            for name in self.program.kernel_params})
        return weights, vectors

    def _gemm_bias(self, operands, weight, bias, out) -> None:
        self.device.gemm(operands, weight, out, bias)


class ModeDevice(CupyDevice):
    """CupyDevice whose GEMMs take the mode: out = round(x) @ W^T (+ bias) through cublasLt, on the current stream
    (a layer's, where the layers have streams)."""

    def __init__(self, cupy, module, num_layers: int, precision: str, projection: bool = False,
                 streams: bool = False, programmatic=None, dependents=frozenset(), ahead: bool = False,
                 shared_sms: int = 0, x3_chunk: int | str | None = X3_CHUNK):
        super().__init__(cupy, module, num_layers, streams=streams, projection=projection)
        self.precision = precision
        self.split = precision == "float32x3"
        self.x3_chunk = x3_chunk           # float32x3: K of one accumulator (split_products.chunking)
        self.partials: dict = {}           # float32x3: (stream, chunks, rows, cols) -> the chunks' products P
        # kernels launched as programmatic dependents of the step GEMM before them (engine/codegen/programmatic.py)
        self.programmatic, self.dependents = programmatic, frozenset(dependents) if programmatic else frozenset()
        self.lt = LtProjection.on_current_device(cupy)
        self.rounded: dict = {}            # (stream, rows, cols) -> a rounded operand's buffer, reused in turn
        # layer 0's projection in pieces ahead of the steps (Executor._project_ahead), on a stream of its own
        self.ahead_stream = cupy.cuda.Stream(non_blocking=True) if ahead else None
        self.shared_sms = shared_sms       # the SMs a piece after the first plans for (0: all)
        self.sms = 0                       # the SMs the products being issued plan for
        # a cublasLt workspace a layer stream: their products run at once (the device's own serves one stream)
        self.workspaces = {stream.ptr: cupy.empty(WORKSPACE, dtype=cupy.uint8)
                           for stream in [*(self.streams or ()), *([self.ahead_stream] if ahead else [])]}
        self.forked: set = set()           # the layer streams a capture has forked from its stream, to join at its end
        self.ahead_forked = False          # the projection stream, forked the same way

    def stream(self, layer: int):
        """The layer's stream; in a capture, forked from the capturing stream first (an event it waits on), as CUDA
        requires of every stream that takes part in one."""
        if self.streams is not None and layer not in self.forked and self._fork(self.streams[layer]):
            self.forked.add(layer)
        return super().stream(layer)

    def _fork(self, stream) -> bool:
        """In a capture, `stream` made to wait for the capturing stream (an event): True where it was forked."""
        current = self.xp.cuda.get_current_stream()
        if not current.is_capturing():
            return False
        event = self.xp.cuda.Event(disable_timing=True)
        event.record(current)
        stream.wait_event(event)
        return True

    @contextlib.contextmanager
    def projection_stream(self, shared: bool):
        """The projection stream as the current stream (forked from a capture's stream first); shared: its products
        plan for shared_sms SMs, the steps running beside them."""
        if not self.ahead_forked:
            self.ahead_forked = self._fork(self.ahead_stream)
        self.sms = self.shared_sms if shared else 0
        try:
            with self.ahead_stream:
                yield self.ahead_stream
        finally:
            self.sms = 0

    def record_ahead(self):
        event = self.xp.cuda.Event(disable_timing=True)
        event.record(self.ahead_stream)
        return event

    def wait_ahead(self, event) -> None:
        """The current stream (layer 0's) waits for a piece of its projection."""
        self.xp.cuda.get_current_stream().wait_event(event)

    def launch(self, kernel, args, t: int, batch: int, sizes: dict) -> None:
        if kernel.name not in self.dependents:
            super().launch(kernel, args, t, batch, sizes)
            return
        function, grid, arguments = self.launch_arguments(kernel, args, t, batch, sizes)
        self.programmatic(function, grid, (THREADS_PER_BLOCK,), arguments, self.xp.cuda.get_current_stream().ptr)

    def mode_weight(self, weight, exact: bool) -> ModeWeight:
        """The weight as the GEMMs read it: rounded to the mode (float32x3: its two TF32 parts stacked, (2N, K))."""
        stored = self.asarray(weight)
        if self.split and not exact:
            stored = stack_split(self.xp, stored)
        elif not exact:
            stored = round_into(self.xp, stored, self.xp.empty(stored.shape, operand_dtype(self.xp, self.precision)),
                                self.precision)
        return ModeWeight(stored, exact)

    def operand_like(self, array, poison: bool):
        """A buffer for `array` (float32) in the mode's operand format (float32x3: two, hi and lo, stacked); poison:
        NaN bit patterns (0xFFFF is a NaN in fp16 and bf16)."""
        cupy = self.xp
        copy = cupy.empty(((2,) if self.split else ()) + tuple(array.shape), operand_dtype(cupy, self.precision))
        copy.view(cupy.uint16 if copy.itemsize == 2 else cupy.uint32).fill(
            (0xFFFF if copy.itemsize == 2 else 0x7FC00000) if poison else 0)
        return copy

    def round_copy(self, source, copy) -> None:
        if self.split:
            split_into(self.xp, self.xp.ascontiguousarray(source), copy)
        else:
            round_into(self.xp, source, copy, self.precision)

    def gemm(self, x, weight: ModeWeight, out, bias=None) -> None:
        """out = round(x) @ W^T (+ bias): x rounded into a buffer of this device first, unless W is exact."""
        cupy = self.xp
        x = cupy.ascontiguousarray(x)
        if weight.exact:
            self._multiply(x, weight, out, bias, "float32")
            return
        key = (cupy.cuda.get_current_stream().ptr, *x.shape)
        buffer = self.rounded.get(key)
        if buffer is None:
            shape = ((2,) if self.split else ()) + x.shape
            buffer = self.rounded[key] = cupy.empty(shape, operand_dtype(cupy, self.precision))
        if self.split:
            self._split_products(split_into(cupy, x, buffer), weight, out, bias)
        else:
            self._multiply(round_into(cupy, x, buffer, self.precision), weight, out, bias, self.precision)

    def product(self, operand, weight: ModeWeight, out, left: Left | None = None) -> None:
        """out = operand @ W^T, the operand in the mode's format already (a kernel's copy; float32x3: its parts).
        left (split_products.Left): the product left for the kernels to sum as they read it, out flat: K in planes
        (a reduced mode), or float32x3's P unfolded."""
        if self.split:                     # (a fixed matrix's operand has no copy: gemm() multiplies it)
            self._stacked_product(operand, weight, out, launch_fold=left is None)
        elif left is not None:                 # one strided batch of K slices, from the starts of A, W and out
            (call,) = slice_calls(*operand.shape, weight.stored.shape[0], left.count)
            self._lt(call.shape, operand.data.ptr, weight.stored.data.ptr, out, products=LT_OPERANDS[self.precision])
        else:
            self._multiply(operand, weight, out, None, self.precision)

    def _split_products(self, parts, weight: ModeWeight, out, bias) -> None:
        """float32x3's product of many rows (a projection): parts (2, M, K) = [x_hi; x_lo], the weight (2N, K) =
        [W_hi; W_lo]; out = x_hi W_lo^T + bias, then += x_lo W_hi^T, then += x_hi W_hi^T chunk by chunk."""
        _, M, K = parts.shape
        a, w, o = parts.data.ptr, weight.stored.data.ptr, out.data.ptr
        for call in split_calls(M, K, weight.stored.shape[0] // 2, chunking(K, self.x3_chunk), bias is not None):
            self._lt(call.shape, a + 4 * call.a, w + 4 * call.w, out, at=o + 4 * call.out,
                     bias=bias.data.ptr if call.bias else 0, accumulate=call.accumulate)

    def _stacked_product(self, operand, weight: ModeWeight, out, launch_fold: bool = True) -> None:
        """float32x3's step product (engine/schedules/split_products.py): operand (2, R, K) = [h_hi; h_lo] by W_hi in
        K chunks into P1 (chunks, 2R, N), one strided-batched GEMM (and one more for a rest), h_hi by W_lo into P2,
        then the fold into out (R, N); launch_fold=False: P into out (flat), for the kernels to fold as they read
        it."""
        _, R, K = operand.shape
        N = weight.stored.shape[0] // 2
        chunks = chunking(K, self.x3_chunk)
        key = (self.xp.cuda.get_current_stream().ptr, chunks.count, R, N)
        partial = self.partials.get(key) if launch_fold else out
        if partial is None:
            partial = self.partials[key] = self.xp.empty(partial_size(R, N, chunks), dtype=self.xp.float32)
        a, w, p = operand.data.ptr, weight.stored.data.ptr, partial.data.ptr
        for call in stacked_calls(R, K, N, chunks):
            self._lt(call.shape, a + 4 * call.a, w + 4 * call.w, partial, at=p + 4 * call.out)
        if launch_fold:
            fold(self.xp, partial, out, R, N, chunks.count)

    def _lt(self, shape: Product, a: int, w: int, out, *, bias: int = 0, accumulate: bool = False,
            at: int | None = None, products: tuple = X3_PRODUCTS) -> None:
        """One product into out (at: the address in it to write) through cublasLt: float32x3's parts (TF32), or the
        mode's operands (products: LT_OPERANDS' data and compute types), whole or in K slices."""
        if not out.flags.c_contiguous:
            raise BackendError("backend 'fused' in a precision mode writes GEMM outputs whole: got a strided one; "
                               "hint: this is a bug in engine/schedules/fused_modes.py")
        data_type, compute = products
        if not self.lt.product(shape, a, w, out.data.ptr if at is None else at, data_type, compute, bias=bias,
                               accumulate=accumulate, workspace=self._workspace(), sms=self.sms):
            sliced = "" if shape.batch == 1 else ", or x3_chunk=None" if self.split else ", or k_slices=1"
            raise BackendError(f"backend 'fused' in precision '{self.precision}': cublasLt offers no algorithm for a "
                               f"({shape.M} x {shape.K}) @ ({shape.K} x {shape.N}) product"
                               f"{f' in {shape.batch} K slices' if shape.batch > 1 else ''}; "
                               f"hint: use backend='persistent' or 'graph' in this mode{sliced}")

    def _multiply(self, operand, weight: ModeWeight, out, bias, mode: str) -> None:
        """out = operand @ W^T (+ bias), both whole, in `mode` (float32 for a reduction's fixed matrix)."""
        M, K = operand.shape
        self._lt(Product.dense(M, weight.stored.shape[0], K), operand.data.ptr, weight.stored.data.ptr, out,
                 bias=0 if bias is None else bias.data.ptr, products=LT_OPERANDS[mode])

    def synchronize(self) -> None:
        """Outside a capture, wait for the GPU. In one, join the forked layer streams into the capturing stream (the
        run's end; at its start nothing is forked yet)."""
        current = self.xp.cuda.get_current_stream()
        if not current.is_capturing():
            super().synchronize()
            if self.ahead_stream is not None:
                self.ahead_stream.synchronize()
            return
        joined = [self.streams[layer] for layer in sorted(self.forked)]
        for stream in joined + ([self.ahead_stream] if self.ahead_forked else []):
            event = self.xp.cuda.Event(disable_timing=True)
            event.record(stream)
            current.wait_event(event)
        self.forked.clear()
        self.ahead_forked = False

    def _workspace(self):
        """The current layer stream's cublasLt workspace (None: the device's own, on any other stream)."""
        return self.workspaces.get(self.xp.cuda.get_current_stream().ptr)


class NumpyModeDevice(NumpyDevice):
    """plan_numpy's NumpyDevice with the mode's GEMMs as the reference emulates them (engine.rounding.mode_matmul):
    the CPU tests run ModeExecutor's host logic on it."""

    def __init__(self, dtype, precision: str, x3_chunk: int | str | None = X3_CHUNK):
        super().__init__(dtype)
        self.precision = precision
        self.x3_chunk = x3_chunk

    def mode_weight(self, weight, exact: bool) -> ModeWeight:
        """float32x3: the parts stacked (2N, K), as ModeDevice stores them."""
        stored = self.asarray(weight)
        if self.precision == "float32x3" and not exact:
            stored = stack_split(np, stored).astype(stored.dtype)
        return ModeWeight(stored, exact)

    @contextlib.contextmanager
    def projection_stream(self, shared: bool):
        yield None                         # one host thread: the pieces run in order (the GPU's streams overlap them)

    def record_ahead(self):
        return None

    def wait_ahead(self, event) -> None:
        pass

    def gemm(self, x, weight, out, bias=None) -> None:
        w = weight.stored
        if weight.exact:
            out[...] = x @ w.T
        elif self.precision == "float32x3":            # the stacked parts in K chunks, folded: as ModeDevice's step
            rows, K = x.shape
            parts = split_into(np, np.ascontiguousarray(x, dtype=np.float32), np.empty((2, rows, K), np.float32))
            out[...] = stacked_product_numpy(parts, w, chunking(K, self.x3_chunk))
        else:
            out[...] = mode_matmul(w, x, self.precision, lambda a, b: b @ a.T)
        if bias is not None:
            out += bias
        self.launches += 1


def check_x3_chunk(chunk):
    """x3_chunk checked: "auto" (by each product's K), None (all of K) or a positive int."""
    if chunk is None or (isinstance(chunk, str) and chunk == "auto"):
        return chunk
    if type(chunk) is not bool and isinstance(chunk, (int, np.integer)) and chunk > 0:
        return int(chunk)
    raise BackendError(f"argument 'x3_chunk' must be \"auto\", None or a positive integer, got "
                       f"{type(chunk).__name__} {shown(chunk)}; hint: \"auto\" (the default) sizes each product's "
                       "chunks by its K, None makes one chunk, 256 chunks of 256 columns")


class FusedModeProgram:
    """A network with its parameters uploaded once, run in a precision mode; run(x) as FusedProgram.run."""

    replayed = "not replayed yet: the first run at a shape runs directly"

    def __init__(self, network: Network, params: Params, dtype=np.float32, *, precision: str = "bfloat16",
                 passes=None, layout: str = "blocked", chunk_steps: int | None = None, replay: bool = True,
                 layer_streams: bool = True, programmatic: bool = True, projection_ahead: bool | int = True,
                 projection_sms: int = 0, x3_chunk: int | str | None = X3_CHUNK, x3_fold: str = "kernel",
                 k_slices: int = 1):
        self.precision = check_fused_mode(precision)
        if self.precision not in MODES:
            raise BackendError(f"FusedModeProgram runs the modes {', '.join(MODES)}, not {self.precision!r}; hint: "
                               "engine.backends.fused runs strict float32")
        # float32x3: K of one tensor-core accumulator (engine/schedules/split_products.py; "auto": by each product's
        # K, split_products.chunk_size; None: all of K)
        self.x3_chunk = check_x3_chunk(x3_chunk)
        # float32x3: "kernel", P folded by the kernels that read the product (the default: one launch fewer a step,
        # 2-18 % faster over the anchors on an H200, 2026-11-28, the same bits); "launch", by a kernel of its own.
        # k_slices (tf32, float16, bfloat16): a step product's K in that many slices, one strided-batched GEMM whose
        # planes the kernels sum as they read them (engine/schedules/split_products.py; 1: one product)
        if x3_fold not in X3_FOLDS:
            raise BackendError(f"argument 'x3_fold' must be one of {', '.join(X3_FOLDS)}, got {x3_fold!r}; hint: "
                               "'launch' folds float32x3's products in a kernel of their own, 'kernel' in the cell's")
        self.x3_fold, self.k_slices = x3_fold, integer(k_slices, "argument 'k_slices' (1: one product)")
        check_float32_gpu_program("backend 'fused'", network, params, dtype)
        network, params = dense(network, params)      # heads as block-diagonal weights, reductions as matmuls
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        self.cupy, self.network, self.params = cupy, network, params
        self.options = dict(passes=passes, layout=layout, chunk_steps=chunk_steps)
        self.replay = replay
        self.layer_streams = layer_streams           # False: every layer on one stream (benchmarks/probe_fused_modes.py)
        # False: no programmatic dependent launches (engine/codegen/programmatic.py), for probes and tests
        self.programmatic = ProgrammaticLaunch.on_current_device(cupy) if programmatic else None
        # layer 0's projection in pieces on a stream of its own, ahead of the steps (Executor._project_ahead): True,
        # pieces of ahead_steps(T, B) for a one-layer network (with more layers the chunks' wavefront overlaps the
        # projections already, and pieces cost ~1 % at `large`); an int, pieces of that many steps, any network; the
        # pieces after the first plan for projection_sms SMs (0: all; benchmarks/probe_fused_ahead.py: no better)
        self.projection_ahead, self.projection_sms = projection_ahead, projection_sms
        self._shape = None
        self._executor = None
        self._replays: dict = {}           # (T, B, lengths) -> ChunkReplay
        self._lengths: dict = {}           # (T, B) -> the lengths' device buffer the replays read

    def executor(self, T: int, B: int, lengths: bool = False) -> ModeExecutor:
        if self._shape != (T, B, lengths):
            cupy, network = self.cupy, self.network
            plan, needed = fitting_plan(cupy, network, T, B, self.options, lengths)
            program = plan.program
            fixed = fixed_gemms(program, program.cell)
            copies = operand_copies(program, self.precision, {name for name, strict in fixed.items() if strict})
            waits = programmatic_waits(program) if self.programmatic else {}
            left = left_products(plan, self.precision, copied_buffers(program, copies), fixed, self.k_slices,
                                 self.x3_chunk, self.x3_fold)
            extra = split_bytes(plan, self.x3_chunk) if self.precision == "float32x3" else left_bytes(plan, left)
            if extra:
                needed += extra
                check_fits(needed, f"backend 'fused' in {self.precision} with T={T}, B={B}, L={network.num_layers}, "
                           f"H={network.hidden_size}", "x's steps and batch, hidden_size", on="device",
                           limit=available_device_bytes(cupy), hint="run fewer steps or a smaller batch at a time, "
                           "or fewer K chunks or slices (x3_chunk, k_slices)")
            readers = {g.out_buffer: left[g.name].reader() for g in program.gemms if g.name in left}
            source = render_copies_module(program, self.precision, copies, GENERATOR_VERSION, waits,
                                          read_places(program, readers))
            ahead = self.projection_ahead if type(self.projection_ahead) is int else \
                ahead_steps(T, B) if self.projection_ahead and network.num_layers == 1 else None
            device = ModeDevice(cupy, load_module(source, cell=network.cell.name), network.num_layers,
                                self.precision, projection=network.cell.uses_projection,
                                streams=self.layer_streams and network.num_layers > 1 and plan.num_chunks > 1,
                                programmatic=self.programmatic, dependents=waits, ahead=ahead is not None,
                                shared_sms=self.projection_sms, x3_chunk=self.x3_chunk)
            executor = ModeExecutor(plan, device, copies, fixed, ahead, left)
            executor.load(self.params)
            executor.bytes = needed
            self._shape, self._executor = (T, B, lengths), executor
            self._replays = {}
        return self._executor

    def run(self, x, initial_states: dict | None = None, *, poison: bool = False, lengths=None) -> RunResult:
        """x: (T, B, I), NumPy or CuPy; CuPy comes back for CuPy, NumPy otherwise. poison=True fills every work
        buffer with NaN first and runs directly (tests). lengths: (B,) each sequence's steps."""
        cupy = self.cupy
        check_gpu_run_inputs("backend 'fused'", cupy, self.network, x, initial_states)
        T, B, _ = (int(n) for n in x.shape)
        steps = check_lengths(lengths, T, B)
        key = (T, B, steps is not None)
        replay = (self.replay and not poison and self._shape == key
                  and not cupy.cuda.get_current_stream().is_capturing())
        executor = self.executor(*key)
        lengths_device = None
        if steps is not None:
            lengths_device = self._lengths.get((T, B))
            if lengths_device is None:
                lengths_device = self._lengths[(T, B)] = cupy.zeros(B, dtype=cupy.int32)
            lengths_device.set(steps.astype(np.int32))
        if replay:
            found = self._replays.get(key) or self._capture(key, executor, lengths_device)
            if found is not None:
                return self._replayed(found, x, initial_states, executor)
        on_gpu = isinstance(x, cupy.ndarray)
        outputs, final = executor.run(None, executor.device.asarray(x), initial_states, poison=poison,
                                      lengths=lengths_device)
        if not on_gpu:
            outputs, final = cupy.asnumpy(outputs), {k: cupy.asnumpy(v) for k, v in final.items()}
        return RunResult(outputs=outputs, final_states=final, backend="fused", info=self._info(executor))

    def _capture(self, key, executor: ModeExecutor, lengths_device):
        def body(x, states):
            outputs, final = executor.run(None, x.reshape(key[0], key[1], -1), states.get("run"),
                                          lengths=lengths_device)
            return outputs, {"run": final}
        replay = whole_run_replay(self, body, key, self.network.input_size)
        if replay is not None:
            self._replays[key] = replay
        return replay

    def _replayed(self, replay, x, initial_states, executor) -> RunResult:
        outputs, final = launch_replay(self.cupy, replay, x, initial_states)
        return RunResult(outputs=outputs, final_states=final, backend="fused", info=self._info(executor))

    def _info(self, executor: ModeExecutor) -> dict:
        plan = executor.plan
        return {"launches_per_step": plan.launches_per_step, "chunk_steps": plan.chunk_steps,
                "program": plan.program.key, "bytes": executor.bytes, "lengths": plan.program.lengths,
                "precision": self.precision, "replayed": self.replayed}


def prepare(network: Network, params: Params, dtype=np.float32, *, precision: str = "bfloat16", passes=None,
            layout: str = "blocked", chunk_steps: int | None = None, replay: bool = True,
            layer_streams: bool = True, programmatic: bool = True, projection_ahead: bool | int = True,
            projection_sms: int = 0, x3_chunk: int | str | None = X3_CHUNK, x3_fold: str = "kernel",
            k_slices: int = 1) -> FusedModeProgram:
    """Plan, compile and upload once; the result's run(x) is what the benchmark times."""
    return FusedModeProgram(network, params, dtype, precision=precision, passes=passes, layout=layout,
                            chunk_steps=chunk_steps, replay=replay, layer_streams=layer_streams,
                            programmatic=programmatic, projection_ahead=projection_ahead,
                            projection_sms=projection_sms, x3_chunk=x3_chunk, x3_fold=x3_fold, k_slices=k_slices)


def run(network: Network, params: Params, x, initial_states: dict | None = None, dtype=np.float32, *,
        precision: str = "bfloat16", poison: bool = False, lengths=None, **options) -> RunResult:
    return prepare(network, params, dtype, precision=precision, **options).run(x, initial_states, poison=poison,
                                                                               lengths=lengths)
