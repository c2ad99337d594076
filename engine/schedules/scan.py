"""Schedule 'scan': a cell whose recurrence is linear runs as a parallel scan over time, not T dependent steps.

engine/passes/scan.py decides whether a cell qualifies: every state it reads has a next value a[t] * s[t-1] + b[t]
with a and b computed from the input and the parameters alone (minGRU, minLSTM, QRNN fo-pooling, a diagonal linear
RNN). Then, layer by layer:

1. every value that reads no state is computed for the whole sequence at once, on T x B rows (the input
   projections are one GEMM each; each elementwise op is one launch over the sequence);
2. the coefficients a and b are formed from those values (the cell's own products: minGRU's 1 - z and z * h_tilde);
3. the recurrence runs as a chunked scan (kernels/scan.cu): each chunk of CHUNK steps is reduced to one affine map,
   the maps carry the state from chunk to chunk, and each chunk is replayed from its entering state, every chain
   (batch row x hidden unit) in its own thread. It reads a and b twice and writes s once: bandwidth-bound, with no
   step-by-step launch or synchronisation. Where one state is scanned and its coefficients are formed inside the
   scan (minGRU), and the chains are enough to fill the GPU (`walks`), one kernel walks the sequence in tiles
   instead (scan_kernel's scan_walk: the chunk maps composed in shared memory, the GEMM output read once);
4. what the scanned states feed and nothing reads back (QRNN's h = o * c) is computed for the whole sequence at
   once, from the scanned sequences.

In a precision mode (precision="tf32", "float16", "bfloat16", "float32x3") the matmuls of step 1 and 4 take their
operands rounded to the mode and sum in fp32 (engine/schedules/scan_modes.py); the scan and the elementwise math stay
float32, as every schedule's modes define it (engine/codegen/precision.py).

The same steps run on NumPy (`run_arrays(..., xp=numpy)`, with a sequential loop as the scan): the CPU tests hold
the executor to the reference there, and the GPU suite holds the CUDA scan to it. The scan reassociates the
recurrence (chunk maps multiply the a's of a chunk first); against float64 its float32 error stays within
what the step-by-step float32 run has, measured in tests/gpu/test_scan_gpu.py. The gradients, as scans too, are
engine/schedules/scan_grad.py's (engine.bptt(backend="scan"); CellRNN and engine.train take its walks where they
apply, scan_grad.walk_record).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..backends.common import RunResult, check_inputs, check_precision
from ..codegen.cublas_enums import CUBLAS_COMPUTE_32F, CUDA_R_32F
from ..codegen.nvrtc import load_module
from ..dense import dense
from ..errors import BackendError
from ..ir import CellGraph
from ..passes.scan import ScanAnalysis, analyse_scan
from . import scan_kernel
from .cublaslt import LtProjection
from .project import LT_OPERANDS, operand_dtype, round_into
from .scan_modes import Products, fixed_weight
from .scan_values import (
    contiguous,
    evaluate,
    full_array,
    grouped_matmuls,
    initial_state,
    matmuls_by_operand,
    stacked_weights,
)

KERNEL = Path(__file__).resolve().parents[2] / "kernels" / "scan.cu"
CHUNK = 64                 # steps per chunk: T / CHUNK maps per chain to carry, CHUNK dependent FMAs a thread
THREADS = 256


def analysis_or_refusal(cell: CellGraph) -> ScanAnalysis:
    found = analyse_scan(cell)
    if not found.qualifies:
        raise BackendError(f"schedule 'scan' cannot run cell '{cell.name}': {found.reason}; hint: use "
                           "backend='auto' (it picks the scan only for cells that qualify), or make each state's "
                           "update a[t] * s[t-1] + b[t] with a and b computed from the input (minGRU, minLSTM)")
    return found


def sequential_scan(a, b, initial, xp):
    """The recurrence step by step (NumPy): a, b (T, B, n), initial (B, n) -> s (T, B, n)."""
    out = xp.empty_like(b)
    s = initial
    for t in range(b.shape[0]):
        s = a[t] * s + b[t]
        out[t] = s
    return out


class CudaScan:
    """The three kernels of kernels/scan.cu for one dtype."""

    def __init__(self, dtype):
        c_type = "double" if np.dtype(dtype) == np.float64 else "float"
        source = (f"#define SCAN_T {c_type}\n" + scan_kernel.unroll_defines(c_type) + scan_kernel.CARRY.read_text()
                  + KERNEL.read_text())
        module = load_module(source, cell="scan", kernel="scan")
        self.chunks, self.carry, self.apply = (module.get_function(k) for k in ("scan_chunks", "scan_carry",
                                                                                "scan_apply"))

    def __call__(self, a, b, initial, xp, poison: bool = False, reverse: bool = False, a_shift: int = 0):
        """s[t] = a[t] s[t-1] + b[t] from `initial`, every step out (in time order). reverse=True runs from the last
        step back (s[t] = a[t] s[t+1] + b[t]); a_shift=1 reads time t's coefficient from a[t + 1], 0 past the end."""
        a, b = xp.ascontiguousarray(a), xp.ascontiguousarray(b)      # the kernels index (steps, chains) in C order
        T = b.shape[0]
        chains = int(np.prod(b.shape[1:]))
        count = -(-T // CHUNK)
        map_a = xp.empty((count, chains), dtype=b.dtype)
        map_b = xp.empty_like(map_a)
        entering = xp.empty_like(map_a)
        out = xp.full_like(b, np.nan) if poison else xp.empty_like(b)    # poison: every element must be written
        blocks = -(-chains // THREADS)
        steps, n, chunk = np.int32(T), np.int64(chains), np.int32(CHUNK)
        order = (np.int32(1 if reverse else 0), np.int32(a_shift))
        self.chunks((blocks, count), (THREADS,), (a, b, map_a, map_b, steps, n, chunk, *order))
        self.carry((blocks,), (THREADS,), (map_a, map_b, xp.ascontiguousarray(initial), entering, np.int32(count), n))
        self.apply((blocks, count), (THREADS,), (a, b, entering, out, steps, n, chunk, *order))
        return out


_cuda_scans: dict = {}


def cuda_scan(dtype) -> CudaScan:
    key = np.dtype(dtype).name
    if key not in _cuda_scans:
        _cuda_scans[key] = CudaScan(dtype)
    return _cuda_scans[key]


@dataclass
class ScanPlan:
    """What run_arrays works out once per cell and dtype (a ScanProgram keeps it): the analysis, the values after the
    scan, the generated kernel and whether the coefficients are formed inside the scan."""
    found: ScanAnalysis
    nexts: dict
    post: tuple
    kernel: object
    inline: bool
    groups: tuple
    launches: dict = field(default_factory=dict)       # (layouts, walk shape) -> the inline scan's kernels


def scan_plan(cell: CellGraph, dtype, fuse: bool, on_gpu: bool) -> ScanPlan:
    """The cell's plan, made once a cell, dtype and form (its launches are kept with it): a training step asks for
    it every call, and making it took ~45 us of host time on an H200 in front of the step's first GEMM."""
    return _scan_plan(cell, np.dtype(dtype).name, fuse, on_gpu)


@functools.lru_cache(maxsize=64)
def _scan_plan(cell: CellGraph, dtype: str, fuse: bool, on_gpu: bool) -> ScanPlan:
    found = analysis_or_refusal(cell)
    post, wanted = after_the_scan(cell)
    kernel = scan_kernel.free_kernel_of(cell, wanted, np.dtype(dtype).name) if fuse else None
    inline = kernel is not None and len(found.scanned) == 1 and not found.after and not wanted and on_gpu
    return ScanPlan(found, {s.name: s.next for s in cell.states}, post, kernel, inline,
                    matmuls_by_operand(cell, frozenset(found.free)))


def run_arrays(network, params, x, initial_states: dict | None, dtype, xp, scan=None, poison: bool = False,
               fuse: bool | None = None, plan: ScanPlan | None = None, precision: str = "float32",
               products: Products | None = None) -> RunResult:
    """The scan schedule on arrays of module xp (NumPy or CuPy). scan(a, b, initial, xp): the recurrence (default:
    step by step on NumPy, kernels/scan.cu on CuPy, whose output starts as NaN with poison=True). fuse: the
    state-free elementwise math as one generated kernel (engine/schedules/scan_kernel.py; default on CuPy) or op by
    op through the ops' NumPy meanings. plan: scan_plan(...) made before (a ScanProgram's). precision: the mode of
    the matmuls (engine/schedules/scan_modes.py; products: a Products of it made before, a program's)."""
    cell = network.cell
    products = products if products is not None else Products(precision, xp)
    if plan is None:
        fuse = xp is not np if fuse is None else fuse
        plan = scan_plan(cell, dtype, fuse, on_gpu=xp is not np and scan is None)
    found, nexts, post, kernel, inline = plan.found, plan.nexts, plan.post, plan.kernel, plan.inline
    if scan is None:
        scan = sequential_scan if xp is np else functools.partial(cuda_scan(dtype), poison=poison)
    T, B, _ = x.shape
    rows = T * B
    layer_in = xp.asarray(x, dtype=dtype)
    finals: dict[str, list] = {s: [] for s in cell.state_names}
    for layer in range(network.num_layers):
        layer_params = (params[layer] if isinstance(params, list) else     # a ScanProgram's, uploaded once
                        {k: xp.asarray(v, dtype=dtype) for k, v in params[layer].items()})
        env = {n.name: layer_in.reshape(rows, -1) for n in cell.nodes if n.op == "input"}
        blocks = grouped_matmuls(cell, found.free, env, layer_params, xp, plan.groups, products)
        coefficients = {}
        if inline:                  # a and b formed inside the scan (scan_kernel.fused_scan_source)
            (state,) = found.scanned
            sequence = _inline_scan(plan, cell, env, blocks, layer_params, T, B, network.state_size(state),
                                    initial_state(initial_states, state, layer, (B, network.state_size(state)), dtype, xp),
                                    dtype, xp, poison)
            finals[state].append(sequence[-1])
            layer_in = sequence
            continue
        if kernel is not None:
            sizes = network.layer_sizes(layer)                 # a wanted value is I, H or P wide (cell.dims)
            outs = [xp.empty((rows, network.state_size(o.split(":")[1]) if ":" in o
                              else sizes.get(cell.dims.get(o, "H"), network.hidden_size)), dtype=dtype)
                    for o in kernel.outputs]
            inputs = [env[n] if n in env else layer_params.get(n, None) for n in kernel.inputs]
            scan_kernel.compiled(kernel)(*inputs, *outs)
            coefficients = dict(zip(kernel.outputs, outs))
            env.update((o, v) for o, v in coefficients.items() if ":" not in o)
        else:
            evaluate(cell, [n for n in cell.topo_order if n in found.free], env, layer_params, xp, products)
        sequences = {}
        for state, affine in found.scanned.items():
            size = network.state_size(state)
            initial = initial_state(initial_states, state, layer, (B, size), dtype, xp)
            if kernel is not None:
                a, b = (coefficients[f"{part}:{state}"].reshape(T, B, size) for part in "ab")
            else:
                a = full_array(affine.a.compute(env) if affine.a is not None else 0.0, (T, B, size), dtype, xp)
                b = full_array(affine.b.compute(env) if affine.b is not None else 0.0, (T, B, size), dtype, xp)
            sequence = scan(a, b, initial, xp)
            sequences[state] = sequence
            if any(state in cell[n].args for n in post):          # read after the scan: its value at t - 1
                env[state] = xp.concatenate([initial[None], sequence[:-1]]).reshape(rows, size)
            env[nexts[state]] = sequence.reshape(rows, size)
        evaluate(cell, post, env, layer_params, xp, products)
        for state in found.after:
            size = network.state_size(state)
            sequences[state] = full_array(env[nexts[state]], (rows, size), dtype, xp).reshape(T, B, size)
        for state in cell.state_names:
            finals[state].append(sequences[state][-1])
        layer_in = sequences[cell.output]
    final_states = {s: xp.stack(v) for s, v in finals.items()}
    return RunResult(outputs=layer_in, final_states=final_states, backend="scan")


_modules: dict = {}


def kernel_inputs(names, env: dict, blocks: dict, layer_params: dict, n: int, xp) -> tuple[tuple, list]:
    """Where a generated kernel reads each of its inputs (scan_kernel.Layout) and the array it reads it from: a GEMM
    output's column block in the whole output, the layer input read elementwise, a parameter vector."""
    layouts, pointers = [], []
    for name in names:
        if name in blocks:
            product, offset = blocks[name]
            layouts.append(scan_kernel.Layout("rows", product.shape[1], offset))
            pointers.append(product)
        elif name in env:                           # the layer input, read elementwise (rows, n)
            layouts.append(scan_kernel.Layout("rows", env[name].shape[1], 0))
            pointers.append(xp.ascontiguousarray(env[name]))
        else:
            layouts.append(scan_kernel.Layout("vector"))
            pointers.append(xp.ascontiguousarray(xp.broadcast_to(layer_params[name], (n,))))
    return tuple(layouts), pointers


def inline_functions(plan, cell, layouts, dtype) -> tuple:
    """The inline scan's kernels for these input layouts (scan_chunks, scan_carry, scan_apply, scan_walk), compiled
    once per source and kept in the plan, a set a device (a plan serves every device: scan_plan)."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    key = (layouts, scan_kernel.WALK, cupy.cuda.runtime.getDevice())
    if key not in plan.launches:
        module = module_of(scan_kernel.fused_scan_source(plan.kernel, layouts, np.dtype(dtype), scan_kernel.WALK),
                           cell.name, "scan")
        plan.launches[key] = tuple(module.get_function(k)
                                   for k in ("scan_chunks", "scan_carry", "scan_apply", "scan_walk"))
    return plan.launches[key]


def module_of(source: str, cell_name: str, kernel: str):
    """The module of a generated source (the scan's kernels, its gradients') on the current device, loaded once a
    source and device (a module is loaded into one device's context)."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    key = (cupy.cuda.runtime.getDevice(), source)
    if key not in _modules:
        _modules[key] = load_module(source, cell=cell_name, kernel=kernel)
    return _modules[key]


def walk_launch(walk, pointers, initial, out, final, T: int, B: int, n: int) -> None:
    """scan_walk over (T, B, n): a block of WALK[0] warps per 32 chains."""
    walk((-(-(B * n) // 32),), (32 * scan_kernel.WALK[0],), (*pointers, initial, out, final, np.int32(T), np.int32(B),
                                                              np.int64(n)))


def _inline_scan(plan, cell, env, blocks, layer_params, T, B, n, initial, dtype, xp, poison):
    """The one scanned state's sequence, its coefficients formed in the scan's kernels from the GEMM output and
    the parameters (no a and b arrays): scan_walk where the chains fill the GPU (walks), else the three passes."""
    layouts, pointers = kernel_inputs(plan.kernel.inputs, env, blocks, layer_params, n, xp)
    chunks, carry, apply, walk = inline_functions(plan, cell, layouts, dtype)
    chains, count = B * n, -(-T // CHUNK)
    out = xp.full((T, B, n), np.nan, dtype=dtype) if poison else xp.empty((T, B, n), dtype=dtype)
    initial = xp.ascontiguousarray(initial)
    if walks(chains, T, xp):
        walk_launch(walk, pointers, initial, out, xp.empty((B, n), dtype=dtype), T, B, n)
        return out
    map_a = xp.empty((count, chains), dtype=dtype)
    map_b, entering = xp.empty_like(map_a), xp.empty_like(map_a)
    blocks_x = -(-chains // THREADS)
    sizes = (np.int32(T), np.int32(B), np.int64(n), np.int32(CHUNK))
    chunks((blocks_x, count), (THREADS,), (*pointers, map_a, map_b, *sizes))
    carry((blocks_x,), (THREADS,), (map_a, map_b, initial, entering, np.int32(count), np.int64(chains)))
    apply((blocks_x, count), (THREADS,), (*pointers, entering, out, *sizes))
    return out


WALK_FILL = 0.5            # scan_walk runs where its blocks (32 chains each) fill at least this share of the SMs,
WALK_TILES = 32            # or where the sequence is at most this many of its tiles long


def walks(chains: int, steps: int, xp) -> bool:
    """Whether the inline scan runs as scan_walk (one pass, a block per 32 chains for the whole sequence) rather
    than the three passes (a thread per chain and chunk): the walk reads the GEMM output once instead of twice and
    is one launch instead of three, but its parallelism is the chains alone, and a block walks its tiles one after
    another. Measured on an H200 (benchmarks/results/scan-walk-20261127-H200): at T = 4096 (16 tiles) the walk was
    faster at every batch from B = 1 (16 blocks) to 16 (256). FORCE_WALK (a module switch) forces it: True, False
    or None for the rule."""
    if FORCE_WALK is not None:
        return FORCE_WALK
    tile = scan_kernel.WALK[0] * scan_kernel.WALK[1]
    return (-(-chains // 32) >= WALK_FILL * _sm_count(xp.cuda.Device().id)
            or -(-steps // tile) <= WALK_TILES)


FORCE_WALK = None


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    return cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrMultiProcessorCount, device)


@functools.lru_cache(maxsize=64)
def after_the_scan(cell: CellGraph) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The values computed after the scan, in order: what the unread states' next values need that is neither
    state-free nor a scanned state's next value (known from the scan); and the state-free values they read."""
    found = analysis_or_refusal(cell)
    known = set(found.free) | {s.next for s in cell.states if s.name in found.scanned}
    needed, stack = set(), [s.next for s in cell.states if s.name in found.after]
    while stack:
        name = stack.pop()
        if name in needed or name in known or cell[name].is_leaf:
            continue
        needed.add(name)
        stack.extend(cell[name].args)
    post = tuple(n for n in cell.topo_order if n in needed)
    wanted = tuple(dict.fromkeys(a for n in post for a in cell[n].args if a in found.free and not cell[a].is_leaf
                                 and cell[a].op != "matmul"))
    return post, wanted


class ScanProgram:
    """The scan schedule for one network and its parameters, uploaded once (what the autotuner times and
    engine.run(backend="auto") runs when it picks the scan)."""

    def __init__(self, network, params, dtype=np.float32, precision: str = "float32"):
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        precision = check_mode(precision, dtype)
        if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise BackendError(f"schedule 'scan' runs in float32 or float64, not {np.dtype(dtype).name}; hint: "
                               "dtype=np.float32")
        network, params = dense(network, params)      # heads as block-diagonal weights, reductions as matmuls
        analysis_or_refusal(network.cell)
        self.network, self.dtype, self.cupy = network, np.dtype(dtype), cupy
        self.params = [{k: cupy.asarray(v, dtype=self.dtype) for k, v in params[layer].items()}
                       for layer in range(network.num_layers)]
        self.plan = scan_plan(network.cell, self.dtype, True, on_gpu=True)     # worked out once
        self.precision, self.products = precision, Products(precision, cupy)
        cuda_scan(self.dtype)                                  # compiled (or loaded) now, not in the first run
        self.walk = WalkCall(self) if WalkCall.fits(network.cell, self.plan, self.dtype, precision) else None

    def run(self, x, initial_states=None, poison: bool = False) -> RunResult:
        """x: (T, B, I), NumPy or CuPy: CuPy arrays come back when x is CuPy, NumPy otherwise (as the wavefront
        schedules give them)."""
        cupy = self.cupy
        on_host = not isinstance(x, cupy.ndarray)
        x = cupy.asarray(check_inputs(self.network, x, initial_states, xp=cupy))
        if self.walk is not None and walks(x.shape[1] * self.walk.n, x.shape[0], cupy):
            result = self.walk(cupy.ascontiguousarray(x, dtype=self.dtype), initial_states, poison)
        else:
            result = run_arrays(self.network, self.params, x, initial_states, self.dtype, cupy, poison=poison,
                                plan=self.plan, products=self.products)
        if on_host:
            result.outputs = cupy.asnumpy(result.outputs)
            result.final_states = {k: cupy.asnumpy(v) for k, v in result.final_states.items()}
        return result


def walk_fits(cell: CellGraph, plan: ScanPlan, precision: str = "float32") -> bool:
    """One scanned state whose coefficients the scan forms itself (plan.inline), from one GEMM of the layer input
    and from parameters: what WalkCall and the gradients' walks (scan_grad.walk_gradients) take. In a reduced mode
    the GEMM multiplies no reduction's fixed matrix (which no mode rounds: run_arrays splits it off)."""
    if not plan.inline or len(plan.groups) != 1:
        return False
    ((operand, names),) = plan.groups
    if precision != "float32" and any(fixed_weight(cell, cell[n].args[0]) for n in names):
        return False
    return cell[operand].op == "input" and all(n in names or cell[n].is_param for n in plan.kernel.inputs)


def group_offsets(cell: CellGraph, names, layer_params: dict) -> list[int]:
    """The column offset of each matmul of a group (`names`) in its stacked GEMM output."""
    sizes = [layer_params[cell[m].args[0]].shape[0] for m in names]
    return [int(v) for v in np.cumsum([0] + sizes[:-1])]


def walk_plan(network, x, dtype, xp, precision: str = "float32") -> ScanPlan | None:
    """The scan's plan where a run of `network` (in its dense form) on x walks on the GPU, from its forward to its
    gradients (walk_fits and walks), else None."""
    if not analyse_scan(network.cell).qualifies:
        return None
    plan = scan_plan(network.cell, dtype, True, on_gpu=True)
    walking = walk_fits(network.cell, plan, precision) and walks(x.shape[1] * network.state_size(network.cell.output),
                                                      x.shape[0], xp)
    return plan if walking else None


def walk_inputs(cell: CellGraph, plan: ScanPlan, layer_params: dict, n: int, xp) -> tuple:
    """For a cell that walk_fits: the layer's stacked weight, and per input of the scan's kernel its layout and its
    source, a column offset into the GEMM output (an int) or the parameter broadcast to n units."""
    ((_, names),) = plan.groups
    weight = stacked_weights(layer_params, [cell[m].args[0] for m in names], xp)
    offsets = dict(zip(names, group_offsets(cell, names, layer_params)))
    sources = tuple(offsets[name] if name in offsets else
                    xp.ascontiguousarray(xp.broadcast_to(layer_params[name], (n,))) for name in plan.kernel.inputs)
    layouts = tuple(scan_kernel.Layout("rows", weight.shape[0], v) if isinstance(v, int)
                    else scan_kernel.Layout("vector") for v in sources)
    return weight, layouts, sources


class WalkCall:
    """A run of the scan that walks (scan_walk) issued with nothing else: per layer the GEMM through cublasLt into a
    product buffer the call keeps, and one scan_walk launch that also writes the final state. run_arrays's general
    path spends ~0.1 ms of host time (dicts, views, the final states stacked) before and after its two launches,
    and the GPU waits for the first of them: minGRU at T = 4096, B = 8 is a 0.79 ms call on an H200's GPU
    (benchmarks/probe_scan_walk.py). For a float32 cell whose layer multiplies only its input, in one GEMM, and
    whose scan reads only that GEMM's columns and parameters (minGRU, minLSTM's gates, a diagonal linear RNN). The
    kept GEMM output makes a program's runs one stream's work, as a wavefront schedule's build buffers do."""

    @staticmethod
    def fits(cell: CellGraph, plan: ScanPlan, dtype, precision: str = "float32") -> bool:
        return np.dtype(dtype) == np.dtype(np.float32) and walk_fits(cell, plan, precision)

    def __init__(self, program: ScanProgram):
        network, cupy, plan = program.network, program.cupy, program.plan
        self.precision, self.products = program.precision, program.products
        (state,) = plan.found.scanned
        self.cupy, self.state, self.n = cupy, state, network.state_size(state)
        self.layers = []                   # per layer: (stacked weight, kernel inputs: a column offset or a vector)
        for layer_params in program.params:
            weight, layouts, inputs = walk_inputs(network.cell, plan, layer_params, self.n, cupy)
            self.layers.append((weight, inputs, inline_functions(plan, network.cell, layouts, np.float32)[3]))
        self.lt = LtProjection.on_current_device(cupy)
        self.rows, self.bound = 0, []      # per layer (its GEMM's output, its bound product), for one T x B (_bind)
        self.zeros: dict = {}              # batch size -> the zero initial states
        self.rounded: dict = {}            # (stream, width) -> a mode's rounded operand at self.rows, reused

    def __call__(self, x, initial_states: dict | None, poison: bool) -> RunResult:
        cupy, n = self.cupy, self.n
        T, B, _ = x.shape
        if T * B != self.rows:
            self._bind(T * B)
        stream = cupy.cuda.get_current_stream().ptr
        source = x
        for layer, (weight, inputs, walk) in enumerate(self.layers):
            product, gemm = self.bound[layer]
            if gemm is not None:           # issued first: the host's work below runs while the GPU multiplies
                operand = source if self.precision == "float32" else \
                    round_into(cupy, source.reshape(T * B, -1), self._rounded(stream, T * B, source.shape[-1]),
                               self.precision)
                gemm(operand.data.ptr, stream)
            elif self.precision == "float32":          # cublasLt offers no algorithm for this shape
                cupy.matmul(source.reshape(T * B, -1), weight.T, out=product)
            else:                          # float32x3's three products, or no cublasLt algorithm for the mode
                self.products.project(source.reshape(T * B, -1), weight, out=product)
            if layer == 0:
                finals = cupy.empty((len(self.layers), B, n), dtype=cupy.float32)
                given = (initial_states or {}).get(self.state)
                initial = contiguous(given, np.float32, cupy) if given is not None else self.zeros.get(B)
                if initial is None:        # zeros made once a batch size (the kernel only reads them)
                    initial = self.zeros[B] = cupy.zeros((len(self.layers), B, n), dtype=cupy.float32)
            out = cupy.full((T, B, n), np.nan, dtype=cupy.float32) if poison else cupy.empty((T, B, n), cupy.float32)
            walk_launch(walk, tuple(product if isinstance(v, int) else v for v in inputs), initial[layer], out,
                        finals[layer], T, B, n)
            source = out
        return RunResult(outputs=out, final_states={self.state: finals}, backend="scan")

    def _rounded(self, stream: int, rows: int, width: int):
        """The buffer a layer's operand is rounded into, one a stream and width (at self.rows; _bind drops them when
        the rows change): the layers of a call and later calls on that stream use it in stream order, the GEMM that
        reads it issued before the next rounding."""
        buffer = self.rounded.get((stream, width))
        if buffer is None:
            buffer = self.rounded[(stream, width)] = self.cupy.empty((rows, width),
                                                                     operand_dtype(self.cupy, self.precision))
        return buffer

    def _bind(self, rows: int) -> None:
        """The GEMM outputs for rows = T x B (one a width, shared by the layers of that width) and each layer's
        product bound to its weight and output."""
        self.rows, by_width, self.bound = rows, {}, []
        self.rounded = {}
        for weight, _, _ in self.layers:
            if weight.shape[0] not in by_width:
                by_width[weight.shape[0]] = self.cupy.empty((rows, weight.shape[0]), dtype=self.cupy.float32)
            product = by_width[weight.shape[0]]
            if self.precision == "float32x3":          # three products through cuBLAS (project.py), not one
                gemm = None
            elif self.precision == "float32":
                gemm = self.lt.bind(weight, product, CUDA_R_32F, CUBLAS_COMPUTE_32F)
            else:                          # the weight in the mode's storage; the operand rounded at each call
                gemm = self.lt.bind(self.products.weight(weight), product, *LT_OPERANDS[self.precision])
            self.bound.append((product, gemm))


def prepare(network, params, dtype=np.float32, precision: str = "float32") -> ScanProgram:
    return ScanProgram(network, params, dtype, precision)


def run(network, params, x, initial_states=None, dtype=np.float32, precision: str = "float32") -> RunResult:
    """backend='scan' on the GPU: CuPy arrays in, CuPy out; NumPy arrays are copied over and come back as NumPy.
    float32 (strict) or float64; in float32, precision "tf32", "float16", "bfloat16" or "float32x3" takes the
    matmuls in that mode (engine/schedules/scan_modes.py)."""
    return prepare(network, params, dtype, precision).run(x, initial_states)


def check_mode(precision, dtype, xp=None) -> str:
    """The precision's canonical name; a reduced mode needs float32 on the GPU (its products are summed in fp32;
    NumPy, xp=np, emulates it in float64 too, as the reference backend does)."""
    name = check_precision(precision)
    if name != "float32" and np.dtype(dtype) != np.dtype(np.float32) and xp is not np:
        raise BackendError(f"schedule 'scan' takes precision={name!r} in float32 only, not "
                           f"{np.dtype(dtype).name}; hint: dtype=np.float32 (a mode rounds the matmuls' operands and "
                           "sums in fp32), or precision='float32' for float64")
    return name
