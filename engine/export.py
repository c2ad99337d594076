"""Export a network as one self-contained CUDA program that builds with plain `nvcc ... -lcublas`.

The .cu holds the generated kernels (the same ones the fused backend runs), a documented host
driver that runs the whole sequence with cuBLAS and those kernels (hoisted projection, per-step
GEMMs and kernels, the layer wavefront on one stream per layer), and a small `main` that reads
the input and the packed weights from raw float32 files and writes the outputs. Its header gives
the equations, sizes, weight layout, file formats and the nvcc command.

    source = export_cuda("lstm", input_size=64, hidden_size=128, num_layers=2)
    path = write_export("out/", "lstm", 64, 128, 2)             # out/lstm_rnn.cu
    write_run_files("out/", program, network, params, x)          # weights.bin, x.bin, states.bin
    outputs, final_states = read_outputs("out/out.bin", network, T, B)
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np

from .c_names import kernel_prefix
from .codegen import GENERATOR_VERSION, helper_source, text_equations
from .codegen.cuda import ROW_BIAS_HELPER, THREADS_PER_BLOCK
from .dense import dense
from .errors import CompileError
from .explain import build_plan, resolve
from .files import as_path, check_destination, write_text, write_with
from .network import Network
from .params import Params
from .plan import Gemm, Plan, Program, pack_weights

NVCC_FLAGS = ("-O2", "-std=c++17")


def export_plan(cell_or_preset, input_size: int, hidden_size: int, num_layers: int = 1, passes=None,
                layout: str = "blocked", chunk_steps: int | None = None) -> Plan:
    # T and B are run-time arguments of the program; the plan is bound to placeholders only to give
    # the chunk size (the program clips it to T).
    cell = resolve(cell_or_preset, input_size, hidden_size, num_layers, 1, 1)[0].cell
    if cell.uses_projection:
        raise CompileError(f"cell '{cell.name}' has values of the projection size P: the exported program does not "
                           "take P yet; hint: run it with engine.run (backend='fused' on a GPU, 'reference' on the "
                           "CPU)")
    return build_plan(cell_or_preset, input_size, hidden_size, num_layers, steps=1 << 20, batch=1, passes=passes,
                      layout=layout, chunk_steps=chunk_steps)


def export_cuda(cell_or_preset, input_size: int, hidden_size: int, num_layers: int = 1, passes=None,
                layout: str = "blocked", chunk_steps: int | None = None, arch: str = "sm_90") -> str:
    """The complete .cu source for a network of num_layers layers of the cell."""
    plan = export_plan(cell_or_preset, input_size, hidden_size, num_layers, passes, layout, chunk_steps)
    return render_program(plan, arch=arch)


def program_name(plan: Plan) -> str:
    return f"{kernel_prefix(plan.program.source_cell.name)}_rnn"


def write_export(directory, cell_or_preset, input_size: int, hidden_size: int, num_layers: int = 1, passes=None,
                 layout: str = "blocked", chunk_steps: int | None = None, arch: str = "sm_90") -> Path:
    directory = as_path(directory, "export folder")
    check_destination(directory / "program.cu", "exported CUDA program")     # before the work: a file, read-only
    plan = export_plan(cell_or_preset, input_size, hidden_size, num_layers, passes, layout, chunk_steps)
    return write_text(directory / f"{program_name(plan)}.cu", render_program(plan, arch=arch), "exported CUDA program")


# ---- the data files ---------------------------------------------------------------------------------

def weight_order(program: Program, network: Network) -> list[tuple[int, str, str, tuple[int, ...]]]:
    """(layer, what, name, shape) of every block of weights.bin, in file order."""
    out = []
    for layer in range(network.num_layers):
        sizes = network.layer_sizes(layer)
        for g in program.gemms:
            out.append((layer, "gemm weight", g.name, (g.n(sizes), g.k(sizes))))
            if g.has_bias:
                out.append((layer, "gemm bias", g.name, (g.n(sizes),)))
        for name in program.kernel_params:
            out.append((layer, "parameter", name, (sizes[network.cell[name].attr("dim", "H")],)))
    return out


def write_run_files(directory, program: Program, network: Network, params: Params, x,
                    initial_states: dict | None = None) -> dict[str, Path]:
    """weights.bin (packed as the program expects), x.bin and states.bin, raw float32 little-endian."""
    directory = as_path(directory, "run-files folder")
    check_destination(directory / "weights.bin", "program data")
    network, params = dense(network, params)      # the program's weights: heads block-diagonal, reductions' matrices
    chunks = []
    for layer in range(network.num_layers):
        packed = pack_weights(program, network, params, layer, dtype=np.float64)
        for g in program.gemms:
            chunks.append(packed[g.name].weight)
            if g.has_bias:
                chunks.append(packed[g.name].bias)
        for name in program.kernel_params:
            chunks.append(np.asarray(params[layer][name]))
    paths = {"weights": directory / "weights.bin", "x": directory / "x.bin", "states": directory / "states.bin"}
    write_f32(paths["weights"], chunks, "packed weights")
    write_f32(paths["x"], [np.asarray(x)], "input x")
    T, B, _ = np.shape(x)
    states = []
    for name in program.cell.state_names:
        value = None if initial_states is None else initial_states.get(name)
        states.append(np.zeros((network.num_layers, B, network.hidden_size)) if value is None else np.asarray(value))
    write_f32(paths["states"], states, "initial states")
    return paths


def write_f32(path: Path, arrays, what: str = "float32 data") -> Path:
    """Raw float32 little-endian, the arrays one after another; written atomically (engine/files.py)."""
    def write(f) -> None:
        for a in arrays:
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
    return write_with(path, write, what)


def read_outputs(path, program: Program, network: Network, steps: int, batch: int):
    """(outputs (T, B, H), {state: (L, B, H)}) from the program's out.bin."""
    data = np.fromfile(path, dtype="<f4")
    H, L = network.hidden_size, network.num_layers
    states = program.cell.state_names
    want = steps * batch * H + len(states) * L * batch * H
    if data.size != want:
        raise CompileError(f"{path} holds {data.size} floats, expected {want} for T={steps}, B={batch}, H={H}, "
                           f"L={L} and states {', '.join(states)}")
    outputs = data[:steps * batch * H].reshape(steps, batch, H)
    final, offset = {}, steps * batch * H
    for name in states:
        final[name] = data[offset:offset + L * batch * H].reshape(L, batch, H)
        offset += L * batch * H
    return outputs, final


