"""CUDA C for the fused training step's kernels (engine/autodiff/fused_plan.py): one function per kernel of the
forward step (which stores the values the backward reads) and of the backward step, one statement per op.

Each kernel covers the (B, D) elements of its stage with a grid-stride loop, thread (b, j) for batch row b and unit
j, as the forward fused kernels do (engine/codegen/cuda.py). Values are registers named v_<value>; a buffer element
is buffer[((t + shift) * B + b) * columns + offset + j]; parameters and static values are vectors read at [j].
Sizes (B, I, H, P) and the step t are arguments, so one compiled module serves every layer and shape.
"""
from __future__ import annotations

from ..c_names import ascii_identifiers
from ..codegen.cuda import CELL_HELPERS, helper_source, literal
from ..codegen.precision import precision
from ..codegen.wavefront import TILE_GEMM_HELPER
from ..ops import backward_op_def
from ..plan import Lin
from . import cublas, stage_fusion
from .fused_plan import LENGTHS, KernelPlan, Place, Statement, TrainingPlan
from .stage_fusion import THREADS as STAGE_THREADS
from .stage_fusion import WIDTHS, FusedStage, fused_stages

FP32 = precision("fp32")
THREADS = 256


def var(value: str) -> str:
    return f"v_{value}"


def element(place: Place, columns: dict) -> str:
    """The C expression of a value's element (b, j) at step t."""
    if place.kind == "literal":
        return literal(place.literal, FP32)
    if place.kind == "vector":
        return f"{place.buffer}[j]"
    step = "t" if place.shift == 0 else f"(t + {place.shift})"
    offset = place.offset.c_expr()
    index = f"((long){step} * B + b) * ({columns[place.buffer].c_expr()})"
    if offset != "0":
        index += f" + ({offset})"
    return f"{place.buffer}[{index} + j]"


def statement_expr(st: Statement) -> str:
    args = [var(a) for a in st.args]
    if st.op == "copy":
        return args[0]
    if st.op == "sum":
        return " + ".join(args)
    spec = backward_op_def(st.op)
    if spec is None or spec.cuda is None:
        raise ValueError(f"op '{st.op}' has no CUDA form")
    fields = dict(zip(spec.ports, args))
    for key, value in st.attrs:
        fields[key] = literal(value, FP32)
    return spec.cuda.format(**fields)


def statement_body(kernel: KernelPlan, columns: dict, indent: str) -> list[str]:
    """The statements of element (b, j) at step t: loads, the math, stores."""
    lines = [f"{indent}const float {var(value)} = {element(place, columns)};" for value, place in kernel.loads]
    lines += [f"{indent}const float {var(st.var)} = {statement_expr(st)};" for st in kernel.statements]
    return lines + [indent + line for line in store_lines(kernel, columns)]


def store_lines(kernel: KernelPlan, columns: dict) -> list[str]:
    """The kernel's stores of element (b, j) at step t; with lengths= (KernelPlan.past_end, engine/autodiff/
    fused_lengths.py) each selects, on whether step t lies within sequence b, its value or the one held there."""
    if not any(held is not None for held in kernel.past_end):
        return [f"{element(place, columns)} = {var(value)};" for value, place in kernel.stores]
    lines = [f"const bool within = t < {LENGTHS}[b];   // step t lies within sequence b: else the row holds"]
    for (value, place), held in zip(kernel.stores, kernel.past_end):
        stored = var(value) if held is None else f"within ? {var(value)} : {var(held)}"
        lines.append(f"{element(place, columns)} = {stored};")
    return lines


def declare(params: list[str], written: set) -> list[str]:
    """A kernel's buffer parameters, const where it does not write them (`written`), and the lengths (lengths=)."""
    return [f"    const int* __restrict__ {p}," if p == LENGTHS else
            f"    {'' if p in written else 'const '}float* __restrict__ {p}," for p in params]


def render_kernel(kernel: KernelPlan, plan: TrainingPlan) -> str:
    columns = plan.columns
    written = {p.buffer for _, p in kernel.stores}
    lines = [f"// {kernel.name}: stage {kernel.stage}, one thread per (b, j), b < B, j < {kernel.dim}.",
             f"// Computes {', '.join(s.var for s in kernel.statements) or 'nothing (copies)'}."]
    lines.append(f'extern "C" __global__ void {kernel.name}(')
    lines += declare(kernel_params(kernel), written)
    lines.append("    const int t, const int B, const int I, const int H, const int P)")
    lines += ["{", f"    const long total = (long)B * {kernel.dim};",
              "    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;"
              " idx += (long)gridDim.x * blockDim.x) {",
              f"        const long b = idx / {kernel.dim};",
              f"        const int j = (int)(idx - b * {kernel.dim});"]
    lines += statement_body(kernel, columns, "        ")
    lines += ["    }", "}"]
    return "\n".join(lines) + "\n"


