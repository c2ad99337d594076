"""The exported standalone program: its documentation, its data files, and that it computes the cell.

Without a GPU, the exported .cu files (kernels and host driver exactly as generated) are built with
g++ against a CPU stand-in of the CUDA runtime and cuBLAS (tests/cuda_emulation/), run, and compared
with the NumPy reference: this checks the rendered CUDA text (indexing, versions, launch arguments),
the host driver (packing order, file formats, wavefront enqueue order, state copies) and the weight
files. To keep CI fast, all programs go into one translation unit (each in its own namespace, with a
small dispatching main). With nvcc and cuBLAS headers present, the same programs also compile with
the real toolchain. tests/gpu/test_export_gpu.py builds and runs them on a GPU.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from compiler_cells import CELLS

import engine
from engine.cli import main as cli_main
from engine.errors import CompileError
from engine.export import (
    export_cuda,
    export_plan,
    read_outputs,
    render_program,
    weight_order,
    write_export,
    write_run_files,
)

EMULATION = Path(__file__).parent / "cuda_emulation"
# Every preset the export takes: not LSTMP (values of size P), refused by name in test_projection.py.
PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)
ALL_CELLS = {**{name: engine.preset(name).cell for name in PRESETS}, **CELLS}
SIZES = dict(input_size=5, hidden_size=7, num_layers=2)
T, B = 5, 3

# name -> (cell, passes, layout): every cell with all passes, plus variants that change the program.
VARIANTS = {name: (cell, None, "blocked") for name, cell in ALL_CELLS.items()}
VARIANTS.update({
    "lstm_interleaved": (ALL_CELLS["lstm"], None, "interleaved"),
    "gru_cho_interleaved": (ALL_CELLS["gru_cho"], None, "interleaved"),
    "lstm_fgr_no_hoist": (ALL_CELLS["lstm_fgr"], {"hoist_inputs": False}, "blocked"),
    "mgu_unfused": (ALL_CELLS["mgu"], {"fuse_elementwise": False, "group_gemms": False}, "blocked"),
    "input_sized_unfused": (ALL_CELLS["input_sized"], {"fuse_elementwise": False, "fold_biases": False},
                            "blocked"),
    "gru_layers": (ALL_CELLS["gru"], {"wavefront": False}, "blocked"),
})


def _export(cell, passes=None, layout="blocked"):
    sizes = dict(SIZES, hidden_size=cell.fit_size(SIZES["hidden_size"]))      # a multiple of a cell's heads
    plan = export_plan(cell, passes=passes, layout=layout, chunk_steps=2, **sizes)
    return plan, render_program(plan)


# ---- documentation and files ------------------------------------------------------------------------

def test_header_documents_build_run_formats_and_layout():
    source = export_cuda(engine.preset("peephole_lstm"), 37, 129, 3)
    head = source.split("*/", 1)[0]
    for needle in ("nvcc -O2 -std=c++17 -arch=sm_90 -o peephole_lstm_rnn peephole_lstm_rnn.cu -lcublas",
                   "./peephole_lstm_rnn weights.bin x.bin T B out.bin [states.bin]",
                   "raw float32, little-endian", "input size I = 37, hidden size H = 129, layers L = 3",
                   "x_proj weight (4H, I_l), then x_proj bias (4H)", "h_gemm weight (4H, H)", "p_f (H)",
                   "blocked: rows [i_pre_x (H)", "c[t] = f * c[t-1] + i * g"):
        assert needle in head, needle
    assert "static const int kLayers = 3;" in source and "int main(int argc, char** argv)" in source


def test_header_names_the_cells_own_input_and_states():
    """A cell whose input, output state and second state are not x, h and c: the header and the generated comments
    speak of its names."""
    d = engine.to_dict(engine.preset("lstm").cell)
    rename = {"x": "u", "h": "y", "c": "cell_state"}
    d = json.loads(re.sub(r'"(x|h|c)"', lambda m: f'"{rename[m.group(1)]}"', json.dumps(d)))
    source = export_cuda(engine.from_dict(d), 5, 7, 2)
    head = source.split("*/", 1)[0]
    assert "(u is the layer input: the network input for layer 0, layer l-1's y above)" in head
    assert "the input sequence (u of layer 0 at every step)" in head and "the last layer's output y (T, B, H)" in head
    assert "in the order y, cell_state" in head and "cell_state[t] = f * cell_state[t-1] + i * g" in head
    comments = "\n".join(re.findall(r"//[^\n]*|/\*.*?\*/", source, flags=re.S))
    assert not re.search(r"\b(h|c)\[t|'s h\b|\bstate [hc]\b|\bx for layer", comments), \
        re.findall(r"[^\n]*(?:\b(?:h|c)\[t|'s h\b|\bstate [hc]\b|\bx for layer)[^\n]*", comments)


def test_weight_file_follows_the_documented_order(tmp_path):
    cell = engine.preset("peephole_lstm").cell
    plan, _ = _export(cell)
    params = engine.init_params(plan.network, seed=3)
    x = np.random.default_rng(0).standard_normal((T, B, SIZES["input_size"]))
    paths = write_run_files(tmp_path, plan.program, plan.network, params, x)
    order = weight_order(plan.program, plan.network)
    data = np.fromfile(paths["weights"], dtype="<f4")
    assert data.size == sum(int(np.prod(shape)) for *_, shape in order)
    # The last block is layer 1's last parameter vector, as the header says.
    layer, what, name, shape = order[-1]
    assert (layer, what) == (1, "parameter")
    np.testing.assert_allclose(data[-shape[0]:], params[1][name], rtol=1e-6)
    assert np.fromfile(paths["x"], dtype="<f4").size == x.size
    assert np.fromfile(paths["states"], dtype="<f4").size == 2 * 2 * B * SIZES["hidden_size"]


def test_read_outputs_checks_the_size(tmp_path):
    plan, _ = _export(engine.preset("gru").cell)
    H = SIZES["hidden_size"]
    values = np.arange(T * B * H + 2 * B * H, dtype="<f4")
    values.tofile(tmp_path / "out.bin")
    outputs, final = read_outputs(tmp_path / "out.bin", plan.program, plan.network, T, B)
    assert outputs.shape == (T, B, H) and final["h"].shape == (2, B, H)
    assert final["h"][0, 0, 0] == T * B * H
    with pytest.raises(CompileError, match="expected"):
        read_outputs(tmp_path / "out.bin", plan.program, plan.network, T + 1, B)


def test_export_cli_writes_the_program_and_an_example(tmp_path, capsys):
    assert cli_main(["export", "mgu", "-I", "4", "-H", "6", "-L", "2", "-o", str(tmp_path), "--example", "3", "2"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["expected.bin", "mgu_rnn.cu", "states.bin", "weights.bin", "x.bin"]
    assert "./mgu_rnn weights.bin x.bin 3 2 out.bin states.bin" in capsys.readouterr().out


def test_write_export_is_atomic_and_named_after_the_cell(tmp_path):
    path = write_export(tmp_path, "indrnn", 4, 6, 1)
    assert path.name == "indrnn_rnn.cu" and not list(tmp_path.glob("*.tmp"))


# ---- one translation unit for many programs ---------------------------------------------------------

_INCLUDE = re.compile(r"^#include <[^>]+>\n", re.M)
_INLINED = re.compile(r"// ---- kernels/(\S+) \(inlined\) ----\n.*?// ---- end of kernels/\1 ----\n", re.S)
_LAUNCH = re.compile(r"^(\s*)(\w+)<<<([^,]+), ([^,]+), [^>]*>>>\((.*)\);$", re.M)


def combined_program(sources: dict[str, str], emulate: bool) -> str:
    """Many exported programs in one file: shared includes and helpers, one namespace per program, and
    a main that runs the program named by argv[1]. emulate=True rewrites kernel launches for the CPU."""
    helpers = (Path(__file__).parents[1] / "kernels")
    parts = ["#include <cstdio>", "#include <cstdlib>", "#include <cstring>", "#include <vector>",
             "#include <cuda_runtime.h>", "#include <cublas_v2.h>",
             (helpers / "cell_ops.cuh").read_text(), (helpers / "row_bias.cuh").read_text()]
    for name, source in sources.items():
        body = _INLINED.sub("", _INCLUDE.sub("", source)).replace('extern "C" ', "")
        if emulate:
            body = _LAUNCH.sub(r"\1emu_launch(\3, \4, [&] { \2(\5); });", body)
        parts.append(f"namespace program_{name} {{\n{body}\n}}  // namespace program_{name}")
    calls = "\n".join(f'    if (!strcmp(argv[1], "{name}")) return program_{name}::main(argc - 1, argv + 1);'
                      for name in sources)
    parts.append(f"int main(int argc, char** argv) {{\n    if (argc < 2) return 2;\n{calls}\n"
                 '    fprintf(stderr, "unknown program %s\\n", argv[1]);\n    return 2;\n}')
    return "\n".join(parts)


@pytest.fixture(scope="module")
def exports():
    return {name: _export(cell, passes, layout) for name, (cell, passes, layout) in VARIANTS.items()}


def test_every_exported_program_computes_the_cell_on_a_cpu_emulator(exports, tmp_path):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not on PATH (needed to build the exported programs against the CPU emulator)")
    source = tmp_path / "programs.cpp"
    source.write_text(combined_program({name: src for name, (_, src) in exports.items()}, emulate=True))
    binary = tmp_path / "programs"
    build = subprocess.run([compiler, "-std=c++17", "-O0", "-w", f"-I{EMULATION}", "-o", str(binary), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    failures = []
    for name, (plan, _) in exports.items():
        network = plan.network
        params = engine.init_params(network, seed=7)
        rng = np.random.default_rng(11)
        x = rng.standard_normal((T, B, network.input_size))
        states = {s: rng.uniform(-0.8, 0.8, (network.num_layers, B, network.hidden_size))
                  for s in network.cell.state_names}
        work = tmp_path / name
        paths = write_run_files(work, plan.program, network, params, x, states)
        run = subprocess.run([str(binary), name, str(paths["weights"]), str(paths["x"]), str(T), str(B),
                              str(work / "out.bin"), str(paths["states"])], capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            failures.append(f"{name}: exit {run.returncode}: {run.stderr}")
            continue
        outputs, final = read_outputs(work / "out.bin", plan.program, network, T, B)
        ref = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
        got = np.concatenate([outputs.ravel()] + [final[s].ravel() for s in sorted(final)])
        want = np.concatenate([ref.outputs.ravel()] + [ref.final_states[s].ravel() for s in sorted(final)])
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        if not rel <= 1e-5:
            failures.append(f"{name}: relative error {rel:.3g}")
    assert not failures, "\n".join(failures)


def test_the_emulated_program_rejects_wrong_files(exports, tmp_path):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not on PATH")
    plan, src = exports["lstm"]
    source = tmp_path / "lstm.cpp"
    source.write_text(_LAUNCH.sub(r"\1emu_launch(\3, \4, [&] { \2(\5); });", src))
    binary = tmp_path / "lstm"
    subprocess.run([compiler, "-std=c++17", "-O0", "-w", f"-I{EMULATION}", "-o", str(binary), str(source)],
                   check=True, timeout=300)
    params = engine.init_params(plan.network)
    x = np.zeros((T, B, SIZES["input_size"]))
    paths = write_run_files(tmp_path, plan.program, plan.network, params, x)
    run = subprocess.run([str(binary), str(paths["weights"]), str(paths["x"]), str(T + 1), str(B), "out.bin"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 1 and "x.bin has" in run.stderr and "expected" in run.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True)
    assert run.returncode == 2 and "usage" in run.stderr


# ---- the real toolchain -------------------------------------------------------------------------------

@pytest.mark.nvcc
def test_every_exported_program_compiles_with_nvcc(exports, tmp_path, nvcc_include_flags):
    include = nvcc_include_flags
    sources = {name: src for name, (_, src) in exports.items()}
    combined = tmp_path / "programs.cu"
    combined.write_text(combined_program(sources, emulate=False))
    # One export as written (no namespace wrapping), and all of them in one translation unit.
    single = tmp_path / "lstm_rnn.cu"
    single.write_text(sources["lstm"])
    # The combined unit stops at PTX (-arch=compute_90): ptxas is what takes time, and
    # test_codegen.py already takes every kernel through it.
    commands = [["nvcc", "-std=c++17", "-arch=compute_90", "-Werror", "all-warnings", *include, "-c", str(combined),
                 "-o", str(combined.with_suffix(".o"))],
                ["nvcc", "-O2", "-std=c++17", "-arch=sm_90", "-Werror", "all-warnings", *include, "-c", str(single),
                 "-o", str(single.with_suffix(".o"))]]
    jobs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for cmd in commands]
    for job, path in zip(jobs, (combined, single)):
        output, _ = job.communicate(timeout=600)
        assert job.returncode == 0, f"nvcc failed on {path.name}:\n{output[-4000:]}"
