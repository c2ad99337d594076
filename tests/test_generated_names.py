"""Any valid node name compiles: generated identifiers come from engine/c_names.py, which keeps a graph name unless
it is a C, C++ or CUDA keyword, a macro of the headers the generated code sees (engine/c_reserved_names.txt, made from
nvcc by benchmarks/c_reserved_names.py), a name the generated code itself uses, or a spelling C++ reserves.

Fast: cells named after every reserved name render every artifact (the fused module, the persistent and graph
kernels, the training kernels, the exported program) with no identifier a generator derived from a name being a
reserved one, and unique; NVRTC's refusal is a CompileError naming the cell and kernel. With nvcc (marked): the
generated module and the exported program of such cells compile, and the toolchain defines no macro the list lacks.
tests/gpu/test_generated_names_gpu.py runs such a cell on the GPU against the reference."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from named_cells import SPELLINGS, named_cell, reserved_list
from test_export import combined_program

import engine
from engine.autodiff.fused_codegen import render_module as render_training
from engine.autodiff.fused_planner import training_plan
from engine.c_names import c_identifier, header_macros, kernel_prefix, reserved, reserved_names
from engine.codegen.wavefront import render_wavefront
from engine.compiler import make_plan
from engine.errors import CompileError
from engine.export import export_plan, render_program
from engine.schedules.tiling import H100, TileConfig, eligibility, make_tiling

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 220              # names a cell: validation's cycle check grows faster than linearly with a chain's length
SIZES = dict(input_size=5, hidden_size=6, num_layers=2)


def chunks() -> list[list[str]]:
    names = reserved_list()
    return [names[i:i + CHUNK] for i in range(0, len(names), CHUNK)]


def artifacts(cell, wavefront: bool = True) -> dict[str, str]:
    """Every CUDA source the engine generates for the cell."""
    sources = {"fused": engine.explain_json(cell, steps=3, batch=2, **SIZES)["source"],
               "export": render_program(export_plan(cell, **SIZES)),
               "training": render_training(training_plan(cell))}
    if wavefront:
        network = engine.Network(cell, **SIZES)
        plan = make_plan(network, 3, 2, layout="interleaved")
        assert eligibility(plan.program) is None
        for persistent in (True, False):
            tiling = make_tiling(plan.program, network, 2, TileConfig(), H100, persistent=persistent)
            sources["persistent" if persistent else "graph"] = render_wavefront(plan.program, network, tiling)
    return sources


def identifiers(source: str) -> set[str]:
    """The identifiers of C source, without comments, string literals and preprocessor lines."""
    source = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    source = re.sub(r'"(\\.|[^"\\])*"', " ", source)
    source = re.sub(r"^\s*#[^\n]*", " ", source, flags=re.M)
    return set(re.findall(r"\b[A-Za-z_]\w*\b", source))


@pytest.fixture(scope="module")
def ordinary():
    """The identifiers of the artifacts of an LSTM with ordinary names: those the generated code itself uses."""
    return {name: identifiers(src) for name, src in artifacts(engine.preset("lstm").cell).items()}


def test_reserved_names_cover_keywords_macros_and_spellings():
    for name in ("NULL", "INT_MAX", "EOF", "errno", "assert", "signed", "CUDART_VERSION", "M_PI", "stdin", "W_OK",
                 "int", "class", "threadIdx", "expf", "B", "smem", "rnn_bits16", "sigmoidf_"):
        assert reserved(name) and c_identifier(name) != name, name
    for name in SPELLINGS:
        spelled = c_identifier(name)
        assert spelled.isascii() and spelled.isidentifier() and "__" not in spelled and spelled[0] != "_", spelled
    for name in ("h", "c", "x", "i_pre", "W_ii", "h_gemm", "lstm_stage1", "c_next_mul_1"):
        assert not reserved(name) and c_identifier(name) == name
    assert c_identifier("h", taken={"h", "h_v"}) == "h_v_v"
    assert len(header_macros()) > 1000 and {"NULL", "EOF", "errno", "M_PI"} <= header_macros()


def test_kernel_prefixes_are_ascii_identifiers():
    assert kernel_prefix("lstm") == "lstm" and kernel_prefix("my cell") == "my_cell"
    for name in ("NULL", "__LINE__", "é", "1abc", "a-b", "  ", "main", "x__y", "_X", "π cell"):
        prefix = kernel_prefix(name)
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", prefix) and "__" not in prefix and not prefix.endswith("_"), \
            (name, prefix)


def test_a_reserved_node_name_compiles_into_a_respelled_one():
    """The defect's example: node NULL (and INT_MAX, __LINE__) became `const float (-1) = ...` and did not compile;
    __LINE__ made the namer loop forever."""
    cell = named_cell(["x", "h", "c", "W_ii", "b_ii", "W_hf", "b_hf", "NULL", "INT_MAX", "g", "o", "__LINE__",
                       "c_next", "h_next_tanh"], cell_name="lstm")
    source = engine.explain_json(cell, steps=3, batch=2, **SIZES)["source"]
    assert "const float NULL_v = sigmoidf_(LINE);" in source and "const float INT_MAX_v = " in source
    assert not {"NULL", "INT_MAX", "__LINE__"} & identifiers(source)


@pytest.mark.parametrize("index", range(len(chunks())))
def test_cells_named_after_every_reserved_name_render_with_fit_identifiers(index, ordinary):
    names = chunks()[index]
    cell = named_cell(names, cell_name=names[0])
    for what, source in artifacts(cell, wavefront=index == 0).items():
        found = identifiers(source)
        # a reserved identifier in the source is one the generated code itself uses, never one made from a name
        # (the training kernels prefix every name, v_<value>, param_<name>: no prefixed name is a keyword or macro,
        # and their locals may keep spellings such as a trailing '_' or a letter outside ASCII, which compile)
        spelling = what != "training"
        made = {n for n in found - ordinary[what] if n in reserved_names() or spelling and reserved(n) and "__" not in n}
        assert not made, (what, sorted(made)[:20])
        kernels = re.findall(r'__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(', source)
        assert len(kernels) == len(set(kernels)) and all(k.isascii() and "__" not in k for k in kernels
                                                         if what != "training"), (what, kernels)
        for body in re.findall(r"__global__.*?\n}\n", source, flags=re.S):       # each kernel: locals declared once
            local = re.findall(r"const float (\w+) = ", body)
            local = [n for n in local if n.startswith("v_")] if what == "training" else local
            assert len(local) == len(set(local)), (what, [n for n in local if local.count(n) > 1][:5])


def test_nvrtc_refusal_is_a_compile_error_naming_cell_and_kernel():
    from engine.codegen import nvrtc
    try:
        from cupy_backends.cuda.libs import nvrtc as library
        library.getVersion()
    except Exception as e:        # no CuPy, or no NVRTC library on this machine
        pytest.skip(f"NVRTC is not available here: {type(e).__name__}: {e}")
    source = engine.explain_json(engine.preset("lstm"), steps=3, batch=2, **SIZES)["source"]
    broken = source.replace("const float i = ", "const float NULL = ")
    with pytest.raises(nvrtc.NvrtcError) as refused:
        nvrtc.compile_cubin(broken, "90")
    error = nvrtc.compile_error(refused.value, broken, "90", "lstm", None)
    assert isinstance(error, CompileError)
    text = str(error)
    assert "cell 'lstm', kernel lstm_stage1," in text and "error" in text and "\n  hint: " in text, text


# ---- the real toolchain -------------------------------------------------------------------------------

@pytest.fixture
def toolchain(nvcc_include_flags):
    return nvcc_include_flags


@pytest.mark.nvcc
def test_the_toolchain_defines_no_macro_missing_from_the_list(toolchain):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "c_reserved_names.py"), "--check"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout}{done.stderr}\nrun benchmarks/c_reserved_names.py and commit the file"


@pytest.mark.nvcc
def test_cells_named_after_every_reserved_name_compile_with_nvcc(toolchain, tmp_path):
    """Two translation units: every chunk's fused module (as NVRTC sees it: no includes),
    and every chunk's exported program (its includes: stdio, cuda_runtime, cuBLAS), as tests/test_export.py joins
    them."""
    fused, programs = [], {}
    for index, names in enumerate(chunks()):
        cell = named_cell(names, cell_name=names[0])
        source = engine.explain_json(cell, steps=3, batch=2, **SIZES)["source"]
        fused.append(source)            # the cells' names differ, so do their kernels' (the helpers have guards)
        programs[f"chunk{index}"] = render_program(export_plan(cell, **SIZES))
    unit = tmp_path / "fused.cu"
    unit.write_text("\n".join(fused))
    program = tmp_path / "programs.cu"
    program.write_text(combined_program(programs, emulate=False))
    jobs = [(["-arch=compute_90", "-c", str(unit), "-o", str(unit.with_suffix(".o"))], "fused modules"),
            (["-arch=compute_90", *toolchain, "-c", str(program), "-o", str(program.with_suffix(".o"))],
             "exported programs")]
    running = [(subprocess.Popen(["nvcc", "-std=c++17", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True), what) for args, what in jobs]
    for job, what in running:
        output, _ = job.communicate(timeout=600)
        assert job.returncode == 0, f"nvcc failed on the {what}:\n{output[-4000:]}"


@pytest.mark.nvcc
def test_nvrtc_takes_the_training_and_graph_kernels_of_reserved_names():
    """NVRTC, unlike nvcc, refuses identifiers outside ASCII: the kernels that load through it (the training step's,
    the graph schedule's) of a cell with such names and reserved ones compile."""
    from engine.codegen import nvrtc
    try:
        from cupy_backends.cuda.libs import nvrtc as library
        library.getVersion()
    except Exception as e:        # no CuPy, or no NVRTC library on this machine
        pytest.skip(f"NVRTC is not available here: {type(e).__name__}: {e}")
    cell = named_cell(["errno", "NULL", "EOF", "INT_MAX", "M_PI", "assert", "signed", "min", "max", "B", "smem",
                       "threadIdx", "CUDART_VERSION", "main", *SPELLINGS], cell_name="π")
    sources = artifacts(cell)
    for what in ("training", "graph"):
        try:
            nvrtc.compile_cubin(sources[what], "90")
        except nvrtc.NvrtcError as e:
            pytest.fail(f"{what}: {nvrtc.compile_error(e, sources[what], '90', cell.name, None)}")