def fused_params(stage: FusedStage) -> list[str]:
    """The buffer arguments of a fused stage, in the order render_fused declares them (then W, the launch's weight)."""
    return sorted(set(kernel_params(stage.kernel)) | {stage.gemm.operand.buffer, stage.gemm.out.buffer})


def gemm_loads(stage: FusedStage) -> dict:
    """The kernel's loads of the GEMM's output in the rows the launch writes: value -> member (all are at a member's
    own column: stage_fusion.fusible)."""
    out = stage.gemm.out
    member = {offset: m for m, offset in enumerate(stage.member_offsets)}
    return {value: member[place.offset] for value, place in stage.kernel.loads
            if place.kind == "row" and place.buffer == out.buffer and place.shift == stage.lag + out.shift}


def render_fused(stage: FusedStage, plan: TrainingPlan, width: int, tiled: bool) -> str:
    """A fused stage's variant `width` (engine/autodiff/stage_fusion.py): block u covers `units` units of the kernel's
    size from u * units, every member's column of each (the launch's weight has their rows side by side); it computes
    those GEMM columns for step tg (kernels/fused_stage.cuh), writes them where the GEMM would (added to what is there
    when the GEMM accumulates), then runs the kernel's statements for step t on the same units, reading the GEMM's values
    from shared memory. Where the block's elements are no more than its threads (small batch), each thread issues its
    element's other loads before the GEMM, so their latency hides behind it. tiled: the tiled GEMM for B > 2 is
    compiled in (else only the GEMV)."""
    columns = plan.columns
    kernel, gemm = stage.kernel, stage.gemm
    written = {p.buffer for _, p in kernel.stores} | {gemm.out.buffer}
    out = gemm.out
    interleaved = tiled or stage_fusion.INTERLEAVED
    layout = stage.weight_layout(interleaved)[1]
    # the GEMV's row of column c (kernels/fused_stage.cuh): interleaved, the block's rows are one run from j0 * M;
    # else member c % M of unit j0 + c / M is row (c % M) * D + j0 + c / M of the stacked (or transposed) weight
    weight, row_map = ("W_stage + (long)j0 * M * K", "1, 0, 0") if interleaved else ("W_stage", "M, D, j0")
    from_dots = gemm_loads(stage)
    others = [(value, place) for value, place in kernel.loads if value not in from_dots]
    lines = [f"// {stage.variant(width)}: GEMM {gemm.name} of step tg ({', '.join(gemm.members)}; W {layout}),",
             f"// then kernel {kernel.name} of step t on the same units: "
             f"{', '.join(s.var for s in kernel.statements) or 'copies'}.",
             f'extern "C" __global__ void __launch_bounds__({STAGE_THREADS}) {stage.variant(width)}(']
    lines += declare(fused_params(stage), written)
    lines.append("    const float* __restrict__ W_stage,")
    lines.append("    const int tg, const int t, const int B, const int I, const int H, const int P)")
    gemm_call = [f"        fused_stage_gemm<COLS, {STAGE_THREADS}, RB, RC, KC, STAGES, {'true' if tiled else 'false'}>(",
                 f"            {gemm.operand.buffer} + (long)(tg + {gemm.operand.shift}) * B * K, {weight},"
                 f" K, B, nc, dots, dots + (B * COLS + 3) / 4 * 4, k_lo, k_hi, {row_map});",
                 "        for (int i = threadIdx.x; i < B * nc; i += blockDim.x) {   // the GEMM's columns: in place",
                 "            const int b = i / nc, c = i - b * nc, u = c / M, m = c - u * M;",
                 f"            float* o = {out.buffer} + ((long)(tg + {out.shift}) * B + b) * "
                 f"({columns[out.buffer].c_expr()}) + ({out.offset.c_expr()}) + m * D + j0 + u;",
                 f"            const float v = {'*o + ' if gemm.accumulate else ''}dots[b * COLS + c];",
                 "            *o = v;",
                 "            dots[b * COLS + c] = v;" if gemm.accumulate else "",
                 "        }",
                 "        __syncthreads();                               // ... and in dots for the whole block"]
    gemm_call = [line for line in gemm_call if line]
    from_shared = [f"const float {var(value)} = dots[b * COLS + (j - j0) * M + {m}];" for value, m in from_dots.items()]
    math = ([f"const float {var(st.var)} = {statement_expr(st)};" for st in kernel.statements])
    stores = store_lines(kernel, columns)
    early = [f"const float {var(value)} = {element(place, columns)};" for value, place in others]
    lines += ["{",
              f"    constexpr int UNITS = {stage.units(width)}, M = {stage.members}, COLS = UNITS * M;"
              "   // a block's units, the GEMM's members, its columns",
              f"    constexpr int RB = {stage_fusion.TILE_RB}, RC = {stage_fusion.TILE_RC}, KC = {stage_fusion.TILE_KC}, "
              f"STAGES = {stage_fusion.TILE_STAGES};   // the tiled GEMM (B > {stage_fusion.GEMV_MAX_ROWS})",
              "    extern __shared__ __align__(16) float fused_smem[];",
              f"    const int D = {kernel.dim}, K = {gemm.k.c_expr()};",
              *_k_range(stage),
              "    const int j0 = blockIdx.x * UNITS, nu = min(UNITS, D - j0), nc = nu * M;",
              "    float* dots = fused_smem;                          // B x COLS: column u * M + m; then the staging,"
              " 16-byte aligned",
              f"    if (B * nu <= {STAGE_THREADS}) {{   // an element a thread: its other loads in flight during the GEMM",
              "        const int e = (int)threadIdx.x < B * nu ? (int)threadIdx.x : 0;",
              "        const long b = e / nu;",
              "        const int j = j0 + (int)(e - b * nu);"]
    lines += [f"        {line}" for line in early]
    lines += gemm_call
    lines += ["        if ((int)threadIdx.x < B * nu) {"]
    lines += [f"            {line}" for line in from_shared + math + stores]
    lines += ["        }", "        return;", "    }"]
    if tiled:            # more elements than threads: only the tiled form's batches (the GEMV's have B <= 2)
        lines += ["    {"] + gemm_call + ["    }",
                  "    for (int e = threadIdx.x; e < B * nu; e += blockDim.x) {",
                  "        const long b = e / nu;",
                  "        const int j = j0 + (int)(e - b * nu);"]
        lines += [f"        {line}" for line in early + from_shared + math + stores]
        lines += ["    }"]
    else:
        lines += ["    __trap();   // B <= 2 here (stage_fusion.fuses): B * nu <= 64"]
    lines += ["}"]
    return "\n".join(lines) + "\n"