# ---- nvcc and cuBLAS --------------------------------------------------------------------------------

def nvcc_command(source: str | Path, output: str | Path, arch: str = "sm_90", compile_only: bool = False) -> list[str]:
    """The nvcc command line (with -I/-L for a cuBLAS that is not inside the CUDA toolkit)."""
    include, library = cublas_location()
    cmd = ["nvcc", *NVCC_FLAGS, f"-arch={arch}"]
    if include is not None:
        cmd.append(f"-I{include}")
    if compile_only:
        return cmd + ["-c", str(source), "-o", str(output)]
    cmd += ["-o", str(output), str(source)]
    if library is None:
        return cmd + ["-lcublas"]
    versioned = sorted(Path(library).glob("libcublas.so*"))
    plain = Path(library) / "libcublas.so"
    lib = plain if plain.exists() else versioned[0]
    return cmd + ["-Xlinker", str(lib), "-Xlinker", "-rpath", "-Xlinker", str(library)]


def cublas_location() -> tuple[str | None, str | None]:
    """(include dir, library dir) of cuBLAS when it is not where nvcc looks by default, else (None, None).

    Looks in $CUBLAS_HOME, then the CUDA toolkit ($CUDA_HOME, /usr/local/cuda*), then the
    `nvidia-cublas` pip package (nvidia/cu13 or nvidia/cublas). Raises CompileError when none has it."""
    candidates: list[Path] = []
    for var in ("CUBLAS_HOME", "CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]))
    toolkit = [Path("/usr/local/cuda")] + sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    nvcc = shutil.which("nvcc")
    if nvcc:
        toolkit.insert(0, Path(nvcc).resolve().parent.parent)
    spec = importlib.util.find_spec("nvidia")
    packages = []
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            packages += [Path(base) / sub for sub in ("cu13", "cublas", "cu12")]
    for root in candidates + toolkit + packages:
        if (root / "include" / "cublas_v2.h").exists():
            in_toolkit = root in toolkit
            lib = next((d for d in (root / "lib64", root / "lib") if list(d.glob("libcublas.so*"))), None)
            if in_toolkit and lib is not None and (lib / "libcublas.so").exists():
                return None, None
            return str(root / "include"), None if lib is None else str(lib)
    raise CompileError("cuBLAS (cublas_v2.h) not found; hint: install the CUDA toolkit's cuBLAS or "
                       "`pip install nvidia-cublas`, or set CUBLAS_HOME to a directory with include/cublas_v2.h")


# ---- rendering --------------------------------------------------------------------------------------

def render_program(plan: Plan, arch: str = "sm_90") -> str:
    program = plan.program
    fields = _Fields(program)
    parts = [_header(plan, fields, arch), _INCLUDES, program.source]
    if any(g.has_bias for g in program.hoisted_gemms):
        parts.append(helper_source(ROW_BIAS_HELPER))
    parts += [_host_prelude(plan), _layer_struct(plan, fields), _gemm_helper()]
    if program.hoisted_gemms:
        parts.append(_project(plan, fields))
    parts += [_step(plan, fields), _run_network(plan), _main(plan, fields)]
    return "\n".join(parts)


class _Fields:
    """Names of the Layer struct's members: buffers, packed weights and parameter vectors."""

    def __init__(self, program: Program):
        self.program = program
        self.weight = {g.name: f"{g.name}_w" for g in program.gemms}
        self.bias = {g.name: f"{g.name}_bias" for g in program.gemms if g.has_bias}
        self.param = {}
        for k in program.kernels:
            for p in k.params:
                if p.kind == "param":
                    self.param[p.source] = p.name
        names = [b.name for b in program.buffers] + list(self.weight.values()) + list(self.bias.values()) + list(
            self.param.values())
        if len(set(names)) != len(names):
            raise CompileError("export: two members of the layer struct would share a name; hint: rename the "
                               "cell's nodes so that weights, biases and buffers differ")


_INCLUDES = """#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include <cublas_v2.h>
"""


def _header(plan: Plan, fields: _Fields, arch: str) -> str:
    program, network = plan.program, plan.network
    cell = program.source_cell
    name = program_name(plan)
    I, H, L = network.input_size, network.hidden_size, network.num_layers
    states = ", ".join(program.cell.state_names)
    x, out = program.cell.input.name, program.cell.output
    lines = [
        f"{name}.cu: {L} layer(s) of the recurrent cell '{cell.name}', exported by engine.export",
        f"(generator version {GENERATOR_VERSION}, cell structure hash {cell.structural_hash}).",
        "",
        f"Equations, per layer ({x} is the layer input: the network input for layer 0, layer l-1's {out} above):",
        *[f"  {eq}" for eq in text_equations(program.cell)],
        "",
        f"Sizes fixed at export: input size I = {I}, hidden size H = {H}, layers L = {L}.",
        "Run shape chosen at run time: T steps, batch B.",
        "",
        "Build (cuBLAS from the CUDA toolkit; add -I/-L if it lives elsewhere):",
        f"  nvcc {' '.join(NVCC_FLAGS)} -arch={arch} -o {name} {name}.cu -lcublas",
        "Run:",
        f"  ./{name} weights.bin x.bin T B out.bin [states.bin]",
        "",
        "Files are raw float32, little-endian, row-major (C order), no header:",
        f"  x.bin       (T, B, I): the input sequence ({x} of layer 0 at every step)",
        f"  states.bin  optional initial states: one (L, B, H) block per state, in the order {states}",
        "              (all zeros when the file is not given)",
        f"  out.bin     written: the last layer's output {out} (T, B, H), then the final states, one (L, B, H)",
        f"              block per state in the order {states}",
        "  weights.bin the packed weights, per layer l = 0..L-1 in this order",
        "              (I_l = I for layer 0 and H for the layers above):",
    ]
    for g in program.gemms:
        lines.append(f"                {g.name} weight ({g.n}, {_lin_l(g.k)})" + (f", then {g.name} bias ({g.n})"
                                                                                   if g.has_bias else ""))
    for pname in program.kernel_params:
        lines.append(f"                {pname} ({network.cell[pname].attr('dim', 'H')})")
    lines += ["", "Weight layout: every GEMM computes Y (M, N) = X (M, K) W^T with W the packed (N, K) matrix",
              "below; X holds its operands side by side in its columns, Y holds its blocks. A block is the sum",
              "of the listed matmuls (each weight sits in the columns of its operand; zeros elsewhere) plus, for",
              "hoisted GEMMs, the listed biases (added to every row after the GEMM):"]
    for g in program.gemms:
        where = "hoisted: once for the whole sequence (layer 0) or per chunk of steps" if g.hoisted else \
            f"stage {g.stage} of every step"
        lines.append(f"  {g.name} ({where}): {g.layout_text()}")
        for t in g.terms:
            bias = f" + {' + '.join(t.biases)}" if t.biases else ""
            lines.append(f"    {t.name}: {' + '.join(t.matmuls)}{bias}")
    if network.num_layers == 1:
        schedule = "One layer: its steps run in order on one stream."
    elif program.schedule == "wavefront":
        schedule = (f"Layers run as a wavefront: layer l runs on its own stream, chunk c of {plan.chunk_steps} "
                    "step(s) after chunk c of layer l-1.")
    else:
        schedule = "Layers run one after the other (the wavefront pass was off)."
    lines += ["", "One step of one layer: " + " -> ".join(item.name for _, item in program.step_order()), schedule]
    body = "\n".join((" * " + line).rstrip() for line in lines)
    return "/*\n" + body + "\n */"


def _lin_l(lin) -> str:
    return str(lin).replace("I", "I_l")


def _host_prelude(plan: Plan) -> str:
    network = plan.network
    chunk = plan.chunk_steps if plan.program.schedule == "wavefront" and network.num_layers > 1 else 0
    return f"""// ---- host driver ---------------------------------------------------------------------------------

#define CUDA_CHECK(call) do {{ cudaError_t err_ = (call); if (err_ != cudaSuccess) {{ \\
    fprintf(stderr, "CUDA error %s at %s:%d: %s\\n", cudaGetErrorName(err_), __FILE__, __LINE__, \\
            cudaGetErrorString(err_)); exit(1); }} }} while (0)
#define CUBLAS_CHECK(call) do {{ cublasStatus_t st_ = (call); if (st_ != CUBLAS_STATUS_SUCCESS) {{ \\
    fprintf(stderr, "cuBLAS error %d at %s:%d\\n", (int)st_, __FILE__, __LINE__); exit(1); }} }} while (0)

static const int kInputSize = {network.input_size};
static const int kHiddenSize = {network.hidden_size};
static const int kLayers = {network.num_layers};
static const int kChunkSteps = {chunk};   // steps per input projection of layers > 0 (0: the whole sequence)
static const int kThreads = {THREADS_PER_BLOCK};

static unsigned int blocks_for(long elements) {{
    long blocks = (elements + kThreads - 1) / kThreads;
    return (unsigned int)(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));   // kernels are grid-stride
}}
"""


def _layer_struct(plan: Plan, fields: _Fields) -> str:
    program = plan.program
    lines = ["// Everything one layer owns on the device. Two-element arrays are double buffers: at step t,",
             "// [t % 2] holds the values of step t-1 (read) and [(t + 1) % 2] receives those of step t.",
             "struct Layer {", "    int I;                              // this layer's input size"]
    for buf in program.buffers:
        rows = "T*B" if buf.rows == "sequence" else "B"
        qual = "const float*" if buf.name == program.input_buffer else "float*"
        decl = f"{qual} {buf.name}" + ("[2]" if buf.double else "") + ";"
        lines.append(f"    {decl:<36}// ({rows}, {buf.cols}) {buf.doc}")
    for g in program.gemms:
        decl = f"float* {fields.weight[g.name]};"
        lines.append(f"    {decl:<36}// ({g.n}, {g.k}) packed weight of {g.name}")
        if g.has_bias:
            decl = f"float* {fields.bias[g.name]};"
            lines.append(f"    {decl:<36}// ({g.n}) folded biases of {g.name}")
    for source, member in fields.param.items():
        decl = f"float* {member};"
        lines.append(f"    {decl:<36}// ({plan.network.cell[source].attr('dim', 'H')}) parameter {source}")
    lines.append("};")
    return "\n".join(lines) + "\n"


def _gemm_helper() -> str:
    return """// Y (M, N) = X (M, K) W^T with row-major X, W (N, K) and Y. cuBLAS is column-major: there the
// same memory holds X^T (K x M), W^T (K x N) and Y^T (N x M), so compute Y^T = (W^T)^T X^T.
static void gemm_rows(cublasHandle_t handle, const float* X, const float* W, float* Y, int M, int N, int K) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, K, X, K, &zero, Y, N));
}
"""


def _project(plan: Plan, fields: _Fields) -> str:
    program = plan.program
    lines = ["// The hoisted input projections of rows [row0, row0 + rows) of the layer input.",
             "static void project(cublasHandle_t handle, Layer& L, long row0, long rows, cudaStream_t stream) {",
             "    const int I = L.I, H = kHiddenSize;",
             "    (void)I; (void)H; (void)stream;"]
    for g in program.hoisted_gemms:
        n, k = g.n.c_expr(), g.k.c_expr()
        lines.append(f"    gemm_rows(handle, L.{program.input_buffer} + row0 * ({k}), L.{fields.weight[g.name]}, "
                     f"L.{g.out_buffer} + row0 * ({n}), (int)rows, {n}, {k});")
        if g.has_bias:
            lines.append(f"    rnn_add_row_bias<<<blocks_for(rows * ({n})), kThreads, 0, stream>>>("
                         f"L.{g.out_buffer} + row0 * ({n}), L.{fields.bias[g.name]}, rows, {n});")
            lines.append("    CUDA_CHECK(cudaGetLastError());")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _kernel_args(kernel, program: Program, fields: _Fields) -> str:
    args = []
    for p in kernel.params:
        if p.kind == "param":
            args.append(f"L.{p.name}")
        elif program.buffer(p.source).double:
            args.append(f"L.{p.source}[{'next' if p.version == 'next' else 'cur'}]")
        else:
            args.append(f"L.{p.source}")
    return ", ".join(args + ["t", "B", "I", "H"] + (["P"] if program.cell.uses_projection else []))


def _step(plan: Plan, fields: _Fields) -> str:
    program = plan.program
    lines = ["// One time step t of one layer: each stage's GEMMs, then its kernel(s).",
             "static void step(cublasHandle_t handle, Layer& L, int t, int B, cudaStream_t stream) {",
             "    const int I = L.I, H = kHiddenSize, cur = t % 2, next = (t + 1) % 2;",
             "    (void)I; (void)cur; (void)next; (void)handle;"]
    for kind, item in program.step_order():
        if kind == "gemm":
            g: Gemm = item
            operands = f"L.{g.in_buffer}[cur]" if program.buffer(g.in_buffer).double else f"L.{g.in_buffer}"
            lines.append(f"    gemm_rows(handle, {operands}, L.{fields.weight[g.name]}, L.{g.out_buffer}, B, "
                         f"{g.n.c_expr()}, {g.k.c_expr()});   // stage {g.stage}")
        else:
            lines.append(f"    {item.name}<<<blocks_for((long)B * {item.dim}), kThreads, 0, stream>>>("
                         f"{_kernel_args(item, program, fields)});")
            lines.append("    CUDA_CHECK(cudaGetLastError());")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _run_network(plan: Plan) -> str:
    has_proj = bool(plan.program.hoisted_gemms)
    project0 = "            if (l == 0 && c == 0) project(handles[0], layers[0], 0, (long)T * B, streams[0]);\n" \
               "            if (l > 0) project(handles[l], layers[l], (long)t0 * B, (long)(t1 - t0) * B, streams[l]);\n" \
        if has_proj else ""
    return f"""// The whole network over T steps: the (layer, chunk) wavefront. Chunk c of layer l runs on stream
// l after chunk c of layer l-1 (an event) and after chunk c-1 of layer l (same stream). Chunks are
// enqueued diagonal by diagonal, so every event is recorded before a stream waits on it. Each stream
// has its own cuBLAS handle, so concurrent GEMMs never share a cuBLAS workspace.
static void run_network(std::vector<Layer>& layers, int T, int B) {{
    const int chunk = (kChunkSteps > 0 && kChunkSteps < T) ? kChunkSteps : T;
    const int chunks = (T + chunk - 1) / chunk;
    std::vector<cudaStream_t> streams(kLayers);
    std::vector<cublasHandle_t> handles(kLayers);
    std::vector<cudaEvent_t> done((size_t)kLayers * chunks);
    for (int l = 0; l < kLayers; ++l) {{
        CUDA_CHECK(cudaStreamCreateWithFlags(&streams[l], cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasCreate(&handles[l]));
        CUBLAS_CHECK(cublasSetStream(handles[l], streams[l]));
    }}
    for (auto& e : done) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaDeviceSynchronize());   // inputs and initial states are in place before any stream starts
    for (int k = 0; k < kLayers + chunks - 1; ++k) {{
        for (int l = 0; l < kLayers; ++l) {{
            const int c = k - l;
            if (c < 0 || c >= chunks) continue;
            const int t0 = c * chunk, t1 = (t0 + chunk < T) ? t0 + chunk : T;
            if (l > 0) CUDA_CHECK(cudaStreamWaitEvent(streams[l], done[(size_t)(l - 1) * chunks + c], 0));
{project0}            for (int t = t0; t < t1; ++t) step(handles[l], layers[l], t, B, streams[l]);
            CUDA_CHECK(cudaEventRecord(done[(size_t)l * chunks + c], streams[l]));
        }}
    }}
    CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& e : done) CUDA_CHECK(cudaEventDestroy(e));
    for (auto& h : handles) CUBLAS_CHECK(cublasDestroy(h));
    for (auto& s : streams) CUDA_CHECK(cudaStreamDestroy(s));
}}
"""


def _main(plan: Plan, fields: _Fields) -> str:
    program, network = plan.program, plan.network
    lines = [_FILE_HELPERS, "int main(int argc, char** argv) {",
             "    if (argc < 6 || argc > 7) {",
             '        fprintf(stderr, "usage: %s weights.bin x.bin T B out.bin [states.bin]\\n", argv[0]);',
             "        return 2;", "    }",
             "    const int T = atoi(argv[3]), B = atoi(argv[4]), H = kHiddenSize;",
             '    if (T < 1 || B < 1) { fprintf(stderr, "T and B must be positive integers\\n"); return 2; }',
             "    const long TB = (long)T * B;",
             "",
             "    // Expected size of weights.bin, block by block (see the header).",
             "    long weight_count = 0;",
             "    for (int l = 0; l < kLayers; ++l) {",
             "        const int I = (l == 0) ? kInputSize : kHiddenSize;",
             "        (void)I;"]
    for g in program.gemms:
        lines.append(f"        weight_count += (long)({g.n.c_expr()}) * ({g.k.c_expr()});")
        if g.has_bias:
            lines.append(f"        weight_count += {g.n.c_expr()};")
    for pname in program.kernel_params:
        lines.append(f"        weight_count += {network.cell[pname].attr('dim', 'H')};")
    states = program.cell.state_names
    lines += ["    }",
              "    std::vector<float> weights = read_floats(argv[1], weight_count);",
              "    std::vector<float> x = read_floats(argv[2], TB * kInputSize);",
              f"    const long state_count = (long){len(states)} * kLayers * B * H;   // states: "
              f"{', '.join(states)}",
              "    std::vector<float> states = (argc == 7) ? read_floats(argv[6], state_count)"
              " : std::vector<float>(state_count, 0.0f);",
              "",
              "    std::vector<Layer> layers(kLayers);",
              "    std::vector<void*> allocations;",
              "    auto device_alloc = [&](long count) {",
              "        void* p = nullptr;",
              "        CUDA_CHECK(cudaMalloc(&p, (size_t)count * sizeof(float)));   // every float is written before read",
              "        allocations.push_back(p);",
              "        return (float*)p;",
              "    };",
              "    float* x_device = device_alloc(TB * kInputSize);",
              "    CUDA_CHECK(cudaMemcpy(x_device, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));",
              "    const float* next_weight = weights.data();",
              "    auto upload = [&](long count) {",
              "        float* p = device_alloc(count);",
              "        CUDA_CHECK(cudaMemcpy(p, next_weight, (size_t)count * sizeof(float), cudaMemcpyHostToDevice));",
              "        next_weight += count;",
              "        return p;",
              "    };",
              "    for (int l = 0; l < kLayers; ++l) {",
              "        Layer& L = layers[l];",
              "        const int I = (l == 0) ? kInputSize : kHiddenSize;",
              "        L.I = I;"]
    for buf in program.buffers:
        rows = "TB" if buf.rows == "sequence" else "B"
        count = f"{rows} * ({buf.cols.c_expr()})"
        if buf.name == program.input_buffer:
            lines.append(f"        L.{buf.name} = (l == 0) ? x_device : layers[l - 1].{program.output_buffer};")
        elif buf.double:
            lines.append(f"        for (int v = 0; v < 2; ++v) L.{buf.name}[v] = device_alloc({count});")
        else:
            lines.append(f"        L.{buf.name} = device_alloc({count});")
    for g in program.gemms:
        lines.append(f"        L.{fields.weight[g.name]} = upload((long)({g.n.c_expr()}) * ({g.k.c_expr()}));")
        if g.has_bias:
            lines.append(f"        L.{fields.bias[g.name]} = upload({g.n.c_expr()});")
    for pname in program.kernel_params:
        lines.append(f"        L.{fields.param[pname]} = upload({network.cell[pname].attr('dim', 'H')});")
    lines.append("        // Initial states into version 0 of their home (a column block of a buffer).")
    for index, home in enumerate(program.homes):
        buf = program.buffer(home.slot.buffer)
        target = f"L.{buf.name}[0]" if buf.double else f"L.{buf.name}"
        lines.append(f"        copy_columns_to_device({target} + ({home.slot.offset.c_expr()}), {buf.cols.c_expr()}, "
                     f"states.data() + ((long){index} * kLayers + l) * B * H, B, H);   // {home.state}")
    lines += ["    }",
              "",
              "    run_network(layers, T, B);",
              "",
              "    std::vector<float> out((size_t)TB * H + (size_t)state_count);",
              f"    CUDA_CHECK(cudaMemcpy(out.data(), layers[kLayers - 1].{program.output_buffer}, "
              "(size_t)TB * H * sizeof(float), cudaMemcpyDeviceToHost));",
              "    for (int l = 0; l < kLayers; ++l) {",
              "        Layer& L = layers[l];",
              "        const int I = L.I;",
              "        (void)I;"]
    for index, home in enumerate(program.homes):
        buf = program.buffer(home.slot.buffer)
        source = f"L.{buf.name}[T % 2]" if buf.double else f"L.{buf.name}"
        lines.append(f"        copy_columns_to_host(out.data() + TB * H + ((long){index} * kLayers + l) * B * H, "
                     f"{source} + ({home.slot.offset.c_expr()}), {buf.cols.c_expr()}, B, H);   // {home.state}")
    lines += ["    }",
              "    write_floats(argv[5], out);",
              "    for (void* p : allocations) CUDA_CHECK(cudaFree(p));",
              f'    printf("{program_name(plan)}: wrote %s (T=%d, B=%d)\\n", argv[5], T, B);',
              "    return 0;",
              "}"]
    return "\n".join(lines) + "\n"


_FILE_HELPERS = """static std::vector<float> read_floats(const char* path, long count) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    const long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (bytes != count * (long)sizeof(float)) {
        fprintf(stderr, "%s has %ld bytes, expected %ld (%ld float32 values)\\n", path, bytes,
                count * (long)sizeof(float), count);
        exit(1);
    }
    std::vector<float> data(count);
    if (count > 0 && fread(data.data(), sizeof(float), count, f) != (size_t)count) {
        fprintf(stderr, "short read from %s\\n", path);
        exit(1);
    }
    fclose(f);
    return data;
}

static void write_floats(const char* path, const std::vector<float>& data) {
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(data.data(), sizeof(float), data.size(), f) != data.size()) {
        fprintf(stderr, "cannot write %s\\n", path);
        exit(1);
    }
    fclose(f);
}

// A (rows, cols) host block <-> columns of a row-major device matrix whose rows are ld floats apart.
static void copy_columns_to_device(float* device, int ld, const float* host, int rows, int cols) {
    CUDA_CHECK(cudaMemcpy2D(device, (size_t)ld * sizeof(float), host, (size_t)cols * sizeof(float),
                            (size_t)cols * sizeof(float), rows, cudaMemcpyHostToDevice));
}

static void copy_columns_to_host(float* host, const float* device, int ld, int rows, int cols) {
    CUDA_CHECK(cudaMemcpy2D(host, (size_t)cols * sizeof(float), device, (size_t)ld * sizeof(float),
                            (size_t)cols * sizeof(float), rows, cudaMemcpyDeviceToHost));
}
"""
