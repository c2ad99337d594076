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

float32x3 multiplies 11-bit parts (engine/schedules/split_products.py): the weights are stored as their two parts
stacked, [W_hi; W_lo]; the kernels write a step's operand as its two parts, [h_hi; h_lo]; one strided-batched GEMM
multiplies both by W_hi in K chunks, one more h_hi by W_lo, and the cell kernels fold the products as they read them
(x3_fold="kernel"; "launch": one small kernel of its own). A step product's parts are held as fp16 (x3_parts="fp16",
the default: half the bytes, fp16 tensor cores, the lo parts times 2^11) or as TF32 values in fp32; a weight or step
operand past fp16's range (65504) runs the program again in TF32 parts (ModeExecutor refuses the weight at upload,
the copies flag the operand, FusedModeProgram.run reads the flag after each run). The projections split their input
into a buffer of the run's own, in the same parts (the split flags it too), and make three products into their
output (x_hi W_lo with the bias, then x_lo W_hi, then x_hi W_hi in K chunks, each added by cublasLt's fp32 epilogue;
in fp16 parts the first two scaled by 2^-11 through cublasLt's alpha). On sm_90 a step's product in fp16 parts runs
on the engine's own wgmma kernel instead (step_product="auto" or "wgmma"; engine/schedules/wgmma_products.py): one
launch, each K chunk's accumulator promoted into an fp32 sum in registers, nothing left to fold; the copies and the
weights are then in its tiles. step_product="wgmma" runs a reduced mode's step products on the engine's own kernel
of the same design (kernels/mode_wgmma.cu; a bf16 or fp16 weight past the L2, kernels/mode_wide.cu: 128 rows a block).

tf32's step GEMMs hold their weights and operands' copies as fp16 shifted by powers of two (tf32_storage="fp16", what
"auto" picks with the products on cuBLAS; engine/schedules/tf32_fp16.py): the same 11-bit values from half the
bytes, on fp16 tensor cores, the shift undone by alpha. A weight it cannot hold (a row ~2^18 smaller than the
largest) or a step operand past the copy's range (~64) runs the program again with tf32_storage="tf32", for good
(info["tf32_storage_fallback"] says why). The projections stay TF32: their inputs are the user's data, of any range.
"""
from __future__ import annotations

import math

import numpy as np

from ..arguments import integer, shown
from ..backends.common import RunResult, check_float32_gpu_program, check_gpu_run_inputs, check_precision
from ..backends.fused import Executor, fitting_plan
from ..backends.lengths import check_lengths
from ..codegen import GENERATOR_VERSION
from ..codegen.cuda import flags_range
from ..codegen.nvrtc import load_module
from ..codegen.operand_copies import copied_buffers, operand_copies, render_copies_module
from ..codegen.programmatic import ProgrammaticLaunch, programmatic_waits
from ..dense import dense
from ..errors import BackendError
from ..memory import available_device_bytes, check_fits
from ..network import Network
from ..params import Params
from ..plan import pack_weights
from .base import launch_replay, whole_run_replay
from .mode_device import ModeDevice, Tf32StorageError, X3RangeError, X3SplitKError
from .split_products import (
    FP16_LIMIT,
    FP16_SMALL,
    X3_CHUNK,
    X3_FOLDS,
    X3_PARTS,
    X3_PARTS_DEFAULT,
    X3_SPLITK,
    X3_SPLITK_MIN_K,
    fp16_parts_hold,
    in_fp16_range,
    left_bytes,
    left_products,
    read_places,
    split_bytes,
)
from .tf32_fp16 import OPERAND_LIMIT, TF32_STORAGES, check_weight
from .wgmma_products import STEP_PRODUCTS, resolve_product, wgmma_capable

MODES = ("tf32", "float16", "bfloat16", "float32x3")
# the modes the autotuner times this backend in (float32x3 only where a user allows it, and each candidate's error held
# against float64 there: autotune.X3Gate)
TUNED_MODES = ("tf32", "float16", "bfloat16", "float32x3")
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
        # float32x3: the GEMMs whose parts are the device's x3_parts (fp16 where asked): the projections (their input
        # split by split_into, which flags values past fp16's range) and the step GEMMs whose operand the kernels copy
        # (all of them on the NumPy device, which has no copies); a step GEMM with no copy has TF32 parts. tf32 held as
        # fp16 (device.half): "fp16" for those step GEMMs, the projections TF32. tiled: the copied step GEMMs, whose
        # weights are in the wgmma product's tiles where the device has them
        parts = device.x3_parts or ("fp16" if device.half else None)
        self.parts = {g.name: parts if parts and not self.fixed[g.name] and (g.hoisted and not device.half or (
                      not g.hoisted and (g.in_buffer in self.copied or not device.copies_operands))) else "tf32"
                      for g in self.program.gemms}
        self.tiled = {g.name for g in self.program.gemms if not g.hoisted and g.in_buffer in self.copied}
        # per kernel, the (buffer, version) of each copy argument, in render_kernel's order after its own params
        params = {(k.name, p.name): p for k in self.program.kernels for p in k.params}
        self.copy_sources = {kernel: [(params[(kernel, name)].source, params[(kernel, name)].version) for name in named]
                             for kernel, named in copies.items()}
        self.flagged = {kernel for kernel, named in copies.items() if flags_range(named)}    # take the range flag

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
        self.device.reset_range()          # fp16 parts: the range flag, before anything can set it
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
        """The kernel's own arguments, then its copies', then the range flag where its copies set it (render_kernel
        puts them after the kernel's params in that order)."""
        args = super()._kernel_args(layer, item, t)
        for source, version in self.copy_sources.get(item.name, ()):
            args.append(self._version(self.copy_arrays[layer][source], version, t))
        if item.name in self.flagged:
            args.append(self.device.range_flag)
        return args

    def _upload_params(self, params: Params):
        plan, device, fixed = self.plan, self.device, self.fixed
        weights, vectors = [], []
        for layer in range(plan.network.num_layers):
            packed = pack_weights(self.program, plan.network, params, layer)
            for name, p in packed.items():
                why = check_weight(p.weight) if device.half and self.parts[name] == "fp16" else None
                if why:
                    raise Tf32StorageError(f"layer {layer}'s weight of GEMM '{name}' {why}")
                if device.half:
                    continue
                if self.parts[name] == "fp16" and not in_fp16_range(p.weight):
                    raise X3RangeError(f"layer {layer}'s weight of GEMM '{name}' has values past fp16's range "
                                       f"(|w| > {FP16_LIMIT:g})")
                if self.parts[name] == "fp16" and not fp16_parts_hold(p.weight):
                    raise X3RangeError(f"layer {layer}'s weight of GEMM '{name}' is too small for fp16 parts (mean "
                                       f"|w| < {FP16_SMALL:g}: fp16's subnormals would lose its low bits)")
            weights.append({name: (device.mode_weight(p.weight, fixed[name], self.parts[name], name in self.tiled),
                                   None if p.bias is None else device.asarray(p.bias))
                            for name, p in packed.items()})
            vectors.append({name: device.asarray(np.asarray(params[layer][name]))
                            for name in self.program.kernel_params})
        return weights, vectors

    def _gemm_bias(self, operands, weight, bias, out) -> None:
        self.device.gemm(operands, weight, out, bias)


def check_step_product(product, precision: str, parts: str, splitk, k_slices: int, capable: bool) -> str:
    """step_product checked: one of STEP_PRODUCTS; "wgmma" only on an sm_90 GPU, in float32x3 only with fp16 parts
    and no split-K, in a reduced mode only with its K whole (k_slices=1)."""
    if not isinstance(product, str) or product not in STEP_PRODUCTS:
        raise BackendError(f"argument 'step_product' must be one of {', '.join(STEP_PRODUCTS)}, got {shown(product)}; "
                           "hint: \"wgmma\" multiplies a step's product on the engine's own Hopper kernel, \"cublaslt\" "
                           "on cuBLAS, \"auto\" picks (float32x3 in fp16 parts: the engine's kernel on sm_90)")
    if product == "wgmma":
        x3 = precision == "float32x3"
        why = ("an sm_90 GPU (H100, H200: it issues wgmma)" if not capable else
               "x3_parts='fp16' (it multiplies fp16 parts)" if x3 and parts != "fp16" else
               "x3_splitk=False (cublasLt's split-K is the other product)" if x3 and splitk is not False else
               "k_slices=1 (it multiplies K whole)" if not x3 and k_slices != 1 else None)
        if why:
            raise BackendError(f"step_product='wgmma' needs {why}; hint: step_product='auto' picks the product that "
                               "runs")
    return product


def check_tf32_storage(storage) -> str:
    """tf32_storage checked: one of TF32_STORAGES."""
    if not isinstance(storage, str) or storage not in TF32_STORAGES:
        raise BackendError(f"argument 'tf32_storage' must be one of {', '.join(TF32_STORAGES)}, got {shown(storage)}; "
                           "hint: \"fp16\" holds tf32's step operands and weights as fp16 shifted by powers of two (the "
                           "same values, half the bytes), \"tf32\" as TF32 values in fp32, \"auto\" picks")
    return storage


def resolve_tf32_storage(storage, product: str, precision: str) -> str:
    """tf32_storage as it runs: "fp16" or "tf32" ("auto": fp16 unless the step products run on the engine's wgmma
    kernel, which reads TF32 values; "tf32" in the other modes, which it does not concern)."""
    if precision != "tf32":
        return "tf32"
    if storage == "fp16" and product == "wgmma":
        raise BackendError("tf32_storage='fp16' runs the step products on cuBLAS, not step_product='wgmma'; hint: "
                           "tf32_storage='tf32' (or 'auto') with the wgmma kernel")
    return "tf32" if storage == "auto" and product == "wgmma" else "fp16" if storage == "auto" else storage


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
                 k_slices: int = 1, x3_parts: str = X3_PARTS_DEFAULT, x3_splitk: bool | str = X3_SPLITK,
                 step_product: str = "auto", tf32_storage: str = "auto"):
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
        # float32x3: how a step product's parts are held (split_products.py): "tf32", fp32 values on TF32 tensor cores;
        # "fp16", fp16 values on fp16 tensor cores, half the bytes. A weight or step operand past fp16's range
        # (|v| > 65504) makes the program run again in "tf32" parts (info["x3_parts_fallback"] says why), and so does a
        # weight too small for them (mean |w| < 2^-12: fp16's subnormals would cost it its low bits); the check reads a flag
        # after each run, so a run captured into a caller's own CUDA graph is not checked: use "tf32" there.
        if x3_parts not in X3_PARTS:
            raise BackendError(f"argument 'x3_parts' must be one of {', '.join(X3_PARTS)}, got {shown(x3_parts)}; "
                               "hint: 'tf32' holds float32x3's parts as fp32 values, 'fp16' as fp16 ones (half the "
                               "bytes; values past 65504 fall back to 'tf32')")
        self.x3_parts = x3_parts
        self.fallbacks: dict = {}          # {"x3_parts", "x3_splitk" or "tf32_storage": why it fell back}
        # float32x3: the W_hi product's K chunks as cublasLt's split-K (True), a strided batch of planes (False), or
        # by K ("auto": split_products.uses_splitk); where cublasLt refuses it the program runs again with the batch
        if x3_splitk not in (True, False, "auto") or type(x3_splitk) not in (bool, str):
            raise BackendError(f"argument 'x3_splitk' must be True, False or \"auto\", got {shown(x3_splitk)}; hint: "
                               f"\"auto\" splits K in cublasLt where K is at least {X3_SPLITK_MIN_K} (fp16 parts), "
                               "False (the default) multiplies the K chunks as a strided batch")
        self.x3_splitk = x3_splitk
        check_tf32_storage(tf32_storage)
        check_float32_gpu_program("backend 'fused'", network, params, dtype)
        network, params = dense(network, params)      # heads as block-diagonal weights, reductions as matmuls
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        # the step products on the engine's wgmma kernels ("wgmma", sm_90) or on cuBLAS ("cublaslt"); "auto": float32x3
        # in fp16 parts on the engine's (after a fallback to TF32 parts, cublasLt), the reduced modes on cuBLAS
        self.wgmma = wgmma_capable(cupy)   # the GPU runs the engine's wgmma step products (sm_90)
        self.step_product = check_step_product(step_product, self.precision, x3_parts, x3_splitk, self.k_slices,
                                               self.wgmma)
        # tf32: its step GEMMs' weights and operands held as shifted fp16 ("fp16": tf32_fp16.py) or TF32 values in
        # fp32 ("tf32"); "auto": fp16 where the step products run on cuBLAS (the engine's wgmma kernel reads TF32)
        self.tf32_storage = resolve_tf32_storage(tf32_storage, self.step_product, self.precision)
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
            tiles = self.product() == "wgmma"
            copies = operand_copies(program, self.precision, {name for name, strict in fixed.items() if strict},
                                    self.x3_parts, tiles, self.tf32_storage)
            waits = programmatic_waits(program) if self.programmatic else {}
            left = {} if tiles else left_products(plan, self.precision, copied_buffers(program, copies), fixed,
                                                  self.k_slices, self.x3_chunk, self.x3_fold, self.x3_parts,
                                                  self.x3_splitk)
            extra = split_bytes(plan, self.x3_chunk, tiles) if self.precision == "float32x3" else \
                left_bytes(plan, left)
            if extra:
                needed += extra
                check_fits(needed, f"backend 'fused' in {self.precision} with T={T}, B={B}, L={network.num_layers}, "
                           f"H={network.hidden_size}", "x's steps and batch, hidden_size", on="device",
                           limit=available_device_bytes(cupy), hint="run fewer steps or a smaller batch at a time, "
                           "or fewer K chunks or slices (x3_chunk, k_slices)")
            readers = {g.out_buffer: left[g.name].reader() for g in program.gemms if g.name in left}
            source = render_copies_module(program, self.precision, copies, GENERATOR_VERSION, waits,
                                          read_places(program, readers), self.x3_parts, self.tf32_storage)
            ahead = self.projection_ahead if type(self.projection_ahead) is int else \
                ahead_steps(T, B) if self.projection_ahead and network.num_layers == 1 else None
            module = load_module(source, cell=network.cell.name)
            device = ModeDevice(cupy, module, network.num_layers, self.precision,
                                projection=network.cell.uses_projection,
                                streams=self.layer_streams and network.num_layers > 1 and plan.num_chunks > 1,
                                programmatic=self.programmatic, dependents=waits, ahead=ahead is not None,
                                shared_sms=self.projection_sms, x3_chunk=self.x3_chunk, x3_parts=self.x3_parts,
                                x3_splitk=self.x3_splitk, tiles=tiles, tf32_storage=self.tf32_storage)
            executor = ModeExecutor(plan, device, copies, fixed, ahead, left)
            executor.load(self.params)
            executor.bytes = needed
            self._shape, self._executor = (T, B, lengths), executor
            self._replays = {}
        return self._executor

    def run(self, x, initial_states: dict | None = None, *, poison: bool = False, lengths=None) -> RunResult:
        """x: (T, B, I), NumPy or CuPy; CuPy comes back for CuPy, NumPy otherwise. poison=True fills every work
        buffer with NaN first and runs directly (tests). lengths: (B,) each sequence's steps. float32x3 in fp16
        parts: a weight or step operand past fp16's range runs the program again in TF32 parts, for good; tf32 held as
        fp16 likewise, with tf32_storage="tf32"."""
        try:
            result = self._run(x, initial_states, poison, lengths)
            past = (self._half() and not self.cupy.cuda.get_current_stream().is_capturing()
                    and self._executor.device.out_of_range())
        except (X3RangeError, Tf32StorageError) as e:
            past = e.reason
        except X3SplitKError as e:
            if self.x3_splitk is False:
                raise
            self._fall_back("x3_splitk", False, e.reason)
            return self.run(x, initial_states, poison=poison, lengths=lengths)
        if not past:
            return result
        if self.precision == "tf32":
            self._fall_back("tf32_storage", "tf32", past if isinstance(past, str) else
                            f"a step operand went past its fp16 copy's range (|v| > {OPERAND_LIMIT:.4g})")
        else:
            self._fall_back("x3_parts", "tf32", past if isinstance(past, str) else
                            "an operand (a step's, or a projection's input) went past fp16's range (|v| > 65504)")
        return self.run(x, initial_states, poison=poison, lengths=lengths)

    def _half(self) -> bool:
        """Whether the program holds values in fp16 that the range flag checks: float32x3's fp16 parts, tf32's fp16
        storage."""
        return (self.x3_parts == "fp16" if self.precision == "float32x3" else
                self.precision == "tf32" and self.tf32_storage == "fp16")

    def product(self) -> str:
        """The step products as they run now: "wgmma" or "cublaslt" (wgmma_products.resolve_product)."""
        return resolve_product(self.step_product, self.precision, self.x3_parts, self.x3_splitk, self.wgmma)

    def _fall_back(self, option: str, value, why: str) -> None:
        """float32x3 or tf32: `option` set to `value` for good (info[option + "_fallback"] says why) and the program built
        again at the next run, once the GPU has finished what the dropped one issued (a run cut short by a refused
        product leaves work on its layer streams, in buffers the new one may be given)."""
        self.cupy.cuda.Device().synchronize()
        setattr(self, option, value)
        self.fallbacks[option] = why
        self._shape, self._executor, self._replays = None, None, {}

    def _run(self, x, initial_states, poison: bool, lengths) -> RunResult:
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
                "precision": self.precision, "replayed": self.replayed, "step_product": self.product(),
                **({"x3_parts": self.x3_parts, "x3_splitk": self.x3_splitk} if self.precision == "float32x3" else
                   {"tf32_storage": self.tf32_storage} if self.precision == "tf32" else {}),
                **{f"{option}_fallback": why for option, why in self.fallbacks.items()}}