def _k_range(stage: FusedStage) -> list[str]:
    """The lines that set k_lo and k_hi, the part of K a warp of the GEMV reads: for a Stack's GEMM the range of its
    member's nonzero grid blocks (GemmPlan.k_ranges), rounded out to multiples of 4; where the warps do not divide
    evenly among the members (a warp's columns would mix them), or for any other GEMM, all of K."""
    ranges = stage.gemm.k_ranges(stage.forward)
    warps = STAGE_THREADS // 32
    if not ranges or warps % stage.members or all(lo == Lin() and hi == stage.gemm.k for lo, hi in ranges):
        return ["    const int k_lo = 0, k_hi = K;                     // all of K: no zero blocks to skip"]

    def pick(values) -> str:
        expr = f"({values[-1].c_expr()})"
        for m in reversed(range(len(values) - 1)):
            expr = f"member == {m} ? ({values[m].c_expr()}) : {expr}"
        return expr
    return ["    const int member = (int)(threadIdx.x >> 5) % M;     // every column of a warp is of this member",
            f"    const int k_lo = ({pick([lo for lo, _ in ranges])}) & ~3;   // its nonzero part of K (zero blocks"
            " skipped)",
            f"    const int k_hi = min(K, (({pick([hi for _, hi in ranges])}) + 3) & ~3);"]


