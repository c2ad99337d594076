"""The launcher of the fused training step (backend "fused" of engine.autodiff.record): Runner issues a plan's GEMMs
(cuBLAS through engine/autodiff/cublas.py: ctypes, a handle of its own; strict fp32, no TF32, or the plan's precision
mode: both operands rounded to it first, fp32 sums; a step GEMM with few output tiles may split K), its generated
kernels and fused stages (engine/autodiff/fused_codegen.py, stage_fusion.py) and the table launches of kernels/
(copy_pieces.cu, lay_out.cu, column_dots.cu) for one layer at a time, on the current stream or a stream a layer (the
wavefront). engine/autodiff/fused_numpy.py runs the same plan through NumPy for the CPU tests. module_for compiles a
plan's kernels (once: engine/codegen/nvrtc.py caches them).
"""
from __future__ import annotations

import numpy as np

from ..chunk_replay import capture_graph
from ..codegen.cuda import KERNELS_DIR
from ..codegen.nvrtc import load_module
from . import cublas, stage_fusion
from .cublas import SPLIT_REDUCE_FILE, Sgemm, split_k
from .fused_codegen import THREADS, fused_params, kernel_params, render_module
from .fused_layer import Layer
from .fused_plan import GemmPlan, GradGemm, KernelPlan, TrainingPlan
from .stage_fusion import FusedStage, fused_stages, launch_sequence

MAX_BLOCKS = 65535


def module_for(plan: TrainingPlan, tiled: bool = False):
    """The compiled module of the plan's kernels, IEEE fp32 (engine/codegen/nvrtc.py compiles it and keeps it by
    source and device); tiled: with the fused stages' tiled GEMM (batches over GEMV_MAX_ROWS rows)."""
    return load_module(render_module(plan, tiled), cell=plan.cell.name)


