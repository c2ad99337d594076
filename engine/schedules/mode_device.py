"""The devices of the fused backend in a precision mode (engine/schedules/fused_modes.py): ModeDevice, the CuPy one,
whose GEMMs take the mode through cublasLt (engine/schedules/cublaslt.py), and NumpyModeDevice, the host logic's
stand-in for the CPU tests (its GEMMs as engine.rounding emulates the mode).

    device = ModeDevice(cupy, module, num_layers, "float32x3", x3_parts="fp16")
    weight = device.mode_weight(packed, exact=False, parts="fp16")      # [W_hi; W_lo] as the products read it
    device.product(operand, weight, out, left)                            # a step's product (its operand a copy)

float32x3's parts (split_products.py): "tf32", each part a TF32 value held in fp32, multiplied on TF32 tensor cores;
"fp16", the same 11-bit parts held as fp16 (the lo part times 2^11), multiplied on fp16 tensor cores from half the
bytes; a value past fp16's range (|v| > 65504) sets the program's range flag (kernels write it) and the program
runs again in TF32 parts (fused_modes.FusedModeProgram). tiles (sm_90; float32x3 in fp16 parts, or a reduced mode):
the step products on the engine's own wgmma kernels (wgmma_products.py), the weights and the operands' copies in
their tiles. tf32_storage="fp16": tf32's step GEMMs hold their weights and operands' copies as fp16 shifted by powers
of two (engine/schedules/tf32_fp16.py), multiplied on fp16 tensor cores, the shift undone by alpha; an operand past
the copy's range sets the same flag.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import numpy as np

from ..backends.fused import THREADS_PER_BLOCK, CupyDevice
from ..backends.plan_numpy import NumpyDevice
from ..codegen.cublas_enums import CUBLAS_COMPUTE_32F, CUDA_R_16F
from ..errors import BackendError
from ..rounding import mode_matmul
from .cublaslt import WORKSPACE, LtError, LtProjection, Product
from .project import LT_OPERANDS, operand_dtype, round_into
from .split_products import (
    LO_SCALE,
    X3_CHUNK,
    Chunks,
    Left,
    chunking,
    fold,
    part_dtype,
    partial_size,
    slice_calls,
    split_calls,
    split_into,
    splitk_calls,
    stack_split,
    stacked_calls,
    stacked_product_numpy,
    uses_splitk,
)
from .tf32_fp16 import product_numpy as tf32_fp16_numpy
from .tf32_fp16 import round_into as tf32_fp16_into
from .tf32_fp16 import scaled_weight
from .wgmma_products import (
    mode_product,
    promote_columns,
    promoted_product,
    round_tiles_into,
    tile_mode_weight,
    tile_split_into,
    tile_weight,
    tiled_mode_operand,
    tiled_operand,
)

X3_PRODUCTS = LT_OPERANDS["tf32"]       # float32x3's TF32 parts: fp32 storage, TF32 tensor-core products
X3_FP16_PRODUCTS = (CUDA_R_16F, CUBLAS_COMPUTE_32F)   # its fp16 parts: fp16 storage, fp32 accumulation


@dataclass(frozen=True)
class ModeWeight:
    """A packed GEMM weight as the mode multiplies it: `stored` (N, K), in the mode's storage unless `exact` (a
    reduction's fixed matrix: strict fp32); float32x3: (2N, K), its parts stacked, held as `parts` ("tf32" or "fp16"),
    or where `tiles` is its (N, K), flat in the wgmma product's tiles (wgmma_products.tile_weight); tf32 held as fp16
    (parts "fp16"): (N, K) fp16, shifted, and `scale` what the product's sums are multiplied by (tf32_fp16.py)."""
    stored: object
    exact: bool
    parts: str | None = None
    tiles: tuple | None = None
    scale: float | None = None


class X3Fallback(BackendError):
    """A float32x3 setting this program cannot keep; fused_modes.FusedModeProgram falls back and runs again, with
    `reason` (the message without its hint) in info[<option>_fallback]."""
    hint = ""

    def __init__(self, reason: str):
        super().__init__(f"{reason}; hint: {self.hint}")
        self.reason = reason


class X3SplitKError(X3Fallback):
    """float32x3's W_hi product cannot be split on cublasLt's split-K here: the program runs again with its K chunks
    as a strided batch."""
    hint = "x3_splitk=False multiplies the K chunks as a strided batch"