def render_summed(stage: FusedStage, plan: TrainingPlan) -> str:
    """A fused stage's kernel that first sums its GEMM's split-K partial products (engine/autodiff/cublas.py split:
    `splits` contiguous (B, N) parts, at most cublas.MAX_SPLITS when rendered) for its own elements, writes them where the GEMM's output
    goes (added to what is there when the GEMM accumulates: kernels/splitk_reduce.cu's sum, in its order), then runs
    the statements: the reduce launch between the GEMM and the kernel goes. Thread (b, j) owns column j of each
    member, so no thread waits for another. It issues every partial load of its element (members x MAX_SPLITS,
    predicated on splits) before the first add: one L2 round trip, not a loop over a run-time count of splits a
    member. The GEMM ran for step tg, the kernel's statements are of step t."""
    columns = plan.columns
    kernel, gemm = stage.kernel, stage.gemm
    written = {p.buffer for _, p in kernel.stores} | {gemm.out.buffer}
    out = gemm.out
    lines = [f"// {stage.summed}: the split-K sums of GEMM {gemm.name} (step tg), then kernel {kernel.name} (step t).",
             f'extern "C" __global__ void {stage.summed}(']
    lines += declare(fused_params(stage), written)
    lines.append("    const float* __restrict__ partials, const int splits,")
    lines.append("    const int tg, const int t, const int B, const int I, const int H, const int P)")
    lines += ["{", f"    constexpr int M = {stage.members}, SPLITS = {cublas.MAX_SPLITS};"
              "   // the GEMM's members; splits <= SPLITS (engine/autodiff/cublas.py)",
              f"    const int D = {kernel.dim}, N = {gemm.n.c_expr()};",
              "    const long total = (long)B * D;",
              "    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;"
              " idx += (long)gridDim.x * blockDim.x) {",
              "        const long b = idx / D;",
              "        const int j = (int)(idx - b * D);",
              "        float part[M][SPLITS];                        // every load in flight before the first add",
              "#pragma unroll",
              "        for (int i = 0; i < SPLITS; ++i)",
              "#pragma unroll",
              "            for (int m = 0; m < M; ++m)",
              "                part[m][i] = i < splits ? __ldcg(partials + ((long)i * B + b) * N + m * D + j) : 0.0f;",
              "#pragma unroll",
              "        for (int m = 0; m < M; ++m) {                 // member m's column j of the GEMM",
              f"            float* o = {out.buffer} + ((long)(tg + {out.shift}) * B + b) * ({columns[out.buffer].c_expr()})"
              f" + ({out.offset.c_expr()}) + m * D + j;",
              f"            float sum = {'*o' if gemm.accumulate else '0.0f'};",
              "#pragma unroll",
              "            for (int i = 0; i < SPLITS; ++i)",
              "                if (i < splits) sum += part[m][i];",
              "            *o = sum;",
              "        }"]
    lines += statement_body(kernel, columns, "        ")
    lines += ["    }", "}"]
    return "\n".join(lines) + "\n"


def kernel_params(kernel: KernelPlan) -> list[str]:
    """The buffer arguments of a kernel, in the order render_kernel declares them (with lengths=, the lengths too:
    the Layer holds them beside its buffers)."""
    lengths = {LENGTHS} if any(held is not None for held in kernel.past_end) else set()
    return sorted({p.buffer for _, p in kernel.stores} |
                  {p.buffer for _, p in kernel.loads if p.kind in ("row", "vector")} | lengths)


def render_module(plan: TrainingPlan, tiled: bool | None = None) -> str:
    """The plan's kernels, its fused stages' variants and summing kernels as one source. tiled (default: whether
    stage_fusion.FUSE_MAX_ROWS allows more than GEMV_MAX_ROWS rows): the fused stages' tiled GEMM compiled in; it
    roughly doubles the compile time, and the default does not use it."""
    if tiled is None:
        tiled = stage_fusion.FUSE_MAX_ROWS > stage_fusion.GEMV_MAX_ROWS
    header = [f"// Generated by engine.autodiff.fused_codegen for cell '{plan.cell.name}' (structure hash "
              f"{plan.cell.structural_hash}): the fused training step,",
              "// IEEE fp32. Do not edit: regenerate from the cell instead."]
    kernels = [render_kernel(k, plan) for k in plan.forward.kernels + plan.backward.kernels]
    stages = fused_stages(plan).values()
    fused = []
    if stages:
        fused = [helper_source(TILE_GEMM_HELPER), helper_source("fused_stage.cuh")]
        fused += [render_fused(s, plan, w, tiled) for s in stages for w in WIDTHS]
        fused += [render_summed(s, plan) for s in stages]
    return ascii_identifiers("\n".join(["\n".join(header), helper_source(CELL_HELPERS), *kernels, *fused]))