COPY_CHUNK = 8192               # elements a block of kernels/copy_pieces.cu copies
COPY_TABLES = 8                 # copy tables a runner keeps uploaded (Runner.copy): the same addresses every step
COPY_FILE = KERNELS_DIR / "copy_pieces.cu"
COLUMN_DOTS_FILE = KERNELS_DIR / "column_dots.cu"
LAY_OUT_FILE = KERNELS_DIR / "lay_out.cu"
LAY_OUT_WAVES = 4               # kernels/lay_out.cu: blocks a target, about this many an SM
COLUMN_DOTS_WAVES = 4           # kernels/column_dots.cu: row chunks enough for about this many blocks an SM
COLUMN_DOTS_MIN_ROWS = 16       # ... each warp keeping at least this many rows of its chunk


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
        self.sgemm = self.active = Sgemm(cupy, plan.precision)    # active: the handle of the stream issued to
        self.rounding = 0                          # elements of the largest GEMM operand a reduced mode rounds
        self.layer_streams: list = []              # the wavefront's streams, a handle (and workspace) each
        self.stream_sgemms: list[Sgemm] = []
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
        another): weights (sum of rows x cols) += dy^T operand, in the plan's mode; biases (sum of rows) += ones^T dy,
        strict fp32 in every mode (a sum over the rows, as the reference's batch_sum: no operand rounded)."""
        sizes, rows = layer.sizes, layer.T * layer.B
        dy, ld_dy = layer.pointer(g.dy)
        width = g.rows(sizes)
        if g.operand is not None:       # column-major: out^T (cols x width) = operand^T (cols x TB) @ dy (TB x width)
            operand, ld_operand = layer.pointer(g.operand)
            cols = g.cols(sizes)
            self.active.raw(False, True, cols, width, rows, operand, ld_operand, dy, ld_dy, out.data.ptr, cols)
        else:                           # column-major: out (width x 1) = dy^T (width x TB) @ ones (TB x 1)
            ones = self.ones(rows)
            self.active.raw(False, False, width, 1, rows, dy, ld_dy, ones.data.ptr, rows, out.data.ptr, width,
                            exact=True)

    def column_dots(self, layer: Layer, dots: tuple, grads: dict) -> None:
        """Each ColumnDot's gradient (sum over the layer's T x B rows of a * b) added into grads[param], one launch
        of kernels/column_dots.cu for them all: fp32 in every precision mode (an elementwise product and a sum over
        the batch, as the reference's mul and batch_sum, not a matmul)."""
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
                        accumulate=g.accumulate, exact=self.plan.exact(g), w_ready=self.ready_weight(layer, g))
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
                          g.k(layer.sizes), splits, w_transposed=forward, exact=self.plan.exact(g),
                          w_ready=self.ready_weight(layer, g))

    def fuses(self, network, B: int) -> bool:
        """Whether the network's steps of B rows run fused stages (stage_fusion.fuses; over GEMV_MAX_ROWS rows only
        with the tiled GEMM compiled in). Never in a reduced precision mode: a fused stage's GEMM (the warp GEMV or
        the tiled GEMM of kernels/) multiplies in fp32, so the mode's GEMMs stay cuBLAS's, on rounded operands."""
        return (self.plan.precision == "float32" and (B <= stage_fusion.GEMV_MAX_ROWS or self.tiled)
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
            self.stream_sgemms.append(Sgemm(self.xp, self.plan.precision))
            self.stream_sgemms[-1].reserve(self.rounding)

    def prepare_rounding(self, layers: list[Layer]) -> None:
        """A reduced mode's buffers, made with a program (before any capture): every handle's rounded-operand
        buffers (engine/autodiff/cublas.py), which a program's largest array bounds, and each layer's stacked weights'
        copy in the mode's format (round_weights fills it each load; the step's GEMMs read it as it is)."""
        if self.sgemm.operands is None:
            return
        self.rounding = max([self.rounding, *(a.size for layer in layers
                                              for a in [*layer.buffers.values(), *layer.stacked.values()])])
        for sgemm in [self.sgemm, *self.stream_sgemms]:
            sgemm.reserve(self.rounding)
        element = self.sgemm.operands[1]
        for layer in layers:
            layer.rounded = {key: self.xp.empty(w.size * element, dtype=self.xp.uint8)
                             for key, w in layer.stacked.items()}

    def round_weights(self, layers: list[Layer]) -> None:
        """Each layer's stacked weights rounded into their copies, once a load (on the current stream, after the
        copies that filled them): a step's GEMMs then round their activation operand only."""
        for layer in layers:
            for key, copy in layer.rounded.items():
                w = layer.stacked[key]
                self.sgemm.round_into(w.data.ptr, copy.data.ptr, *w.shape)

    def ready_weight(self, layer: Layer, g: GemmPlan) -> int | None:
        """The address of g's weights already in the mode's format (None: strict fp32, or an exact GEMM)."""
        copy = layer.rounded.get(g.stack)
        return None if copy is None or self.plan.exact(g) else copy.data.ptr

    def wavefront_forward(self, layers: list[Layer], chunks: list[range], items: list) -> None:
        """Items of the layers' forward wavefront (forward_wavefront), a stream a layer."""
        self.issue_on_streams(items, lambda l, c: self.forward_steps(layers[l], chunks[c]))

    def wavefront_backward(self, layers: list[Layer], chunks: list[range], items: list,
                           input_gradient: bool = True) -> None:
        """Items of the layers' backward and input adjoints as a reverse wavefront (backward_wavefront); layer 0's
        input adjoint (x's gradient) only where input_gradient."""
        def run(l: int, c: int) -> None:
            self.backward_steps(layers[l], chunks[c])
            if l > 0 or input_gradient:
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
        graph, _ = capture_graph(self.xp, launches)
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

    def backward(self, layer: Layer, input_adjoint: bool = False) -> None:
        """The layer's backward over its T steps; input_adjoint: then its input's adjoint (plan.input_gemm) over
        them."""
        self.bind()
        self.backward_steps(layer, range(layer.T))
        if input_adjoint:
            self.input_adjoint(layer, range(layer.T))

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
