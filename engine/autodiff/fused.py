"""Backend "fused" of engine.autodiff.record / bptt: the training step as cuBLAS GEMMs and generated kernels.

Plan (engine/autodiff/fused_plan.py) -> CUDA (engine/autodiff/fused_codegen.py) -> this module, which allocates a
layer's buffers, stacks each GEMM's weights, and launches, fp32 on the GPU:

    forward, a chunk of steps at a time:  the input GEMM over the chunk's rows; then per step [GEMM, kernel] a stage
    backward, the last chunk first:       per step [kernel, GEMM] a stage; then the chunk's input adjoint as one GEMM
                                          into the layer below's d_out
    after the sweep, a layer at a time:   the weight and bias gradients as one GEMM per operand (plan.grad_gemms), the
                                          rest of the split's `after` part through engine.autodiff.step on T x B rows

The layers run as a wavefront both ways (engine/autodiff/wavefront.py: layer l's chunk after the layer below's, a
stream a layer), launched as CUDA graphs of 1, 2, 4, ... diagonals. WAVEFRONT = False runs layer by layer, a graph a
layer and direction, as does the backward of a cell whose input adjoint is not one GEMM. The GEMMs go straight to
cuBLAS's sgemm (engine/autodiff/cublas.py: ctypes, a handle of its own, strict fp32, no TF32), so a sum of a GEMM's
terms and elementwise ones is one GEMM with beta = 1, and a step GEMM with few output tiles may split K. The values
live in per-layer buffers at row (t + shift) * B + b, so nothing is copied between steps and the backward reads the
forward's values where the forward wrote them. A step's inputs and parameters go in with one launch of
kernels/copy_pieces.cu.

The buffers and the captured graphs of a (network, T, B) form a Program, cached and reused by the next record once
its tape's backward has run (or the tape is dropped); idle programs beyond CACHE_BYTES (4 GiB) of buffers are
dropped oldest first, and clear_cache() drops them all.
"""
from __future__ import annotations

import functools
import threading
import weakref

import numpy as np

from ..codegen.cuda import KERNELS_DIR
from ..errors import BackendError
from ..ir import SCALAR
from ..ops import apply_elementwise
from . import cublas, persistent, stage_fusion
from .fused_codegen import THREADS, fused_params, kernel_params, render_module
from .persistent import persistent_launch
from .fused_plan import (D_INPUT_BUFFER, D_OUTPUT_BUFFER, INPUT_BUFFER, GemmPlan, GradGemm, KernelPlan, Place,
                         TrainingPlan, training_plan)
from .cublas import SPLIT_REDUCE_FILE, Sgemm, split_k
from .stage_fusion import FusedStage, fused_stages, launch_sequence, lay_out, stage_weights
from .step import backward_step
from .wavefront import backward_wavefront, diagonal_pieces, forward_wavefront

MAX_BLOCKS = 65535
_modules: dict = {}
_lock = threading.Lock()


def module_for(plan: TrainingPlan, tiled: bool = False):
    """The compiled module of the plan's kernels (IEEE fp32 through engine/codegen/nvrtc.py), cached by source; tiled:
    with the fused stages' tiled GEMM (batches over GEMV_MAX_ROWS rows)."""
    import cupy
    from ..codegen.nvrtc import load_module

    source = render_module(plan, tiled)
    key = (source, cupy.cuda.Device().id)
    with _lock:
        module = _modules.get(key)
    if module is None:
        module = load_module(source)
        for k in plan.forward.kernels + plan.backward.kernels:
            module.get_function(k.name)
        for stage in fused_stages(plan).values():
            for width in stage_fusion.WIDTHS:
                module.get_function(stage.variant(width))
            module.get_function(stage.summed)
        with _lock:
            _modules[key] = module
    return module


COPY_CHUNK = 8192               # elements a block of kernels/copy_pieces.cu copies
COPY_TABLES = 8                 # copy tables a runner keeps uploaded (Runner.copy): the same addresses every step
COPY_FILE = KERNELS_DIR / "copy_pieces.cu"
COLUMN_DOTS_FILE = KERNELS_DIR / "column_dots.cu"
LAY_OUT_FILE = KERNELS_DIR / "lay_out.cu"
LAY_OUT_WAVES = 4               # kernels/lay_out.cu: blocks a target, about this many an SM
COLUMN_DOTS_WAVES = 4           # kernels/column_dots.cu: row chunks enough for about this many blocks an SM
COLUMN_DOTS_MIN_ROWS = 16       # ... each warp keeping at least this many rows of its chunk


WAVEFRONT = True         # the layers as a wavefront both ways (Program(wavefront=...)): faster on the H100 at every
                         # anchor timed (benchmarks/NOTES.md, twelfth session); False: layer by layer
WAVEFRONT_CHUNK = 8      # steps a chunk of the wavefront


def float32_contiguous(xp, value):
    """value as a C-contiguous float32 array of xp: itself when it is one already (the common case, checked without
    the ~5 us each asarray and ascontiguousarray call costs on the host)."""
    if type(value) is xp.ndarray and value.dtype == np.float32 and value.flags.c_contiguous:
        return value
    return xp.ascontiguousarray(xp.asarray(value, dtype=xp.float32))