class Tf32StorageError(X3Fallback):
    """tf32's fp16 storage cannot hold a weight or a step operand (tf32_fp16.py): the program runs again with
    tf32_storage="tf32"."""
    hint = "tf32_storage='tf32' holds it"


class X3RangeError(X3Fallback):
    """float32x3's fp16 parts cannot hold a value (|v| > 65504, or a weight too small): the program runs again in
    TF32 parts."""
    hint = "x3_parts='tf32' holds it"


class ModeDevice(CupyDevice):
    """CupyDevice whose GEMMs take the mode: out = round(x) @ W^T (+ bias) through cublasLt, on the current stream
    (a layer's, where the layers have streams)."""

    copies_operands = True                 # the kernels write each step GEMM's operand in the mode (operand_copies)

    def __init__(self, cupy, module, num_layers: int, precision: str, projection: bool = False,
                 streams: bool = False, programmatic=None, dependents=frozenset(), ahead: bool = False,
                 shared_sms: int = 0, x3_chunk: int | str | None = X3_CHUNK, x3_parts: str = "tf32",
                 x3_splitk: bool | str = False, tiles: bool = False, tf32_storage: str = "tf32"):
        super().__init__(cupy, module, num_layers, streams=streams, projection=projection)
        self.precision = precision
        self.split = precision == "float32x3"
        self.x3_chunk = x3_chunk           # float32x3: K of one accumulator (split_products.chunking)
        self.x3_parts = x3_parts if self.split else None    # float32x3: how the step products' parts are held
        self.x3_splitk = x3_splitk         # float32x3: the W_hi product's K chunks as cublasLt's split-K (uses_splitk)
        self.half = precision == "tf32" and tf32_storage == "fp16"      # tf32 held as shifted fp16 (tf32_fp16.py)
        # the step products on the wgmma kernels (wgmma_products.py), operands and weights in tiles: float32x3 in fp16
        # parts, or a reduced mode
        self.tiles = tiles and (self.x3_parts == "fp16" if self.split else not self.half)
        # fp16 copies: the program's own flag, a uint32 the copies set where an operand is past their range (the
        # kernels take it as a parameter: codegen.cuda RANGE_PARAM), reset at each run's start and read at its end
        # (fused_modes.FusedModeProgram); two programs never share one
        self.range_flag = cupy.zeros(1, dtype=cupy.uint32) if self.x3_parts == "fp16" or self.half else None
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

    def mode_weight(self, weight, exact: bool, parts: str = "tf32", tiles: bool = False) -> ModeWeight:
        """The weight as the GEMMs read it: rounded to the mode (float32x3: its two parts stacked, (2N, K), in `parts`,
        the device's x3_parts but for a step GEMM whose operand no kernel copies; tiles: a step GEMM's weight in the
        wgmma product's tiles, where the device has them; tf32 with parts "fp16": shifted fp16, tf32_fp16.py)."""
        if self.half and parts == "fp16" and not exact:
            stored, scale = scaled_weight(weight)
            return ModeWeight(self.xp.asarray(stored), exact, parts, scale=scale)
        stored = self.asarray(weight)
        if tiles and self.tiles and not exact and (parts == "fp16" or not self.split):
            layout = tile_weight(self.xp, stored) if self.split else tile_mode_weight(self.xp, stored, self.precision)
            return ModeWeight(layout, exact, parts if self.split else None, tiles=tuple(stored.shape))
        if self.split and not exact:
            return ModeWeight(stack_split(self.xp, stored, parts), exact, parts)
        if not exact:
            stored = round_into(self.xp, stored, self.xp.empty(stored.shape, operand_dtype(self.xp, self.precision)),
                                self.precision)
        return ModeWeight(stored, exact)

    def operand_like(self, array, poison: bool):
        """A buffer for `array` (float32) in the mode's operand format (float32x3: two, hi and lo, stacked, in the
        device's x3_parts; in the wgmma product's tiles where the device has them); poison: NaN bit patterns (0xFFFF
        is a NaN in fp16 and bf16)."""
        cupy = self.xp
        if self.tiles:
            R, K = array.shape[0], array.size // array.shape[0]
            return tiled_operand(cupy, R, K, poison) if self.split else \
                tiled_mode_operand(cupy, R, K, self.precision, poison)
        dtype = part_dtype(cupy, self.x3_parts) if self.split else cupy.float16 if self.half else \
            operand_dtype(cupy, self.precision)
        copy = cupy.empty(((2,) if self.split else ()) + tuple(array.shape), dtype)
        copy.view(cupy.uint16 if copy.itemsize == 2 else cupy.uint32).fill(
            (0xFFFF if copy.itemsize == 2 else 0x7FC00000) if poison else 0)
        return copy

    def reset_range(self) -> None:
        """fp16 parts: the range flag cleared on the current stream (a run's first launch; captured with it)."""
        if self.range_flag is not None:
            self.range_flag.fill(0)

    def out_of_range(self) -> bool:
        """fp16 parts: whether the run just issued put a step operand past fp16's range (waits for it)."""
        return self.range_flag is not None and bool(int(self.range_flag.get()[0]))

    def round_copy(self, source, copy) -> None:
        if self.tiles:
            rows = self.xp.ascontiguousarray(source).reshape(source.shape[0], -1)
            if self.split:
                tile_split_into(self.xp, rows, copy, self.range_flag)
            else:
                round_tiles_into(self.xp, rows, copy, self.precision)
        elif self.split:
            split_into(self.xp, self.xp.ascontiguousarray(source), copy, self.x3_parts, self.range_flag)
        elif self.half:
            tf32_fp16_into(self.xp, source, copy, self.range_flag)
        else:
            round_into(self.xp, source, copy, self.precision)

    def gemm(self, x, weight: ModeWeight, out, bias=None) -> None:
        """out = round(x) @ W^T (+ bias): x rounded into a buffer of this device first, unless W is exact."""
        cupy = self.xp
        x = cupy.ascontiguousarray(x)
        if weight.exact:
            self._multiply(x, weight, out, bias, "float32")
            return
        if weight.tiles:
            raise BackendError("backend 'fused' in float32x3: a weight in the wgmma product's tiles was given an "
                               "operand no kernel copies; hint: this is a bug in engine/schedules/fused_modes.py "
                               "(ModeExecutor tiles the copied step GEMMs' weights only); step_product='cublaslt' "
                               "avoids it")
        dtype = part_dtype(cupy, weight.parts) if self.split else cupy.float16 if weight.scale else \
            operand_dtype(cupy, self.precision)
        key = (cupy.cuda.get_current_stream().ptr, *x.shape, dtype)
        buffer = self.rounded.get(key)
        if buffer is None:
            shape = ((2,) if self.split else ()) + x.shape
            buffer = self.rounded[key] = cupy.empty(shape, dtype)
        if self.split:            # fp16 parts: an x past fp16's range sets the range flag, as a step operand's copy does
            self._split_products(split_into(cupy, x, buffer, weight.parts, self.range_flag), weight, out, bias)
        elif weight.scale:        # tf32 as shifted fp16: the same, past the copy's range
            tf32_fp16_into(cupy, x, buffer, self.range_flag)
            self._multiply(buffer, weight, out, bias, self.precision)
        else:
            self._multiply(round_into(cupy, x, buffer, self.precision), weight, out, bias, self.precision)

    def product(self, operand, weight: ModeWeight, out, left: Left | None = None) -> None:
        """out = operand @ W^T, the operand in the mode's format already (a kernel's copy; float32x3: its parts).
        left (split_products.Left): the product left for the kernels to sum as they read it, out flat: K in planes
        (a reduced mode), or float32x3's P unfolded."""
        if weight.tiles:                   # on the wgmma kernels: out whole, nothing left to fold or sum
            N, K = weight.tiles
            if left is not None or not out.flags.c_contiguous:
                raise BackendError(f"backend 'fused' in {self.precision}: the wgmma product writes its output whole; "
                                   "hint: this is a bug in engine/schedules/fused_modes.py (left_products with tiles)")
            if self.split:
                promoted_product(self.xp, operand, weight.stored, out, out.size // N, K, N,
                                 promote_columns(self.x3_chunk, K))
            else:
                mode_product(self.xp, operand, weight.stored, out, out.size // N, K, N, self.precision)
        elif self.split:                   # (a fixed matrix's operand has no copy: gemm() multiplies it)
            self._stacked_product(operand, weight, out, launch_fold=left is None)
        elif left is not None:                 # one strided batch of K slices, from the starts of A, W and out
            (call,) = slice_calls(*operand.shape, weight.stored.shape[0], left.count)
            products, alpha = self._products(weight, self.precision)
            self._lt(call.shape, operand.data.ptr, weight.stored.data.ptr, out, products=products, alpha=alpha)
        else:
            self._multiply(operand, weight, out, None, self.precision)

    def _split_products(self, parts, weight: ModeWeight, out, bias) -> None:
        """float32x3's product of many rows (a projection): parts (2, M, K) = [x_hi; x_lo], the weight (2N, K) =
        [W_hi; W_lo]; out = x_hi W_lo^T + bias, then += x_lo W_hi^T, then += x_hi W_hi^T chunk by chunk. In fp16
        parts the two small products are scaled by 2^-11 (alpha), which their lo parts carry."""
        _, M, K = parts.shape
        a, w, o, item = parts.data.ptr, weight.stored.data.ptr, out.data.ptr, parts.itemsize
        fp16 = weight.parts == "fp16"
        products, small = (X3_FP16_PRODUCTS, 1.0 / LO_SCALE["fp16"]) if fp16 else (X3_PRODUCTS, 1.0)
        for i, call in enumerate(split_calls(M, K, weight.stored.shape[0] // 2, chunking(K, self.x3_chunk),
                                             bias is not None)):
            self._lt(call.shape, a + item * call.a, w + item * call.w, out, at=o + 4 * call.out,
                     bias=bias.data.ptr if call.bias else 0, accumulate=call.accumulate, products=products,
                     alpha=small if i < 2 else 1.0)

    def _stacked_product(self, operand, weight: ModeWeight, out, launch_fold: bool = True) -> None:
        """float32x3's step product (engine/schedules/split_products.py): operand (2, R, K) = [h_hi; h_lo] by W_hi in
        K chunks into P1 (chunks, 2R, N), one strided-batched GEMM (and one more for a rest), or where x3_splitk takes
        them as cublasLt's split-K into one plane (2R, N); h_hi by W_lo into P2; then the fold into out (R, N);
        launch_fold=False: P into out (flat), for the kernels to fold as they read it. The parts' element size and
        products are the weight's (fp16 or TF32 parts)."""
        _, R, K = operand.shape
        N = weight.stored.shape[0] // 2
        chunks = chunking(K, self.x3_chunk)
        if uses_splitk(K, self.x3_chunk, self.x3_splitk, weight.parts):
            calls, chunks = splitk_calls(R, K, N, chunks.count), Chunks(K, 1)    # one plane: cublasLt sums the splits
        else:
            calls = stacked_calls(R, K, N, chunks)
        key = (self.xp.cuda.get_current_stream().ptr, chunks.count, R, N)
        partial = self.partials.get(key) if launch_fold else out
        if partial is None:
            partial = self.partials[key] = self.xp.empty(partial_size(R, N, chunks), dtype=self.xp.float32)
        if operand.dtype != weight.stored.dtype:
            raise BackendError(f"backend 'fused' in float32x3: a step operand in {operand.dtype} parts against a weight "
                               f"in {weight.stored.dtype} parts; hint: this is a bug in engine/schedules/fused_modes.py")
        item, products = operand.itemsize, X3_FP16_PRODUCTS if weight.parts == "fp16" else X3_PRODUCTS
        a, w, p = operand.data.ptr, weight.stored.data.ptr, partial.data.ptr
        for call in calls:
            self._lt(call.shape, a + item * call.a, w + item * call.w, partial, at=p + 4 * call.out, products=products)
        if launch_fold:
            fold(self.xp, partial, out, R, N, chunks.count, LO_SCALE[weight.parts])

    def _lt(self, shape: Product, a: int, w: int, out, *, bias: int = 0, accumulate: bool = False,
            at: int | None = None, products: tuple = X3_PRODUCTS, alpha: float = 1.0) -> None:
        """One product into out (at: the address in it to write) through cublasLt: float32x3's parts (products:
        their data and compute types, TF32 by default), or the mode's operands (LT_OPERANDS'), whole, in K slices or
        (shape.splits) on cublasLt's split-K, which X3SplitKError reports refused."""
        if not out.flags.c_contiguous:
            raise BackendError("backend 'fused' in a precision mode writes GEMM outputs whole: got a strided one; "
                               "hint: this is a bug in engine/schedules/fused_modes.py")
        data_type, compute = products
        try:
            done = self.lt.product(shape, a, w, out.data.ptr if at is None else at, data_type, compute, bias=bias,
                                   accumulate=accumulate, workspace=self._workspace(), sms=self.sms, alpha=alpha)
        except LtError as e:
            if shape.splits > 1:
                status = re.search(r"status (\d+)", str(e))
                raise X3SplitKError(f"cublasLt would not run the ({shape.M} x {shape.K}) @ ({shape.K} x {shape.N}) "
                                    f"product with its K split {shape.splits} ways (cuBLAS status "
                                    f"{status.group(1) if status else '?'})") from None
            raise
        if not done:
            if shape.splits > 1:
                raise X3SplitKError(f"cublasLt offers no algorithm that splits the ({shape.M} x {shape.K}) @ "
                                    f"({shape.K} x {shape.N}) product's K {shape.splits} ways with its splits' "
                                    f"{shape.workspace_bytes >> 20} MiB in the {WORKSPACE >> 20} MiB workspace")
            sliced = "" if shape.batch == 1 else ", or x3_chunk=None" if self.split else ", or k_slices=1"
            raise BackendError(f"backend 'fused' in precision '{self.precision}': cublasLt offers no algorithm for a "
                               f"({shape.M} x {shape.K}) @ ({shape.K} x {shape.N}) product"
                               f"{f' in {shape.batch} K slices' if shape.batch > 1 else ''}; "
                               f"hint: use backend='persistent' or 'graph' in this mode{sliced}")

    def _multiply(self, operand, weight: ModeWeight, out, bias, mode: str) -> None:
        """out = operand @ W^T (+ bias), both whole, in `mode` (float32 for a reduction's fixed matrix)."""
        M, K = operand.shape
        products, alpha = self._products(weight, mode)
        self._lt(Product.dense(M, weight.stored.shape[0], K), operand.data.ptr, weight.stored.data.ptr, out,
                 bias=0 if bias is None else bias.data.ptr, products=products, alpha=alpha)

    @staticmethod
    def _products(weight: ModeWeight, mode: str) -> tuple[tuple, float]:
        """The data and compute types of a product by `weight` in `mode`, and its alpha: tf32 held as shifted fp16
        multiplies fp16 values and scales the sums back (exact: a power of two)."""
        if weight.scale and mode == "tf32":
            return X3_FP16_PRODUCTS, weight.scale
        return LT_OPERANDS[mode], 1.0

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

    copies_operands = False                # no kernels: every step GEMM rounds (or splits) its operand itself

    def __init__(self, dtype, precision: str, x3_chunk: int | str | None = X3_CHUNK, x3_parts: str = "tf32",
                 tf32_storage: str = "tf32"):
        super().__init__(dtype)
        self.precision = precision
        self.x3_chunk = x3_chunk
        self.x3_parts = x3_parts if precision == "float32x3" else None
        self.half = precision == "tf32" and tf32_storage == "fp16"

    def mode_weight(self, weight, exact: bool, parts: str = "tf32", tiles: bool = False) -> ModeWeight:
        """float32x3: the parts stacked (2N, K) in `parts` (their values, in the device's dtype), as ModeDevice stores
        them (tiles: the wgmma product's layout is the GPU's alone; the values are the same); tf32 with parts "fp16":
        the shifted fp16 values and their scale (tf32_fp16.py)."""
        if self.half and parts == "fp16" and not exact:
            stored, scale = scaled_weight(weight)
            return ModeWeight(stored, exact, parts, scale=scale)
        stored = self.asarray(weight)
        if self.precision == "float32x3" and not exact:
            return ModeWeight(stack_split(np, stored, parts).astype(stored.dtype), exact, parts)
        return ModeWeight(stored, exact)

    def reset_range(self) -> None:
        pass

    def out_of_range(self) -> bool:
        return False

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
            parts = split_into(np, np.ascontiguousarray(x, dtype=np.float32),
                               np.empty((2, rows, K), part_dtype(np, weight.parts)), weight.parts)
            out[...] = stacked_product_numpy(parts, w, chunking(K, self.x3_chunk), LO_SCALE[weight.parts])
        elif weight.scale:                             # tf32 held as shifted fp16: the same values, shifted back
            out[...] = tf32_fp16_numpy(x, w, weight.scale)
        else:
            out[...] = mode_matmul(w, x, self.precision, lambda a, b: b @ a.T)
        if bias is not None:
            out += bias
        self.launches += 1