def prepare(network: Network, params: Params, dtype=np.float32, *, precision: str = "bfloat16", passes=None,
            layout: str = "blocked", chunk_steps: int | None = None, replay: bool = True,
            layer_streams: bool = True, programmatic: bool = True, projection_ahead: bool | int = True,
            projection_sms: int = 0, x3_chunk: int | str | None = X3_CHUNK, x3_fold: str = "kernel",
            k_slices: int = 1, x3_parts: str = X3_PARTS_DEFAULT, x3_splitk: bool | str = X3_SPLITK,
            step_product: str = "auto", tf32_storage: str = "auto") -> FusedModeProgram:
    """Plan, compile and upload once; the result's run(x) is what the benchmark times."""
    return FusedModeProgram(network, params, dtype, precision=precision, passes=passes, layout=layout,
                            chunk_steps=chunk_steps, replay=replay, layer_streams=layer_streams,
                            programmatic=programmatic, projection_ahead=projection_ahead,
                            projection_sms=projection_sms, x3_chunk=x3_chunk, x3_fold=x3_fold, k_slices=k_slices,
                            x3_parts=x3_parts, x3_splitk=x3_splitk, step_product=step_product,
                            tf32_storage=tf32_storage)


def run(network: Network, params: Params, x, initial_states: dict | None = None, dtype=np.float32, *,
        precision: str = "bfloat16", poison: bool = False, lengths=None, **options) -> RunResult:
    return prepare(network, params, dtype, precision=precision, **options).run(x, initial_states, poison=poison,
                                                                               lengths=lengths)