class Layer:
    """One layer's buffers, parameters, stacked weights and parameter vectors for a (T, B). They persist across
    calls (a Program reuses them, and a CUDA graph holds their addresses): load() copies new values in."""

    def __init__(self, xp, plan: TrainingPlan, sizes: dict, shapes: dict, T: int, B: int, poison: bool,
                 scratch: int = 0, stage_weights: tuple = ()):
        self.xp, self.plan, self.sizes, self.T, self.B = xp, plan, sizes, T, B
        self.persistent = (None, None)     # its (forward, backward) persistent launches, where Program takes them
        self.scratch = xp.empty((max(scratch, 1),), dtype=xp.float32)     # split-K partial products
        fill = np.nan if poison else 0.0
        self.buffers = {}
        for buf in plan.buffers:
            if buf.name == INPUT_BUFFER:
                continue                                   # the layer below's output, or the program's input
            rows = (T + 1 if buf.blocks == "T+1" else T) * B
            zero = buf.name.startswith("dstate_")          # a state adjoint never written stays zero
            self.buffers[buf.name] = xp.full((rows, buf.cols(sizes)), 0.0 if zero else fill, dtype=xp.float32)
        self.params: dict = {}             # the caller's arrays (float32): read by the after part
        for name, shape in shapes.items():
            if len(shape) == 1:            # vectors are kernel arguments: copied into buffers of fixed address
                self.buffers[f"param_{name}"] = xp.full(shape, fill, dtype=xp.float32)
        width = max(sizes.values())
        for name in plan.static:
            self.buffers[f"static_{name}"] = xp.full((width,), fill, dtype=xp.float32)
        # Each GEMM's weights stacked: members one under another, or a Stack's grid (sums x states, zero blocks)
        self.stacked, self.blocks = {}, {}       # key -> array; key -> ((weight, (row slice, column slice)), ...)
        for g in plan.forward.gemms + plan.backward.gemms + ((plan.input_gemm,) if plan.input_gemm else ()):
            if g.stack in self.stacked:
                continue
            grid = [g.weights[j:j + g.grid] for j in range(0, len(g.weights), g.grid)]
            heights = [shapes[next(w for w in row if w)][0] for row in grid]
            width = shapes[next(w for w in g.weights if w)][1]
            target = self.stacked[g.stack] = xp.full((sum(heights), g.grid * width), fill, dtype=xp.float32)
            blocks, top = [], 0
            for row, height in zip(grid, heights):
                for k, w in enumerate(row):
                    block = (slice(top, top + height), slice(k * width, (k + 1) * width))
                    if w:
                        blocks.append((w, block))
                    else:
                        target[block] = 0.0        # a sum without a term of that state: stays zero
                top += height
            self.blocks[g.stack] = tuple(blocks)
        # What load() fills each call, as views made once: the vector parameters' buffers (in the cell's order) and
        # every block of the stacked weights
        self.vectors = [name for name, shape in shapes.items() if len(shape) == 1]
        self.block_views = [(w, self.stacked[key][block]) for key in self.stacked for w, block in self.blocks[key]]
        # The fused stages' weights: stacked ones interleaved (forward) or transposed (backward), stage_fusion.py
        self.stage_weights = {(key, layout, members): xp.full(
            self.stacked[key].shape[::-1] if layout == "transposed" else self.stacked[key].shape, fill,
            dtype=xp.float32) for key, layout, members in stage_weights}

    def load(self, cell, params: dict) -> list[tuple]:
        """Take a layer's parameters: their float32 arrays (read by the after part), the static values computed
        now; returned, the (destination, source) copies that fill the vector buffers and the stacked weights, for
        Runner.copy to do in one launch with the program's other copies."""
        xp = self.xp
        self.params = {name: float32_contiguous(xp, value) for name, value in params.items()}
        copies = [(self.buffers[f"param_{name}"], self.params[name]) for name in self.vectors]
        copies += [(view, self.params[w]) for w, view in self.block_views]
        for name, value in static_values(xp, cell, self.plan, self.params, self.sizes).items():
            self.buffers[f"static_{name}"][...] = value
        return copies

    def lay_out_weights(self) -> None:
        """The fused stages' copies of the stacked weights, once load()'s copies are done (on the same stream)."""
        for (key, layout, members), target in self.stage_weights.items():
            target[...] = lay_out(self.xp, self.stacked[key], layout, members)

    def stage_weight(self, stage: FusedStage):
        layout = stage.weight_layout(self.interleaved)
        return self.stacked[layout[0]] if layout[1] == "stacked" else self.stage_weights[layout]

    def pointer(self, place: Place, block: int = 0) -> tuple[int, int]:
        """(device address, leading dimension) of a value's row block `block` (step t's rows from block t)."""
        buf = self.buffers[place.buffer]
        cols = buf.shape[1]
        return buf.data.ptr + 4 * ((block + place.shift) * self.B * cols + place.offset(self.sizes)), cols

    def view(self, place: Place, size: int):
        """A value of every step as (T x B, size) rows: a view of its buffer."""
        return self.rows(place, 0, self.T, size)

    def rows(self, place: Place, block: int, blocks: int, size: int):
        """Row blocks block .. block + blocks - 1 of a value (a state's: block t enters step t), (blocks x B, size):
        a view of its buffer."""
        buf, B = self.buffers[place.buffer], self.B
        start = place.offset(self.sizes)
        return buf[(block + place.shift) * B:(block + place.shift + blocks) * B, start:start + size]

    def state(self, state: str, block: int, adjoint: bool = False):
        """A state's (or its adjoint's) row block `block`: (B, its size)."""
        places = self.plan.adjoint_places if adjoint else self.plan.state_places
        return self.rows(places[state], block, 1, self.sizes[self.plan.cell.state_dim(state)])

    def output(self):
        """The layer's output of every step, (T x B, its size): the next layer's input (one whole buffer's rows)."""
        return self.view(self.plan.output, self.sizes[self.plan.cell.output_dim])


