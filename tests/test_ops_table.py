"""One entry of engine.ops reaches every room: a toy op `cube` (x^3, gradient 3 x^2), registered for the test's
duration, shows up in the DSL, the palette and the designer's activations, the equations (LaTeX and the CUDA
header's text), the generated CUDA, the torch spelling, the FLOP count, the NumPy reference and the gradient check.
A list of ops written out by hand anywhere on these paths makes one of these tests fail.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from test_autodiff import check_by_finite_differences, make_case

import engine
from app.designer import composites, palette
from engine import dsl, ops
from engine.bench.torch_cell import torch_source
from engine.codegen import text_equations
from engine.compiler import compile_program
from engine.dsl import W, b, tanh
from engine.dsl_emit import emit_dsl
from engine.flops import layer_step_flops
from engine.ops import GRAD_OPS, OPS, OpDef, Vjp

KERNELS = Path(__file__).resolve().parent.parent / "kernels"

CUBE = OpDef(
    "cube", ("x",), "elementwise", lambda x: x * x * x, "({x} * {x} * {x})", r"\left({x}\right)^3",
    description="x cubed (a toy op of tests/test_ops_table.py)", category="activation",
    vjp=(Vjp("cube_grad", ("dy", "x")),),
    grad_ops=(OpDef("cube_grad", ("dy", "x"), "elementwise", lambda dy, x: dy * (3.0 * x * x),
                    "({dy} * (3.0f * {x} * {x}))", r"3\,{dy} \odot {x}^2", description="dy * 3 x^2",
                    category="gradient"),),
    torch="({x} * {x} * {x})", flops=2)


@pytest.fixture
def cube():
    ops.register(CUBE)
    try:
        yield CUBE
    finally:
        ops.unregister("cube")


def cubic_cell():
    """A cell built with the DSL's cube function (it exists only while the op is registered)."""
    @dsl.cell
    def cubic(x, h):
        c = dsl.cube(W("W_c") @ x + W("U_c") @ h + b("b_c"))
        h_next = tanh(c) + 0.5 * h
        return {"h": h_next}
    return cubic


def test_the_dsl_has_a_function_for_it(cube):
    cell = cubic_cell()
    assert cell["c"].op == "cube"
    assert cell["c"].args == ("c_pre",)                    # an activation's operand is named <value>_pre
    source = emit_dsl(cell)
    assert "c = cube(" in source and "from engine.dsl import" in source and "cube" in source.split("\n")[1]


def test_the_palette_and_the_designer_offer_it(cube):
    spec = palette.SPECS["cube"]
    assert spec.inputs == ("x",) and spec.category == "ops" and spec.extra["op_category"] == "activation"
    assert spec.description == CUBE.description
    assert "cube" in palette.SPECS["gate"].option("activation").items
    nodes = composites.expand(composites.GATE, "g", {"x": "x", "h": "h"}, {"activation": "cube"})
    assert nodes[-1] == {"name": "g", "op": "cube", "args": ["g_pre"]}


def test_the_equations_write_it(cube):
    cell = cubic_cell()
    assert r"c &= \left(W_{c}\,x_t + U_{c}\,h_{t-1} + b_{c}\right)^3" in engine.to_latex(cell)
    assert "c = cube(W_c x[t] + U_c h[t-1] + b_c)" in text_equations(cell)

    @dsl.cell
    def inlined(x, h):
        h_next = tanh(W("W") @ x) + dsl.cube(h)            # the cube's value is auto-named h_next_cube: inlined
        return {"h": h_next}
    assert "h_next_cube" in inlined.by_name
    assert text_equations(inlined) == ["h[t] = tanh(W x[t]) + cube(h[t-1])"]
    assert engine.latex.equations(inlined) == [r"h_t &= \tanh(W\,x_t) + \left(h_{t-1}\right)^3"]


def test_the_generated_cuda_spells_it(cube):
    program = compile_program(cubic_cell())
    statements = [s for k in program.kernels for s in k.statements if s.op == "cube"]
    assert len(statements) == 1
    (var,) = statements[0].args
    assert f"const float c = {var} * {var} * {var};" in program.source
    assert "c = cube(" in program.source                   # the header comment's equation


def test_torch_and_the_flop_count_know_it(cube):
    cell = cubic_cell()
    assert re.search(r"c = \((\w+) \* \1 \* \1\)", torch_source(cell))
    counts = layer_step_flops(cell, input_size=3, hidden_size=4, batch=2)
    per_element = {"add": 1, "cube": CUBE.flops, "tanh": 1, "scale": 1}
    assert counts["elementwise"] == sum(per_element[n.op] for n in cell.nodes if n.op in per_element) * 4 * 2
    (kernel,) = [k for k in compile_program(cell).kernels if any(s.op == "cube" for s in k.statements)]
    assert kernel.flops_per_element == len(kernel.statements) - 1 + CUBE.flops


def test_the_reference_runs_it(cube):
    cell = cubic_cell()
    network = engine.Network(cell, input_size=3, hidden_size=4, num_layers=1)
    params = engine.init_params(network, seed=1)
    x = np.random.default_rng(2).standard_normal((3, 2, 3))
    run = engine.run(network, params, x, backend="reference", dtype=np.float64)
    p = params[0]
    h = np.zeros((2, 4))
    for t in range(3):
        c = (x[t] @ p["W_c"].T + h @ p["U_c"].T + p["b_c"]) ** 3
        h = np.tanh(c) + 0.5 * h
        np.testing.assert_allclose(run.outputs[t], h, rtol=1e-12, atol=1e-12)


def test_its_gradient_matches_finite_differences(cube):
    assert GRAD_OPS["cube_grad"] is CUBE.grad_ops[0]
    assert check_by_finite_differences(make_case(cubic_cell(), input_size=3, hidden_size=3, steps=3, seed=4)) > 30


def test_unregister_removes_it_everywhere():
    ops.register(CUBE)
    ops.unregister("cube")
    assert "cube" not in OPS and "cube_grad" not in GRAD_OPS
    assert not hasattr(dsl, "cube") and "cube" not in palette.SPECS and "cube" not in ops.activations()
    with pytest.raises(ValueError, match="taken"):
        ops.register(OpDef("tanh", ("x",), "elementwise", np.tanh, "tanhf({x})", r"\tanh({x})"))
    assert OPS["tanh"].torch == "torch.tanh({x})"


def test_every_cuda_helper_is_a_device_function_of_the_kernels():
    """The table names each .cuh helper its CUDA form calls; the helper is written in cell_ops.cuh (float) and
    naive_ops.cuh (double), and generated code keeps its name free."""
    helpers = ops.cuda_helpers()
    assert helpers >= {"sigmoidf_", "hard_sigmoidf_", "softplusf_", "maxf_", "silu_gradf_"}
    for op in [*OPS.values(), *GRAD_OPS.values()]:
        if op.cuda_helper:
            assert op.cuda_helper + "(" in op.cuda, op.name
    for name, precision in (("cell_ops.cuh", "float"), ("naive_ops.cuh", "double")):
        text = (KERNELS / name).read_text()
        for helper in helpers:
            assert re.search(rf"__device__ __forceinline__ {precision} {helper}\({precision} \w+(, {precision} \w+)?\)",
                             text), (name, helper)


def test_a_value_named_like_a_helper_is_renamed_in_the_kernel():
    @dsl.cell
    def clash(x, h):
        sigmoidf_ = dsl.sigmoid(W("W") @ x + W("U") @ h)
        return {"h": sigmoidf_ * h}
    program = compile_program(clash)
    assert "const float sigmoidf = sigmoidf_(" in program.source          # respelled: no trailing '_' (c_names)
