"""CUDA C for a Program's kernels: one readable function per kernel, one statement per op.

Each kernel covers the (B, D) elements of one stage of one time step with a grid-stride loop,
thread (b, j) for batch row b and unit j. It loads what it reads into named registers, computes
the graph's values in order (the op table's CUDA expressions, nothing else: no switches), and
stores what later GEMMs, kernels or steps need. Sizes (B, I, H) and the step t are arguments, so one
compiled module serves every layer and every run shape.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CompileError
from ..ops import OPS
from ..plan import Access, Kernel, Lin, Program
from .equations import text_equations
from .nvrtc import load_module
from .precision import Precision

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
CELL_HELPERS = "cell_ops.cuh"
ROW_BIAS_HELPER = "row_bias.cuh"
THREADS_PER_BLOCK = 256
# float32x3's copy of a step GEMM's operand (engine/codegen/operand_copies.py): two TF32 parts, hi where the value's
# element is and lo one buffer further (rows B .. 2B of the stacked operand, engine/schedules/split_products.py)
SPLIT_COPY = "rnn_copy_split"
SPLIT_COPY_FP16 = "rnn_copy_split_fp16"     # float32x3's parts held as fp16 (engine/codegen/operand_copies.py)
SPLIT_COPY_TILES = "rnn_copy_split_fp16_tiles"   # the same in 64 x 64 tiles (engine/schedules/wgmma_products.py)
TF32_FP16_COPY = "rnn_copy_tf32_fp16"       # tf32 held as shifted fp16 (engine/schedules/tf32_fp16.py)
# The copies above that flag a value past fp16's range: a kernel that makes one takes the program's flag, a uint32
# (engine/schedules/mode_device.py range_flag), as the parameter RANGE_PARAM after its copies.
RANGE_FLAGGED = (SPLIT_COPY_FP16, SPLIT_COPY_TILES, TF32_FP16_COPY)
RANGE_PARAM = "rnn_fp16_range"
# a reduced mode's copy in the wgmma products' tiles (engine/codegen/operand_copies.py)
TILE_COPIES = {"tf32": "rnn_copy_tiles_tf32", "float16": "rnn_copy_tiles_fp16", "bfloat16": "rnn_copy_tiles_bf16"}
# A kernel launched as a programmatic dependent of the GEMM before it (engine/codegen/programmatic.py) waits here for
# that GEMM to finish and its memory to be visible (PTX ISA 7.8, griddepcontrol, sm_90); on an older GPU there is no
# such launch and the wait is nothing.
WAIT_MACRO = """#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RNN_WAIT_PRIMARY() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define RNN_WAIT_PRIMARY() do { } while (0)
#endif
"""
WAIT_LINE = "RNN_WAIT_PRIMARY();   // the GEMM before this launch has finished: read what it wrote"


def helper_source(filename: str) -> str:
    """A hand-written helper file from kernels/, inlined so the generated source stands alone."""
    text = (KERNELS_DIR / filename).read_text()
    return f"// ---- kernels/{filename} (inlined) ----\n{text.rstrip()}\n// ---- end of kernels/{filename} ----\n"


def kernel_file_source(filename: str, helpers: tuple = ("tile_gemm.cuh",)) -> str:
    """kernels/<filename> with its helper headers inlined before it, by default tile_gemm.cuh, whose roundings
    (rnn_tf32_bits, rnn_bits16: the kernels' own) it calls."""
    return "".join(helper_source(name) for name in helpers) + (KERNELS_DIR / filename).read_text()


def round_operands_source() -> str:
    """kernels/round_operands.cu (an fp32 operand rounded to a reduced precision mode: the training step's GEMM
    operands, the schedules' projection inputs), as kernel_file_source gives it."""
    return kernel_file_source("round_operands.cu")


ROUND_VALUES = {"tf32": "round_values_tf32", "float16": "round_values_fp16", "bfloat16": "round_values_bf16"}
ROUND_THREADS = 256          # threads a block of kernels/round_operands.cu's grid-stride entries
_file_entries: dict = {}     # (file, entry, device) -> the loaded function
_attributes: dict = {}       # (device, attribute) -> its value


def file_entry(cupy, filename: str, name: str, helpers: tuple = ("tile_gemm.cuh",), smem: int = 0):
    """kernels/<filename>'s entry `name` (kernel_file_source with `helpers`) on the current device, loaded once a
    process and device; smem: the dynamic shared memory it is opted into (above the default 48 KB)."""
    key = (filename, name, cupy.cuda.Device().id)
    if key not in _file_entries:
        function = load_module(kernel_file_source(filename, helpers), kernel=name).get_function(name)
        if smem:
            function.max_dynamic_shared_size_bytes = smem
        _file_entries[key] = function
    return _file_entries[key]


def round_entry(cupy, name: str):
    """kernels/round_operands.cu's entry `name` on the current device (file_entry)."""
    return file_entry(cupy, "round_operands.cu", name)


def round_blocks(cupy, items: int) -> int:
    """Blocks of ROUND_THREADS for a grid-stride loop over `items`: one an item up to 16 an SM (the SM count read
    once a device, not at every call)."""
    return max(1, min(-(-items // ROUND_THREADS), device_attribute(cupy, "MultiProcessorCount") * 16))


def device_attribute(cupy, name: str) -> int:
    """An attribute of the current GPU (CuPy's Device().attributes name: "MultiProcessorCount", "L2CacheSize"),
    read once a device: Device().attributes queries every attribute, too slow for a launch's path."""
    device = cupy.cuda.Device()
    key = (device.id, name)
    if key not in _attributes:
        _attributes[key] = device.attributes[name]
    return _attributes[key]


def round_values(a, precision: str):
    """A C-contiguous float32 CuPy array rounded to a reduced mode ("tf32", "float16", "bfloat16"), as float32 values
    (what engine.rounding.round_like gives): one launch of kernels/round_operands.cu round_values_*, the kernels' own
    roundings, 16 bytes a thread (a view that does not start on 16 bytes is copied first)."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)

    if a.data.ptr % 16:
        a = a.copy()
    out = cupy.empty_like(a)
    if a.size:
        round_entry(cupy, ROUND_VALUES[precision])((round_blocks(cupy, -(-a.size // 4)),), (ROUND_THREADS,),
                                                   (a, out, np.int64(a.size)))
    return out


def c_factor(lin: Lin) -> str:
    """The extent as a C expression that is safe to multiply: parenthesised when it is a sum."""
    text = lin.c_expr()
    return f"({text})" if "+" in text else text


def index_expr(access: Access, row: str = "row") -> str:
    """The element (b, j) of an access; `row` names the row of a sequence buffer (row t * B + b)."""
    parts = []
    if access.rows != "vector":
        parts.append(f"{row if access.rows == 'sequence' else 'b'} * {c_factor(access.ld)}")
    offset = access.offset.c_expr()
    if offset != "0":
        parts.append(c_factor(access.offset) if "+" in offset else offset)
    parts.append("j" if access.stride == 1 else f"{access.stride} * j")
    return " + ".join(parts)


def literal(value: float, precision: Precision) -> str:
    text = repr(float(value))
    if "e" not in text and "." not in text and "inf" not in text and "nan" not in text:
        text += ".0"
    return text + precision.literal_suffix


def statement_expr(statement, precision: Precision) -> str:
    if statement.op == "sum":
        return " + ".join(statement.args)
    spec = OPS[statement.op]
    fields = dict(zip(spec.ports, statement.args))
    for key, value in statement.attrs:
        fields[key] = literal(value, precision)
    text = spec.cuda.format(**fields)
    # The op table wraps binary expressions in parentheses for nesting; a statement needs none.
    if text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1]
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def reads_rows(kernel: Kernel, places=()) -> bool:
    """Whether the kernel touches a (T*B, .) sequence buffer, so it needs the row of step t (a load of a param in
    `places` reads shared memory instead)."""
    return any(load.access is not None and load.access.rows == "sequence" and load.access.param not in places
               for load in kernel.loads) or any(s.access.rows == "sequence" for s in kernel.stores)


def stored(store) -> str:
    """The C expression a store writes: its variable, or, for a store that holds past the row's end (Store.past_end,
    engine/passes/lengths.py), the select of it and the held value on `within` (within_line)."""
    return store.var if store.past_end is None else f"within ? {store.var} : {store.past_end}"


def within_line(lengths: str) -> str:
    """The flag the held stores select on; `lengths` is the C expression of the (B,) lengths array."""
    return f"const bool within = t < {lengths}[b];   // step t lies within sequence b: else its states are held"


def kernel_body(kernel: Kernel, precision: Precision, indent: str = "        ", lengths: str = "lengths",
                places=None, wait_for=None) -> list[str]:
    """The per-element work of a kernel, given b, j, t, B, I, H and its pointer arguments by name:
    loads into named registers, one statement per op, stores. The fused kernels and the wavefront
    schedules (engine/codegen/wavefront.py) wrap the same lines in their own loops. A kernel that holds rows past
    their end (lengths=) reads the lengths from the C expression `lengths`. places ({param: f(access) -> C
    expressions}): where a param's elements live instead of its global array (the wavefront schedules' shared-memory
    copies, engine/codegen/reductions.py): a load reads the first expression, a store writes every one. wait_for (a
    set of params, engine/codegen/programmatic.py): the kernel is launched as a programmatic dependent of the GEMM
    before it; the loads of other params come first, then RNN_WAIT_PRIMARY(), then these params' loads, so nothing
    the GEMM writes is read, and nothing is stored, before it has finished."""
    places = places or {}
    compute = precision.compute
    lines = []
    if reads_rows(kernel, places):
        lines.append("const long row = (long)t * B + b;   // row of step t in (T*B, .) sequence buffers")
    if kernel.loads:
        lines.append("// load")
    loads = list(kernel.loads)
    if wait_for is not None:       # the loads of what the GEMM before writes last, after the wait
        loads.sort(key=lambda load: load.literal is None and load.access.param in wait_for)
        waited = sum(1 for load in loads if load.literal is None and load.access.param in wait_for)
    for k, load in enumerate(loads):
        if wait_for is not None and k == len(loads) - waited:
            lines.append(WAIT_LINE)
        if load.literal is not None:
            lines.append(f"const {compute} {load.var} = {literal(load.literal, precision)};")
        else:
            place = places.get(load.access.param)
            source = place(load.access)[0] if place else f"{load.access.param}[{index_expr(load.access)}]"
            lines.append(f"const {compute} {load.var} = {precision.load(source)};")
    if wait_for is not None and not waited:
        lines.append(WAIT_LINE)
    if kernel.statements:
        lines.append("// compute")
    for st in kernel.statements:
        lines.append(f"const {compute} {st.var} = {statement_expr(st, precision)};")
    if kernel.stores:
        lines.append("// store")
    if any(store.past_end is not None for store in kernel.stores):
        lines.append(within_line(lengths))
    for store in kernel.stores:
        place = places.get(store.access.param)
        for target in place(store.access) if place else [f"{store.access.param}[{index_expr(store.access)}]"]:
            lines.append(f"{target} = {precision.store(stored(store))};")
    return [indent + line for line in lines]


def flags_range(copies) -> bool:
    """Whether a kernel with these copies ({param: (copy, C type, function)}) takes the range flag (RANGE_FLAGGED)."""
    return any(function in RANGE_FLAGGED for _, _, function in (copies or {}).values())


def render_kernel(kernel: Kernel, program: Program, precision: Precision, copies=None, wait_for=None,
                  places=None) -> str:
    """One fused kernel's source. copies ({param: (copy param, C type, C function)}, engine/codegen/operand_copies.py):
    every store to `param` also writes function(value) to the copy param, an extra pointer argument after the
    kernel's own (a GEMM operand kept in a precision mode's format beside its fp32 values); a copy that can pass its
    format's range takes the program's flag after them (RANGE_PARAM). wait_for: the params
    read after RNN_WAIT_PRIMARY() (kernel_body), for a kernel launched as a programmatic dependent (the module must
    define WAIT_MACRO). places ({param: f(access) -> [C expression]}, kernel_body's): how a param's loads read it
    (a step product's planes summed as they are read, engine/schedules/split_products.py)."""
    copies = copies or {}
    storage = precision.storage
    d = kernel.dim
    lines = [f"// {kernel.name}: stage {kernel.stage} of a time step, one thread per (b, j), b < B, j < {d}."]
    gemms_before = [g.name for g in program.step_gemms(kernel.stage)] if kernel.stage else []
    if gemms_before:
        lines.append(f"// Runs after {', '.join(gemms_before)}.")
    computed = [st.node for st in kernel.statements]
    if computed:
        lines.append("// Computes " + ", ".join(computed) + ".")
    for store in kernel.stores:
        lines.append(f"// Writes {store.var} to {store.access.param}: {store.why}.")
    lines.append(f'extern "C" __global__ void {kernel.name}(')
    args = []
    for p in kernel.params:
        qualifier = "" if p.writes else "const "
        args.append((f"    {qualifier}{storage}* __restrict__ {p.name},", p.doc))
    for param, (copy, c_type, _) in copies.items():
        args.append((f"    {c_type}* __restrict__ {copy},", f"{param} in the GEMM's operand format"))
    if flags_range(copies):
        args.append((f"    unsigned int* __restrict__ {RANGE_PARAM},", "set to 1 where a copy is past its format's range"))
    if program.lengths:
        args.append(("    const int* __restrict__ lengths,", "(B,) the steps of each sequence (lengths=)"))
    if program.cell.uses_projection:
        args.append(("    const int t, const int B, const int I, const int H, const int P)",
                     "step, batch, layer input, hidden and projection size"))
    else:
        args.append(("    const int t, const int B, const int I, const int H)", "step, batch, layer input and hidden size"))
    width = max(len(a) for a, _ in args)
    for text, doc in args:
        lines.append(f"{text.ljust(width)}  // {doc}" if doc else text)
    lines.append("{")
    lines.append(f"    const long total = (long)B * {d};")
    lines.append("    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;"
                 " idx += (long)gridDim.x * blockDim.x) {")
    lines.append(f"        const long b = idx / {d};")
    lines.append(f"        const int j = (int)(idx - b * {d});")
    lines += kernel_body(kernel, precision, places=places, wait_for=wait_for)
    for store in kernel.stores:
        if store.access.param in copies:
            copy, _, function = copies[store.access.param]
            tiles = function == SPLIT_COPY_TILES or function in TILE_COPIES.values()
            if tiles or function in (SPLIT_COPY, SPLIT_COPY_FP16):
                if store.access.rows != "batch":
                    raise CompileError(f"kernel '{kernel.name}' stores {store.var} into {store.access.param}, a buffer of "
                                       "the sequence's rows, which a step GEMM's split operand cannot be; hint: this is "
                                       "a bug in engine/codegen/operand_copies.py")
                ld = c_factor(store.access.ld)
                where = f"(long){ld}, (long)B" if tiles else f"(long)B * {ld}"
                lines.append(f"        {function}({copy}, {index_expr(store.access)}, {where}, {stored(store)});")
            else:
                lines.append(f"        {copy}[{index_expr(store.access)}] = {function}({stored(store)});")
    lines.append("    }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def module_header(program: Program, doc: str, generator_version: int, precision: Precision) -> str:
    cell = program.cell
    lines = [f"// Generated by engine.codegen (generator version {generator_version}) for cell "
             f"'{program.source_cell.name}'", f"// (structure hash {program.source_cell.structural_hash}). "
             "Do not edit: regenerate from the cell instead.", "//",
             f"// Precision: {precision.describe()}.", "//", "// Equations (from the graph):"]
    lines += [f"//   {eq}" for eq in text_equations(cell)]
    if doc.strip():
        lines += ["//", "// From the cell's documentation:"]
        lines += [f"//   {line}".rstrip() for line in doc.strip().splitlines()]
    if program.lengths:
        lines += ["//", "// lengths= (argument lengths): at a step t >= lengths[b] row b's stores hold its states and "
                  "write 0 as its output (engine/passes/lengths.py)."]
    lines += ["//", "// Passes: " + ", ".join(f"{p.name} {'on' if p.enabled else 'off'}" for p in program.passes),
              "//", "// One time step of one layer, in order:"]
    for g in program.hoisted_gemms:
        lines.append(f"//   (once per sequence or chunk) {g.name}: {g.layout_text()}")
    for kind, item in program.step_order():
        if kind == "gemm":
            lines.append(f"//   {item.name} (GEMM, stage {item.stage}): {item.layout_text()}")
        else:
            lines.append(f"//   {item.name} (kernel, stage {item.stage})")
    lines += ["//", "// Buffers (per layer; rows B = one step, T*B = the sequence, row t*B + b):"]
    for buf in program.buffers:
        rows = "T*B" if buf.rows == "sequence" else "B"
        lines.append(f"//   {buf.name}: ({rows}, {buf.cols}){' x2 (cur/next)' if buf.double else ''}  {buf.doc}")
    return "\n".join(lines) + "\n"


def render_module(program: Program, doc: str, generator_version: int, precision: Precision) -> tuple[str, dict]:
    """(the whole module: header, helpers, kernels; {kernel name: its source})."""
    kernels = {k.name: render_kernel(k, program, precision) for k in program.kernels}
    parts = [module_header(program, doc, generator_version, precision), helper_source(CELL_HELPERS)]
    parts += list(kernels.values())
    return "\n".join(parts), kernels