class Runner:
    """Launches a plan's GEMMs and kernels for one layer at a time, on the GPU (engine/autodiff/fused_numpy.py: the
    same plan run by NumPy, for the CPU tests)."""

    def __init__(self, cupy, plan: TrainingPlan, tiled: bool = False):
        self.xp, self.plan, self.tiled = cupy, plan, tiled
        self.interleaved = tiled or stage_fusion.INTERLEAVED       # the layout the module's fused stages read
        self.max_splits = cublas.MAX_SPLITS    # parts the summing kernels load (fused_codegen.render_summed)
        module = module_for(plan, tiled)
        self.functions = {k.name: module.get_function(k.name) for k in plan.forward.kernels + plan.backward.kernels}
        self.params = {k.name: kernel_params(k) for k in plan.forward.kernels + plan.backward.kernels}
        self.stages = fused_stages(plan)
        for stage in self.stages.values():
            for width in stage_fusion.WIDTHS:
                self.functions[stage.variant(width)] = module.get_function(stage.variant(width))
            self.functions[stage.summed] = module.get_function(stage.summed)
            self.params[stage.name] = fused_params(stage)
        self.sgemm = self.active = Sgemm(cupy)    # active: the handle of the stream being issued to
        self.layer_streams: list = []              # the wavefront's streams, a handle (and workspace) each
        self.stream_sgemms: list[Sgemm] = []
        from ..codegen.nvrtc import load_module
        self.reduce = load_module(SPLIT_REDUCE_FILE.read_text()).get_function("splitk_reduce")
        self.copy_kernel = load_module(COPY_FILE.read_text()).get_function("copy_pieces")
        self.lay_out_kernel = load_module(LAY_OUT_FILE.read_text()).get_function("lay_out_weights")
        dots_module = load_module(COLUMN_DOTS_FILE.read_text())
        self.column_dots_parts = dots_module.get_function("column_dots_parts")
        self.column_dots_sum = dots_module.get_function("column_dots_sum")
        self._ones = None
        self.copy_tables: dict = {}      # copy()'s uploaded tables by their addresses and sizes, the latest last
        self.sms = cupy.cuda.Device().attributes["MultiProcessorCount"]

    def splits(self, g: GemmPlan, sizes: dict, B: int) -> int:
        return 1 if g.hoisted else split_k(B, g.n(sizes), g.k(sizes), self.sms, self.max_splits)

    def scratch_size(self, sizes: dict, B: int) -> int:
        """Floats of split-K partial products a layer's largest split GEMM needs."""
        return max([self.splits(g, sizes, B) * B * g.n(sizes)
                    for g in self.plan.forward.gemms + self.plan.backward.gemms if self.splits(g, sizes, B) > 1] + [0])

    def grad_gemm(self, layer: Layer, g: GradGemm, out) -> None:
        """A GradGemm over the layer's T x B rows, added into `out` (its members' gradients, flat, one after
        another): weights (sum of rows x cols) += dy^T operand; biases (sum of rows) += ones^T dy."""
        sizes, rows = layer.sizes, layer.T * layer.B
        dy, ld_dy = layer.pointer(g.dy)
        width = g.rows(sizes)
        if g.operand is not None:       # column-major: out^T (cols x width) = operand^T (cols x TB) @ dy (TB x width)
            operand, ld_operand = layer.pointer(g.operand)
            cols = g.cols(sizes)
            self.active.raw(False, True, cols, width, rows, operand, ld_operand, dy, ld_dy, out.data.ptr, cols)
        else:                           # column-major: out (width x 1) = dy^T (width x TB) @ ones (TB x 1)
            ones = self.ones(rows)
            self.active.raw(False, False, width, 1, rows, dy, ld_dy, ones.data.ptr, rows, out.data.ptr, width)

    def column_dots(self, layer: Layer, dots: tuple, grads: dict) -> None:
        """Each ColumnDot's gradient (sum over the layer's T x B rows of a * b) added into grads[param], one launch
        of kernels/column_dots.cu for them all."""
        self.launch_column_dots(layer, self.column_dots_table(layer, dots, grads))

    def column_dots_table(self, layer: Layer, dots: tuple, grads: dict) -> tuple:
        """(the table on the GPU, items, widest column count, row chunks, rows a chunk, the chunks' partial sums) of
        column_dots: made once where the addresses stay (a captured launch may not upload one or allocate)."""
        a, b, out, lda, ldb, cols = [], [], [], [], [], []
        for d in dots:
            for side, lds, place in ((a, lda, d.a), (b, ldb, d.b)):
                ptr, ld = layer.pointer(place)
                side.append(ptr)
                lds.append(ld)
            out.append(grads[d.param].data.ptr)
            cols.append(layer.sizes[d.dim])
        items, widest, rows = len(dots), max(cols), layer.T * layer.B
        blocks = -(-widest // 32) * items
        # about COLUMN_DOTS_WAVES blocks an SM, each warp at least COLUMN_DOTS_MIN_ROWS rows of its chunk
        chunks = max(1, min(-(-COLUMN_DOTS_WAVES * self.sms // blocks), rows // (8 * COLUMN_DOTS_MIN_ROWS)))
        chunk = -(-rows // chunks)
        chunks = -(-rows // chunk)
        parts = self.xp.empty(chunks * items * widest, dtype=self.xp.float32)
        table = self.xp.asarray(np.array(a + b + out + lda + ldb + cols, dtype=np.int64))
        return table, items, widest, chunks, chunk, parts

    def launch_column_dots(self, layer: Layer, table: tuple) -> None:
        table, items, widest, chunks, chunk, parts = table
        self.column_dots_parts((-(-widest // 32), items, chunks), (256,),
                               (table, np.int32(items), np.int32(layer.T * layer.B), np.int32(chunk),
                                np.int32(widest), parts))
        self.column_dots_sum((-(-(items * widest) // 256),), (256,),
                             (table, np.int32(items), np.int32(chunks), np.int32(widest), parts))

    def ones(self, count: int):
        """A vector of `count` ones on the GPU (kept: a bias GEMM's other factor)."""
        if self._ones is None or self._ones.size < count:
            self._ones = self.xp.ones(count, dtype=self.xp.float32)
        return self._ones

    @staticmethod
    def copy_geometry(target) -> tuple | None:
        """(address, size, row width, row stride) of a copy's destination as kernels/copy_pieces.cu takes it, or None
        for one that is not rows of contiguous columns (filled on its own)."""
        if target.flags.c_contiguous:
            return target.data.ptr, target.size, max(target.size, 1), target.size
        if target.ndim == 2 and target.strides[1] == 4 and target.strides[0] % 4 == 0:
            return target.data.ptr, target.size, max(target.shape[1], 1), target.strides[0] // 4
        return None

    def copy(self, copies: list[tuple], geometry: list | None = None) -> None:
        """Each (destination, source) pair: the source's values into the destination (same size; None: zeros), as
        one launch of kernels/copy_pieces.cu over COPY_CHUNK-element pieces (a copy a parameter from Python cost
        ~20 us of host time each, ~2.5 ms a step for a 4-layer LSTM). A destination may be a block of rows of a
        larger matrix (a Stack's weight grid, a state beside others); any other is filled on its own. geometry: the
        destinations' copy_geometry, where the caller keeps it (the same destinations every call)."""
        xp = self.xp
        if geometry is None:
            geometry = [self.copy_geometry(target) for target, _ in copies]
        src, dst, size, width, stride = [], [], [], [], []
        for (target, value), where in zip(copies, geometry):
            if value is not None and value.size != target.size:
                raise ValueError(f"copy of {value.size} values into {target.size}")
            if where is None:
                target[...] = 0.0 if value is None else value.reshape(target.shape)
                continue
            src.append(0 if value is None else value.data.ptr)
            dst.append(where[0])
            size.append(where[1])
            width.append(where[2])
            stride.append(where[3])
        if not size:
            return
        key = (tuple(src), tuple(dst), tuple(size), tuple(width), tuple(stride))
        cached = self.copy_tables.pop(key, None)   # a step's copies come from the same addresses as the last one's
        if cached is None:
            src, dst, size, width, stride = (np.array(v, dtype=np.int64) for v in (src, dst, size, width, stride))
            pieces = -(-size // COPY_CHUNK)
            which = np.repeat(np.arange(len(size)), pieces)
            start = (np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * COPY_CHUNK
            count = np.minimum(size[which] - start, COPY_CHUNK)
            table = np.concatenate([np.where(src[which] != 0, src[which] + 4 * start, 0), dst[which], count, start,
                                    width[which], stride[which]])
            cached = (xp.asarray(table), len(count))
            while len(self.copy_tables) >= COPY_TABLES:
                self.copy_tables.pop(next(iter(self.copy_tables)))
        self.copy_tables[key] = cached
        self.copy_kernel((cached[1],), (256,), (cached[0], np.int32(cached[1])))

    def lay_out_table(self, layers: list) -> tuple | None:
        """(the table on the GPU, targets) of lay_out_weights for these layers' fused-stage weights, or None where
        they have none: made once a program (the addresses stay)."""
        rows = []
        for layer in layers:
            for (key, layout, members), target in layer.stage_weights.items():
                stacked = layer.stacked[key]
                if (layout not in ("transposed", "interleaved") or stacked.size >= 2 ** 31
                        or stacked.shape[1 if layout == "transposed" else 0] % members):
                    raise ValueError(f"no lay-out of {stacked.shape} as {layout} by {members} members")
                rows.append((stacked.data.ptr, target.data.ptr, *stacked.shape, int(layout == "transposed"), members))
        if not rows:
            return None
        table = np.array(rows, dtype=np.int64).T.copy()
        return self.xp.asarray(table), len(rows)

    def lay_out_weights(self, layers: list, table: tuple | None) -> None:
        """Every layer's fused-stage weights from its stacked ones (stage_fusion.lay_out), one launch of
        kernels/lay_out.cu after load()'s copies (on the same stream); table: lay_out_table(layers)."""
        if table is None:
            return
        self.lay_out_kernel((self.sms * LAY_OUT_WAVES, table[1]), (32, 8), (table[0], np.int32(table[1])))

    @staticmethod
    def sizes_args(layer: Layer) -> tuple:
        """The generated kernels' trailing arguments B, I, H, P."""
        sizes = layer.sizes
        return np.int32(layer.B), np.int32(sizes["I"]), np.int32(sizes["H"]), np.int32(sizes["P"])

    def kernel(self, layer: Layer, kernel: KernelPlan, t: int) -> None:
        total = layer.B * layer.sizes[kernel.dim]
        blocks = max(1, min(-(-total // THREADS), MAX_BLOCKS))
        args = tuple(layer.buffers[p] for p in self.params[kernel.name])
        self.functions[kernel.name]((blocks,), (THREADS,), args + (np.int32(t),) + self.sizes_args(layer))

    def gemm(self, layer: Layer, g: GemmPlan, t: int, forward: bool, steps: int = 1) -> None:
        """The GEMM of step t; a hoisted one covers `steps` steps from t (their rows at once)."""
        sizes, B = layer.sizes, layer.B
        rows = steps * B if g.hoisted else B
        a, lda = layer.pointer(g.operand, t)
        c, ldc = layer.pointer(g.out, t)
        w = layer.stacked[g.stack]
        k, n = g.k(sizes), g.n(sizes)
        # forward: out = operand @ W^T (W stacked: n x k); backward: out (+)= dy @ W (W stacked: k x n)
        splits = self.splits(g, sizes, B)
        if splits == 1:
            self.active(a, lda, w.data.ptr, w.shape[1], c, ldc, rows, n, k, w_transposed=forward,
                        accumulate=g.accumulate)
            return
        self.split_parts(layer, g, t, forward, splits)
        total = rows * n
        self.reduce((-(-total // THREADS),), (THREADS,), (np.uint64(c), np.uint64(layer.scratch.data.ptr),
                                                          np.int32(splits), np.int32(rows), np.int32(n),
                                                          np.int32(ldc), np.int32(1 if g.accumulate else 0)))

    def split_parts(self, layer: Layer, g: GemmPlan, t: int, forward: bool, splits: int) -> None:
        """A step GEMM's `splits` partial products over K into the layer's scratch (contiguous (B, n) parts)."""
        a, lda = layer.pointer(g.operand, t)
        w = layer.stacked[g.stack]
        self.active.split(a, lda, w.data.ptr, w.shape[1], layer.scratch.data.ptr, layer.B, g.n(layer.sizes),
                          g.k(layer.sizes), splits, w_transposed=forward)

    def fuses(self, network, B: int) -> bool:
        """Whether the network's steps of B rows run fused stages (stage_fusion.fuses; over GEMV_MAX_ROWS rows only
        with the tiled GEMM compiled in)."""
        return ((B <= stage_fusion.GEMV_MAX_ROWS or self.tiled)
                and stage_fusion.fuses(self.stages, B, [network.layer_sizes(l) for l in range(network.num_layers)]))

    def launches(self, step, steps: range, forward: bool, layer: Layer) -> list[tuple]:
        """The launches of `steps` of a layer (stage_fusion.launch_sequence): fused where its program fuses; else, with
        SPLIT_SUMS, a stage whose GEMM splits K as the split GEMM and the kernel that sums its parts."""
        if layer.fused:
            return launch_sequence(step, steps, forward, self.stages)
        split = {key: s for key, s in self.stages.items() if stage_fusion.SPLIT_SUMS
                 and self.splits(s.gemm, layer.sizes, layer.B) > 1}
        return launch_sequence(step, steps, forward, split, "split")

    def fused(self, layer: Layer, stage: FusedStage, tg: int, t: int) -> None:
        """A fused stage: the GEMM of step tg and the kernel of step t, in the variant choose_width picks."""
        sizes, B = layer.sizes, layer.B
        D = sizes[stage.kernel.dim]
        width = stage_fusion.choose_width(stage, D, B, self.sms)
        args = tuple(layer.buffers[p] for p in self.params[stage.name]) + (layer.stage_weight(stage),)
        self.functions[stage.variant(width)]((-(-D // stage.units(width)),), (stage_fusion.THREADS,), args + (
            np.int32(tg), np.int32(t)) + self.sizes_args(layer),
            shared_mem=4 * stage_fusion.shared_floats(stage, B, width))

    def split_sums(self, layer: Layer, stage: FusedStage, tg: int, t: int) -> None:
        """The stage's GEMM of step tg as split-K parts into the layer's scratch, then its kernel of step t, which sums
        them first (FusedStage.summed)."""
        splits = self.splits(stage.gemm, layer.sizes, layer.B)
        self.split_parts(layer, stage.gemm, tg, stage.forward, splits)
        total = layer.B * layer.sizes[stage.kernel.dim]
        args = tuple(layer.buffers[p] for p in self.params[stage.name]) + (layer.scratch, np.int32(splits))
        self.functions[stage.summed]((max(1, min(-(-total // THREADS), MAX_BLOCKS)),), (THREADS,), args + (
            np.int32(tg), np.int32(t)) + self.sizes_args(layer))

    can_capture = True

    def bind(self) -> None:
        """cuBLAS calls go to the current stream, through the runner's own handle."""
        self.active = self.sgemm
        self.sgemm.bind(self.xp.cuda.get_current_stream().ptr)

    def prepare_streams(self, count: int) -> None:
        """The wavefront's streams and their cuBLAS handles and workspaces, made before any capture (a capture may
        not allocate memory)."""
        while len(self.layer_streams) < count:
            self.layer_streams.append(self.xp.cuda.Stream(non_blocking=True))
            self.stream_sgemms.append(Sgemm(self.xp))

    def wavefront_forward(self, layers: list[Layer], chunks: list[range], items: list) -> None:
        """Items of the layers' forward wavefront (forward_wavefront), a stream a layer."""
        self.issue_on_streams(items, lambda l, c: self.forward_steps(layers[l], chunks[c]))

    def wavefront_backward(self, layers: list[Layer], chunks: list[range], items: list) -> None:
        """Items of the layers' backward and input adjoints as a reverse wavefront (backward_wavefront)."""
        def run(l: int, c: int) -> None:
            self.backward_steps(layers[l], chunks[c])
            self.input_adjoint(layers[l], chunks[c])
        self.issue_on_streams(items, run)

    def issue_on_streams(self, items, run) -> None:
        """run(layer, chunk) for each (layer, chunk, waits_for) of `items` on stream `layer` with its own cuBLAS
        handle, after a CUDA event of the chunk it waits for (when issued earlier in `items`; else it ran before they
        were issued). The streams fork from the current stream and join it at the end, so the whole can be captured
        into one graph."""
        cupy = self.xp
        origin = cupy.cuda.get_current_stream()
        self.prepare_streams(1 + max(l for l, _, _ in items))
        fork = cupy.cuda.Event(disable_timing=True)
        fork.record(origin)
        done, last = {}, {}
        for l, c, waits_for in items:
            stream = self.layer_streams[l]
            with stream:
                if l not in last:
                    stream.wait_event(fork)
                self.active = self.stream_sgemms[l]
                self.active.bind(stream.ptr)
                if waits_for in done:          # one issued before `items` (an earlier piece) is done by now
                    stream.wait_event(done[waits_for])
                run(l, c)
                done[(l, c)] = last[l] = cupy.cuda.Event(disable_timing=True)
                last[l].record(stream)
        for event in last.values():
            origin.wait_event(event)
        self.bind()

    def capture(self, launches):
        """The launches of `launches()` captured into a CUDA graph on a stream of their own (not run)."""
        stream = self.xp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                launches()
            finally:
                graph = stream.end_capture()
        self.bind()                      # the handle back on the current stream, not the capture's
        return graph

    def forward(self, layer: Layer) -> None:
        self.bind()
        self.forward_steps(layer, range(layer.T))

    def forward_steps(self, layer: Layer, steps: range) -> None:
        """The forward of `steps`: the hoisted GEMMs over their rows at once, then each step's GEMMs and kernels, or
        one persistent launch for them all (layer.persistent: engine/autodiff/persistent.py)."""
        for g in self.plan.forward.hoisted:
            self.gemm(layer, g, steps.start, forward=True, steps=len(steps))
        if layer.persistent[0] is not None:
            layer.persistent[0].launch(layer, steps)
            return
        self.issue(layer, self.launches(self.plan.forward, steps, True, layer), forward=True)

    def backward(self, layer: Layer) -> None:
        self.bind()
        self.backward_steps(layer, range(layer.T))

    def backward_steps(self, layer: Layer, steps: range) -> None:
        """The backward of `steps`, the last first: each step's kernels and GEMMs, or one persistent launch for them
        all (layer.persistent: engine/autodiff/persistent.py)."""
        if layer.persistent[1] is not None:
            layer.persistent[1].launch(layer, steps)
            return
        self.issue(layer, self.launches(self.plan.backward, steps, False, layer), forward=False)

    def issue(self, layer: Layer, launches: list[tuple], forward: bool) -> None:
        for kind, item, *t in launches:
            if kind == "gemm":
                self.gemm(layer, item, t[0], forward=forward)
            elif kind == "kernel":
                self.kernel(layer, item, t[0])
            elif kind == "split":
                self.split_sums(layer, item, *t)
            else:
                self.fused(layer, item, *t)

    def input_adjoint(self, layer: Layer, steps: range) -> None:
        """The input's adjoint of `steps` (plan.input_gemm) into the layer below's d_out (layer 0: the x gradient)."""
        self.gemm(layer, self.plan.input_gemm, steps.start, forward=False, steps=len(steps))


def static_values(cupy, cell, plan: TrainingPlan, params: dict, sizes: dict) -> dict:
    """The values of parameters alone (the same at every step and row), as vectors; a number as a full vector."""
    values: dict = {}
    width = max(sizes.values())
    for name in plan.static:
        node = cell[name]
        args = [params.get(a, values.get(a)) if not cell[a].op == "const" else np.float32(cell[a].attr("value"))
                for a in node.args]
        if node.op == "matmul":
            value = args[0] @ args[1]
        else:
            value = apply_elementwise(node.op, args, node.attr_dict)
        if cell.dims[name] == SCALAR:
            value = cupy.full((width,), float(value), dtype=cupy.float32)
        values[name] = cupy.ascontiguousarray(cupy.asarray(value, dtype=cupy.float32))
    return values


class Program:
    """A network's fused training step for one (T, B): every layer's persistent buffers, and each layer's forward
    and backward captured once as a CUDA graph and replayed (one launch instead of T x launches a step from Python).
    Where capture fails (a cuBLAS that refuses it), the same launches go one by one; `capture_error` says why. A
    program serves one tape at a time: `busy` from record until the tape's backward, or until the tape is dropped."""

    def __init__(self, network, runner, T: int, B: int, poison: bool, wavefront: bool = False):
        xp, cell = runner.xp, network.cell
        self.network, self.runner, self.T, self.B = network, runner, T, B
        self.wavefront = wavefront and network.num_layers > 1
        self.input = xp.full((T * B, network.input_size), np.nan if poison else 0.0, dtype=xp.float32)
        self.fused = runner.fuses(network, B)     # the steps run fused stages (engine/autodiff/stage_fusion.py)
        self.layers: list[Layer] = []
        for l in range(network.num_layers):
            shapes = {p.name: network.param_shape(l, p.name) for p in cell.params}
            sizes = network.layer_sizes(l)
            layer = Layer(xp, runner.plan, sizes, shapes, T, B, poison, runner.scratch_size(sizes, B),
                          stage_weights(runner.stages, runner.interleaved) if self.fused else ())
            layer.fused, layer.interleaved = self.fused, runner.interleaved
            layer.buffers[INPUT_BUFFER] = self.input if l == 0 else self.layers[-1].output()
            self.layers.append(layer)
        if self.wavefront:
            runner.prepare_streams(network.num_layers)
        # a layer's steps, chunk by chunk, as persistent launches each way where it qualifies
        # (engine/autodiff/persistent.py; PERSISTENT): all the GPU's SMs layer by layer, a share of them a layer in
        # the wavefront (they run at once)
        blocks = max(1, runner.sms // len(self.layers)) if self.wavefront and hasattr(runner, "sms") else \
            getattr(runner, "sms", 0)
        for layer in self.layers:
            layer.persistent = tuple(persistent_launch(runner, layer.sizes, B, blocks, forward)
                                     for forward in (True, False))
        self.d_input = None               # the x gradient, written by layer 0's input GEMM (the backward wavefront)
        if self.wavefront and runner.plan.input_gemm is not None:
            self.d_input = xp.full((T * B, network.input_size), np.nan if poison else 0.0, dtype=xp.float32)
            for l, layer in enumerate(self.layers):
                layer.buffers[D_INPUT_BUFFER] = (self.d_input if l == 0 else
                                                 self.layers[l - 1].buffers[D_OUTPUT_BUFFER])
        self.graphs: dict = {}
        self.capture_error: str | None = None
        self.grad_flat = self.after_graph = self.after_error = None    # Program.after's buffers and graph
        self.initial_views = [{s: layer.state(s, 0) for s in cell.state_names} for layer in self.layers]
        self.copy_geometry = None                 # load()'s destinations (Runner.copy_geometry), once
        self.lay_out = runner.lay_out_table(self.layers)   # the fused-stage weights' lay-out (fixed addresses)
        self.busy = False
        arrays = [self.input] + ([self.d_input] if self.d_input is not None else [])
        arrays += [a for layer in self.layers for a in
                                 [*layer.buffers.values(), *layer.stacked.values(), *layer.stage_weights.values(),
                                  layer.scratch]]
        self.bytes = sum(a.nbytes for a in {id(a): a for a in arrays if a.base is None}.values())

    def release(self) -> None:
        self.busy = False

    @property
    def persistent(self) -> list | None:
        """Each layer's (forward, backward) persistent launches, None for a layer with neither; None where no layer
        has one (engine/autodiff/persistent.py)."""
        pairs = [layer.persistent if any(layer.persistent) else None for layer in self.layers]
        return pairs if any(pairs) else None

    def captures_after(self) -> bool:
        """Whether the wavefront's after part (weight and bias gradients, peepholes', the initial states' adjoints)
        runs as one captured graph into buffers of the program: on the GPU, where it is GEMMs and table launches alone
        (plan.after_rest empty: nothing left to the interpreter, whose CuPy calls allocate)."""
        return self.d_input is not None and self.runner.can_capture and not self.runner.plan.after_rest

    def after(self):
        """The after part of every layer as one graph (captured once, replayed): the gradients zeroed, each layer's
        GradGemms and column_dots launch into them, each state's adjoint entering step 0 into d_initial. Returns the
        program's (gradient buffer, per-layer {param: view}, {state: (L, B, size)}): the caller copies them out (the
        next backward of this program overwrites them)."""
        xp, runner, plan, network = self.runner.xp, self.runner, self.runner.plan, self.network
        if self.grad_flat is None:
            self.grad_flat = xp.zeros(max(gradient_layout(network)[0], 1), dtype=xp.float32)
            self.grad_views, self.grad_stacks = gradient_views(xp, network, self.grad_flat)
            self.d_initial = {s: xp.empty((len(self.layers), self.B, network.state_size(s)), dtype=xp.float32)
                              for s in network.cell.state_names}
            self.dot_tables = [runner.column_dots_table(layer, plan.column_dots, self.grad_views[l])
                               if plan.column_dots else None for l, layer in enumerate(self.layers)]
            runner.ones(self.T * self.B)                       # the bias GEMMs' other factor, made before capture
            self.bytes += self.grad_flat.nbytes + sum(a.nbytes for a in self.d_initial.values())

        def issue():
            runner.bind()
            self.grad_flat.fill(0.0)
            for l, layer in enumerate(self.layers):
                for index, g in enumerate(plan.grad_gemms):
                    runner.grad_gemm(layer, g, self.grad_stacks[l][index])
                if self.dot_tables[l] is not None:
                    runner.launch_column_dots(layer, self.dot_tables[l])
                for s in network.cell.state_names:
                    self.d_initial[s][l] = layer.state(s, 0, adjoint=True)
        stream = xp.cuda.get_current_stream()
        if stream.is_capturing():       # the caller captures a graph itself: the launches go into it
            issue()
            return self.grad_flat, self.grad_views, self.d_initial
        if self.after_graph is None and self.after_error is None and self.capture_error is None:
            try:
                self.after_graph = runner.capture(issue)
            except Exception as e:      # noqa: BLE001 - launched one by one instead, the step's graphs untouched
                self.after_error = f"{type(e).__name__}: {e}"
        if self.after_graph is not None:
            self.after_graph.launch(stream)
        else:
            issue()
        return self.grad_flat, self.grad_views, self.d_initial

    def load(self, params, x, initial_states: dict | None) -> None:
        """x, every layer's parameters and initial states into the program's buffers: one copy launch for all."""
        xp, cell = self.runner.xp, self.network.cell
        copies = [(self.input, float32_contiguous(xp, x))]
        for l, layer in enumerate(self.layers):
            copies += layer.load(cell, params[l])
            for s in cell.state_names:
                given = initial_states is not None and s in initial_states
                copies.append((self.initial_views[l][s],
                               float32_contiguous(xp, initial_states[s][l]) if given else None))
        if self.copy_geometry is None:            # the same destinations every call, in the same order
            self.copy_geometry = [self.runner.copy_geometry(target) for target, _ in copies]
        self.runner.copy(copies, self.copy_geometry)
        self.runner.lay_out_weights(self.layers, self.lay_out)
        for layer in self.layers:
            for launch in layer.persistent:
                if launch is not None:
                    launch.lay_out(layer)

    def forward(self) -> None:
        """Every layer's forward: layer by layer, or as one wavefront over all layers (self.wavefront); with
        persistent launches (self.persistent), a launch a layer and chunk (Runner.forward_steps)."""
        if not self.wavefront:
            for l in range(len(self.layers)):
                self.launch(l, "forward")
            return
        self._wavefront("forward", forward_wavefront, self.runner.wavefront_forward)

    def wavefront_backward(self) -> None:
        """Every layer's backward and input adjoint as one reverse wavefront (needs self.d_input)."""
        self._wavefront("backward", backward_wavefront, self.runner.wavefront_backward)

    def _wavefront(self, direction: str, order, issue) -> None:
        """A wavefront of WAVEFRONT_CHUNK-step chunks, a graph per piece of diagonals (diagonal_pieces)."""
        C, L = WAVEFRONT_CHUNK, len(self.layers)
        chunks = [range(t, min(t + C, self.T)) for t in range(0, self.T, C)]
        for k, piece in enumerate(diagonal_pieces(order(L, len(chunks)), L, len(chunks))):
            self._replay((direction, "wavefront", k), lambda piece=piece: issue(self.layers, chunks, piece))

    def launch(self, l: int, direction: str) -> None:
        """Layer l's forward or backward step loop: its graph replayed, or the launches one by one."""
        layer, runner = self.layers[l], self.runner
        run = runner.forward if direction == "forward" else runner.backward
        self._replay((l, direction), lambda: run(layer))

    def _replay(self, key, issue) -> None:
        """issue() captured once into the graph `key` and replayed; issued directly where capture is not possible."""
        runner = self.runner
        if not runner.can_capture or self.capture_error is not None:
            issue()
            return
        stream = runner.xp.cuda.get_current_stream()
        if stream.is_capturing():        # the caller captures a graph itself: the launches go into it
            issue()
            return
        graph = self.graphs.get(key)
        if graph is None:
            try:
                graph = self.graphs[key] = runner.capture(issue)
            except Exception as e:      # a cuBLAS or driver that refuses stream capture: launch one by one
                self.capture_error = f"{type(e).__name__}: {e}"
                issue()
                return
        graph.launch(stream)


_programs: dict = {}             # key -> [Program]: most recently used key last
CACHE_BYTES = 4 << 30           # idle programs kept beyond this many bytes of buffers are dropped, oldest first


def acquire(network, runner, T: int, B: int, poison: bool, wavefront: bool = False, check_memory=None) -> Program:
    """A program of this network, runner and (T, B) that no live tape holds (cached; a new one when all are, after
    check_memory() where given). Idle programs of other shapes are dropped, least recently used first, while the
    cache holds over CACHE_BYTES."""
    key = (network.cell, network.input_size, network.hidden_size, network.num_layers, network.projection_size, T, B,
           poison, wavefront, stage_fusion.switches(), persistent.PERSISTENT, id(runner),
           _device_id(runner.xp))  # a cached program holds its runner: its id
    with _lock:
        pool = _programs.pop(key, [])
        _programs[key] = pool
        program = next((p for p in pool if not p.busy), None)
        if program is None:
            if check_memory is not None:
                check_memory()
            program = Program(network, runner, T, B, poison, wavefront)
            pool.append(program)
        program.busy = True
        _evict()
    return program


def _evict() -> None:
    total = sum(p.bytes for pool in _programs.values() for p in pool)
    for key in list(_programs):
        if total <= CACHE_BYTES:
            break
        keep = []
        for p in _programs[key]:
            if p.busy or total <= CACHE_BYTES:
                keep.append(p)
            else:
                total -= p.bytes
        _programs[key] = keep
        if not keep:
            del _programs[key]


def cached_bytes() -> int:
    """Bytes of buffers the cached programs hold (on the GPU, or host memory for the NumPy runner)."""
    with _lock:
        return sum(p.bytes for pool in _programs.values() for p in pool)


def clear_cache() -> None:
    """Drop every idle program (their buffers and graphs); programs held by live tapes stay until released."""
    with _lock:
        for key in list(_programs):
            _programs[key] = [p for p in _programs[key] if p.busy]
            if not _programs[key]:
                del _programs[key]


def _device_id(xp) -> int:
    return xp.cuda.Device().id if xp is not np else -1


_runners: dict = {}              # key -> Runner, the most recently used last
MAX_RUNNERS = 8                  # runners kept (each holds cuBLAS handles and workspaces, ~100 MiB for a wavefront):
                                 # an app session that trains cell after cell keeps the last few, not every one


def gpu_runner(plan: TrainingPlan) -> Runner:
    """The runner of a cell's plan on the current device (cached by the cell itself, never by an object's id), with
    the fused stages' tiled GEMM compiled in where stage_fusion.FUSE_MAX_ROWS asks for it. Past MAX_RUNNERS the
    least recently used runner is dropped, with the idle programs that hold it."""
    import cupy
    tiled = stage_fusion.FUSE_MAX_ROWS > stage_fusion.GEMV_MAX_ROWS
    key = (plan.cell, cupy.cuda.Device().id, tiled, stage_fusion.INTERLEAVED)
    with _lock:
        runner = _runners.pop(key, None)
        if runner is not None:
            _runners[key] = runner
    if runner is None:
        runner = Runner(cupy, plan, tiled)
        with _lock:
            _runners[key] = runner
            while len(_runners) > MAX_RUNNERS:
                _drop_runner(_runners.pop(next(iter(_runners))))
    return runner


def _drop_runner(runner: Runner) -> None:
    """The idle cached programs of an evicted runner go with it (a busy one stays until its tape is done). Called
    with _lock held."""
    for key in list(_programs):
        pool = [p for p in _programs[key] if p.busy or p.runner is not runner]
        if pool:
            _programs[key] = pool
        else:
            del _programs[key]


def clear_runners() -> None:
    """Drop the cached runners (each holds cuBLAS handles with a 32 MiB workspace a stream, ~100 MiB for a 2-layer
    wavefront); a program that holds one keeps it until the program is dropped too (clear_cache)."""
    with _lock:
        _runners.clear()


@functools.lru_cache(maxsize=64)
def gradient_layout(network) -> tuple[int, tuple, tuple]:
    """Every layer's parameter gradients in one buffer: (total floats, ((layer, parameter, shape, offset), ...),
    ((layer, GradGemm index, offset, floats), ...)). The members of each of the plan's GradGemms lie one after
    another, in its order, so that GEMM writes them all."""
    cell = network.cell
    plan = training_plan(cell)
    layout, stacks, start = [], [], 0
    for l in range(network.num_layers):
        grouped = [(i, g.params) for i, g in enumerate(plan.grad_gemms)]
        alone = [(None, (p.name,)) for p in cell.params if not any(p.name in g.params for g in plan.grad_gemms)]
        for index, names in grouped + alone:
            first = start
            for name in names:
                shape = network.param_shape(l, name)
                layout.append((l, name, shape, start))
                start += int(np.prod(shape))
            if index is not None:
                stacks.append((l, index, first, start - first))
    order = {p.name: i for i, p in enumerate(cell.params)}
    layout.sort(key=lambda item: (item[0], order[item[1]]))
    return start, tuple(layout), tuple(stacks)


def _view(xp, flat, shape: tuple, start: int):
    """flat[start:start + size] as an array of `shape` (on the GPU one constructor call, not a slice and a reshape)."""
    if xp is np:
        return flat[start:start + int(np.prod(shape))].reshape(shape)
    return xp.ndarray(shape, dtype=xp.float32, memptr=flat.data + 4 * start)


def gradient_views(xp, network, flat) -> tuple[list[dict], list[dict]]:
    """Every layer's parameter gradients as views of `flat` (gradient_layout); and per layer, each GradGemm's stacked
    gradients as one flat view {GradGemm index: view}."""
    _, layout, stacks = gradient_layout(network)
    grads: list[dict] = [{} for _ in range(network.num_layers)]
    for l, name, shape, start in layout:                 # in the cell's order, as every backend's
        grads[l][name] = _view(xp, flat, shape, start)
    stacked: list[dict] = [{} for _ in range(network.num_layers)]
    for l, index, start, size in stacks:
        stacked[l][index] = flat[start:start + size]
    return grads, stacked


def zero_gradients(xp, network) -> tuple[list[dict], list[dict]]:
    """gradient_views of one buffer of zeros (one memset, not one a parameter)."""
    return gradient_views(xp, network, xp.zeros(gradient_layout(network)[0], dtype=xp.float32))


class FusedTape:
    """What record(backend="fused") returns: the outputs and final states now (copies: the program's buffers are
    reused by the next record), the gradients from backward()."""

    def __init__(self, network, program: Program, outputs, final_states: dict):
        self.network, self.program, self.plan = network, program, program.runner.plan
        self.split = self.plan.split
        self.outputs, self.final_states = outputs, final_states
        self.dtype, self.xp, self.used = np.float32, program.runner.xp, False
        self._release = weakref.finalize(self, program.release)     # a tape dropped unused frees its program

    def backward(self, d_outputs=None, d_final_states: dict | None = None):
        from .checks import start_backward
        d_outputs, d_final_states, finite = start_backward(self, d_outputs, d_final_states)
        release = True
        try:
            gradients = self._backward(d_outputs, d_final_states)
            try:                   # asked once the backward is queued: the GPU runs it meanwhile
                finite.raise_if_bad()
            except BackendError:   # the forward's values are intact: the tape can take a corrected gradient
                self.used, release = False, False
                raise
            return gradients
        finally:
            if release:
                self._release()

    def _backward(self, d_outputs, d_final_states: dict):
        from .bptt import Gradients
        xp, network, program = self.xp, self.network, self.program
        T, B, _ = self.outputs.shape
        cell, L = network.cell, network.num_layers
        d_above = None if d_outputs is None else xp.asarray(d_outputs, dtype=xp.float32).reshape(T * B, -1)
        if program.captures_after():              # the reverse wavefront and a captured after part
            return self._backward_captured(d_above, d_final_states)
        grads, self.stacked_grads = zero_gradients(xp, network)
        d_initial = {s: xp.empty((L, B, network.state_size(s)), dtype=xp.float32) for s in cell.state_names}
        if program.d_input is not None:           # the reverse wavefront: every layer in one graph
            return self._backward_wavefront(d_above, d_final_states, grads, d_initial)
        for l in reversed(range(L)):
            layer = program.layers[l]
            layer.buffers[D_OUTPUT_BUFFER][...] = 0.0 if d_above is None else d_above
            self._seed_states(layer, l, d_final_states)
            program.launch(l, "backward")
            d_above = self._after(layer, l, grads[l], d_initial)
        return Gradients(params=grads, x=d_above.reshape(T, B, -1), initial_states=d_initial,
                         outputs=self.outputs, final_states=self.final_states)

    def _wavefront_sweep(self, d_above, d_final_states: dict) -> None:
        """The reverse wavefront of every layer: the top layer's d_out and every layer's final state adjoints in,
        then the program's backward graphs."""
        program = self.program
        program.layers[-1].buffers[D_OUTPUT_BUFFER][...] = 0.0 if d_above is None else d_above
        for l, layer in enumerate(program.layers):
            self._seed_states(layer, l, d_final_states)
        program.wavefront_backward()

    def _backward_wavefront(self, d_above, d_final_states: dict, grads: list, d_initial: dict):
        from .bptt import Gradients
        xp, program = self.xp, self.program
        T, B = program.T, program.B
        self._wavefront_sweep(d_above, d_final_states)
        for l, layer in enumerate(program.layers):
            self._after(layer, l, grads[l], d_initial, nodes=self.plan.after_rest)
        return Gradients(params=grads, x=xp.array(program.d_input).reshape(T, B, -1), initial_states=d_initial,
                         outputs=self.outputs, final_states=self.final_states)

    def _backward_captured(self, d_above, d_final_states: dict):
        """The reverse wavefront, then the after part as one replayed graph (Program.after), its gradients and
        initial states' adjoints copied out of the program's buffers: one copy and a view a parameter instead of a
        cuBLAS call a GradGemm, a table upload a layer and a copy a state from Python (lstm_fgr at `lat`: 0.9 ms of
        host time a step; benchmarks/NOTES.md, fourteenth session)."""
        from .bptt import Gradients
        xp, program = self.xp, self.program
        T, B = program.T, program.B
        self._wavefront_sweep(d_above, d_final_states)
        flat, _, d_initial = program.after()
        grads, _ = gradient_views(xp, self.network, flat.copy())
        return Gradients(params=grads, x=xp.array(program.d_input).reshape(T, B, -1),
                         initial_states={s: v.copy() for s, v in d_initial.items()}, outputs=self.outputs,
                         final_states=self.final_states)

    def _seed_states(self, layer: Layer, l: int, d_final_states: dict) -> None:
        """Each state's adjoint entering layer l's last step: d_final_states, or zero."""
        xp, T = self.xp, layer.T
        for s in self.network.cell.state_names:
            last = layer.state(s, T, adjoint=True)
            last[...] = xp.asarray(d_final_states[s][l], dtype=xp.float32) if s in d_final_states else 0.0

    def _after(self, layer: Layer, l: int, grads: dict, d_initial: dict, nodes=None):
        """The split's `after` part on T x B rows (or `nodes` of it); the input's adjoint (T x B, I) for the layer
        below, when the after part computes it."""
        xp, network, plan = self.xp, self.network, self.plan
        cell, graph, split = network.cell, plan.split.graph, plan.split
        T, B, sizes = layer.T, layer.B, layer.sizes

        def size_of(forward_name):
            d = cell.dims[forward_name]
            return sizes[d] if d != SCALAR else 1

        todo = plan.after_layers if nodes is None else nodes
        read = {a for n in todo for a in n.args}              # views of what is read only (host time)
        if nodes is None:
            read.add(graph.input_adjoint)                     # returned; recorded when the step loop computes it
        dims = {n.name: n.of for n in graph.nodes} | {i.name: i.of for i in graph.inputs}
        rows = {name: layer.view(plan.back_places[name], size_of(dims[name])) for name in split.recorded
                if name in read}
        saved = {}
        for name in split.saved_after:
            if cell[name].is_param or name not in read:
                continue                                   # a parameter is read from the layer's parameters
            place = plan.places[name]
            if place.kind == "literal":
                saved[name] = np.float32(place.literal)
            elif place.kind == "vector":
                saved[name] = layer.buffers[place.buffer]
            else:
                saved[name] = layer.view(place, size_of(name))
        runner = self.program.runner
        runner.bind()
        for index, g in enumerate(plan.grad_gemms):       # the stacked weight and bias gradients, a GEMM each
            runner.grad_gemm(layer, g, self.stacked_grads[l][index])
        if plan.column_dots:                              # vector parameters' (peepholes'), one launch
            runner.column_dots(layer, plan.column_dots, grads)
        values = backward_step(graph, saved, layer.params, rows, grads, np.float32, todo)
        for s in cell.state_names:
            d_initial[s][l] = layer.state(s, 0, adjoint=True)
        if nodes is not None:
            return None
        if graph.input_adjoint is None:
            return xp.zeros((T * B, network.layer_input_size(l)), dtype=xp.float32)
        return xp.ascontiguousarray(values[graph.input_adjoint].reshape(T * B, -1))


def record(network, params, x, initial_states: dict | None, poison: bool = False, runner=None,
           wavefront: bool | None = None, finite=None, check_memory=None) -> FusedTape:
    """The forward pass on the fused training step (fp32, the GPU; runner: fused_numpy.NumpyRunner runs the same plan
    through NumPy). wavefront: the layers' forward as a wavefront of chunks on a stream a layer (default WAVEFRONT).
    Inputs already checked by bptt.record but for finite, their FiniteCheck, asked once the forward is queued;
    check_memory, called before a new program is made (bptt.record's memory check)."""
    if runner is None:
        runner = gpu_runner(training_plan(network.cell))
    xp, cell = runner.xp, network.cell
    T, B, _ = x.shape
    program = acquire(network, runner, T, B, poison, WAVEFRONT if wavefront is None else wavefront, check_memory)
    try:
        program.load(params, x, initial_states)
        program.forward()
        if finite is not None:
            finite.raise_if_bad()
    except BaseException:
        program.release()
        raise
    outputs = xp.array(program.layers[-1].output()).reshape(T, B, -1)   # copies: the buffers serve the next record
    final_states = {s: xp.stack([layer.state(s, T) for layer in program.layers]) for s in cell.state_names}
    return FusedTape(network, program, outputs, final_states)
