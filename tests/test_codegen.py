"""Generated CUDA: a golden snapshot, readability claims, caching, and nvcc compiling every preset.

Regenerate the snapshots after an intended change with UPDATE_GOLDEN=1 and review the diff.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from compiler_cells import CELLS
from nvcc_check import CHECK_ONLY

import engine
from engine.codegen import GENERATOR_VERSION, text_equations, with_source
from engine.compiler import compile_program
from engine.explain import explain_text

GOLDEN = Path(__file__).parent / "golden"
PRESETS = sorted(engine.presets())
ALL_CELLS = {**{name: engine.preset(name).cell for name in PRESETS}, **CELLS}
OP_FUNCTIONS = {"sigmoid": "sigmoidf_(", "tanh": "tanhf(", "relu": "fmaxf(", "hard_sigmoid": "hard_sigmoidf_("}


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing snapshot {path}; create it with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs from the generated text; review, then UPDATE_GOLDEN=1"


def test_lstm_kernels_match_the_golden_snapshot():
    _check_golden("lstm_kernels.cu", compile_program(engine.preset("lstm").cell).source)


def test_lstm_explain_matches_the_golden_snapshot():
    text = explain_text("lstm", input_size=32, hidden_size=64, num_layers=2, steps=8, batch=4, sources=False)
    _check_golden("lstm_explain.txt", text)


@pytest.mark.parametrize("name", sorted(ALL_CELLS))
def test_kernels_use_only_the_ops_present(name):
    program = compile_program(ALL_CELLS[name])
    for kernel in program.kernels:
        ops = {st.op for st in kernel.statements}
        body = kernel.source.split("{", 1)[1]
        for op, function in OP_FUNCTIONS.items():
            called = re.search(r"(?<!\w)" + re.escape(function), body) is not None   # not hard_sigmoidf_ for sigmoidf_
            assert called == (op in ops), f"{kernel.name}: {function} vs ops {sorted(ops)}"
        assert "switch" not in body and "if (" not in body


@pytest.mark.parametrize("name", sorted(ALL_CELLS))
def test_generated_code_is_one_statement_per_op_named_after_the_graph(name):
    program = compile_program(ALL_CELLS[name])
    for kernel in program.kernels:
        for st in kernel.statements:
            assert st.var == st.node or re.fullmatch(re.escape(st.node) + r"(_v)+", st.var), (st.var, st.node)
            assert len(re.findall(rf"const float {re.escape(st.var)} = ", kernel.source)) == 1


def test_clashing_names_are_renamed_only_where_they_clash():
    program = compile_program(CELLS["clashing_names"])
    (kernel,) = program.kernels
    variables = {st.node: st.var for st in kernel.statements}
    assert variables["float"] == "float_v" and variables["b"] == "b_v"
    assert variables["h_next"] == "h_next"
    assert "const float t_v = t_vector[j];" in kernel.source


def test_header_has_the_equations_and_the_step_order():
    program = compile_program(engine.preset("gru_cho").cell)
    for eq in text_equations(program.cell):
        assert f"//   {eq}" in program.source
    assert "h_gemm (GEMM, stage 1)" in program.source and "gru_cho_stage2 (kernel, stage 2)" in program.source
    assert f"generator version {GENERATOR_VERSION}" in program.source


def test_helpers_come_from_the_kernels_directory():
    program = compile_program(engine.preset("lstm").cell)
    helper = (Path(__file__).parents[1] / "kernels" / "cell_ops.cuh").read_text()
    assert helper.strip() in program.source


def test_render_cache_returns_the_same_source():
    program = compile_program(engine.preset("mgu").cell)
    assert with_source(program).source is with_source(program).source


def test_engine_imports_without_cupy():
    code = ("import sys, engine, engine.backends.fused, engine.backends.plan_numpy, engine.codegen, "
            "engine.export, engine.explain\nassert 'cupy' not in sys.modules, 'cupy imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def _combined(programs) -> str:
    return "\n".join(p.source for p in programs)


@pytest.mark.nvcc
def test_every_generated_module_compiles_with_nvcc(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    variants = {
        "default": [compile_program(c) for c in ALL_CELLS.values()],
        "interleaved": [compile_program(c, layout="interleaved") for c in ALL_CELLS.values()],
        # One kernel per op makes hundreds of kernels; the unusual cells and three presets cover its cases.
        "unfused": [compile_program(ALL_CELLS[name], {"fuse_elementwise": False, "group_gemms": False,
                                                      "hoist_inputs": False, "fold_constants": False})
                    for name in [*CELLS, "lstm", "gru_cho", "indrnn"]],
    }
    jobs = {}
    for name, programs in variants.items():
        source = tmp_path / f"{name}.cu"
        source.write_text(_combined(programs))
        # The default kernels go all the way to machine code; the variants stop at PTX (ptxas costs
        # ~60 ms a kernel, and C++ errors surface before it).
        target = ["--cubin", "-o", str(tmp_path / f"{name}.cubin")] if name == "default" else [
            "--ptx", "-o", str(tmp_path / f"{name}.ptx")]
        cmd = ["nvcc", "-arch=sm_90", *CHECK_ONLY, *target, "-Werror", "all-warnings", str(source)]
        jobs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, job in jobs.items():
        output, _ = job.communicate(timeout=300)
        assert job.returncode == 0, f"nvcc failed on the {name} kernels:\n{output[-4000:]}"


def test_both_equation_renderers_parenthesise_by_one_rule():
    """A negation under a matmul, a sum under one_minus, a difference subtracted: the plain text and the LaTeX
    put the same parentheses (engine.ops.needs_parens), so neither reads as another formula."""
    from engine.codegen.equations import text_equations
    from engine.dsl import W, cell, tanh

    @cell
    def signs(x, h):
        u = tanh(W("U") @ (-h) + (1 - (W("A") @ x + h)) - (h - W("B") @ x))
        return {"h": u}

    text = "\n".join(text_equations(signs))
    latex = engine.to_latex(signs)
    assert "U (-h[t-1])" in text and r"U\,\left(-h_{t-1}\right)" in latex
    assert "1 - (A x[t] + h[t-1])" in text and r"1 - \left(A\,x_t + h_{t-1}\right)" in latex
    assert "- (h[t-1] - B x[t])" in text and r"- \left(h_{t-1} - B\,x_t\right)" in latex
