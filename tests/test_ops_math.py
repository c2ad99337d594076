"""The ops of cells after 2017 (issue #33): exp, log, div, max, min, abs, sqrt, rsqrt, softplus, log_sigmoid, silu,
gelu. Each is checked where it is defined once (engine/ops.py) and where the table carries it: its NumPy meaning
against closed forms and at the extremes where a naive formula overflows, its gradient rule against central
differences (op by op, and through a whole cell by bptt), its torch spelling against the meaning, the DSL's
operators (/ and abs()), the equations, the DSL round trip, and the generated CUDA through nvcc.
The GPU kernels are held to the same meanings in tests/gpu/test_ops_math_gpu.py."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from test_autodiff import check_by_finite_differences, make_case
from test_dsl_emit import canonical, rebuild

import engine
from engine import dsl
from engine.codegen.equations import text_equations
from engine.dsl import W, b, cell, exp, gelu, log, log_sigmoid, rsqrt, silu, softplus, sqrt, tanh
from engine.dsl_emit import emit_dsl
from engine.export import write_export
from engine.ops import GRAD_OPS, OPS, apply_backward, apply_elementwise

NEW_OPS = ("exp", "log", "div", "max", "min", "abs", "sqrt", "rsqrt", "softplus", "log_sigmoid", "silu", "gelu")


def operands(op: str, rng, n: int = 64) -> list[np.ndarray]:
    """Random operands inside the op's domain (engine.ops OpDef.domain), away from kinks and poles."""
    spec = OPS[op]
    values = [rng.uniform(-3.0, 3.0, n) for _ in spec.ports]
    if spec.domain == "positive":
        values = [np.abs(v) + 0.2 for v in values]
    if spec.domain == "nonzero_b":
        values[1] = np.where(values[1] < 0, -1.0, 1.0) * (np.abs(values[1]) + 0.5)
    if op in ("max", "min"):
        values[1] = values[0] + np.where(rng.random(n) < 0.5, -1.0, 1.0) * rng.uniform(0.1, 1.0, n)
    if op == "abs":
        values[0] = np.sign(values[0]) * (np.abs(values[0]) + 0.1)
    return values


def test_every_new_op_is_in_the_table_with_all_its_forms():
    for name in NEW_OPS:
        spec = OPS[name]
        assert spec.numpy and spec.cuda and spec.latex and spec.torch and spec.description, name
        assert len(spec.vjp) == spec.arity, name
        assert spec.dsl_function == name and hasattr(dsl, name), name
        for rule in spec.vjp:
            assert rule.op in GRAD_OPS or rule.op in OPS, (name, rule)


@pytest.mark.parametrize("op", NEW_OPS)
def test_the_gradient_rule_matches_central_differences(op):
    """Each port's vector-Jacobian product (as the backward step applies it) against central differences of the
    NumPy meaning, in float64."""
    rng = np.random.default_rng(NEW_OPS.index(op))
    spec = OPS[op]
    args = operands(op, rng)
    y = apply_elementwise(op, args, {})
    dy = rng.standard_normal(y.shape)
    frame = {"dy": dy, "y": y, **dict(zip(spec.ports, args))}
    eps = 1e-6
    for k, rule in enumerate(spec.vjp):
        analytic = apply_backward(rule.op, [frame[a] for a in rule.args], {})
        up = [a + eps if i == k else a for i, a in enumerate(args)]
        down = [a - eps if i == k else a for i, a in enumerate(args)]
        numeric = dy * (apply_elementwise(op, up, {}) - apply_elementwise(op, down, {})) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8, err_msg=f"{op}, port {spec.ports[k]}")


def test_closed_forms_and_no_overflow_at_the_extremes():
    x = np.array([-1000.0, -40.0, -1.0, 0.0, 1.0, 40.0, 1000.0])
    with np.errstate(over="ignore"):
        sigmoid = 1.0 / (1.0 + np.exp(-x))
    np.testing.assert_allclose(OPS["softplus"].numpy(x[1:-1]), np.log1p(np.exp(x[1:-1])), rtol=1e-15)
    assert OPS["softplus"].numpy(np.array([1000.0]))[0] == 1000.0 and OPS["softplus"].numpy(np.array([-1000.0]))[0] == 0
    np.testing.assert_allclose(OPS["log_sigmoid"].numpy(x[1:-1]), np.log(sigmoid[1:-1]), rtol=1e-14, atol=1e-16)
    assert OPS["log_sigmoid"].numpy(np.array([-1000.0]))[0] == -1000.0
    with np.errstate(over="ignore"):
        silu = OPS["silu"].numpy(x)
    assert np.all(np.isfinite(silu)) and silu[0] == 0.0 and silu[-1] == 1000.0
    c = np.sqrt(2 / np.pi)
    np.testing.assert_allclose(OPS["gelu"].numpy(x), 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x ** 3))), rtol=1e-15)
    np.testing.assert_allclose(OPS["rsqrt"].numpy(np.array([4.0, 0.25])), [0.5, 2.0])
    assert np.isnan(OPS["max"].numpy(np.array([np.nan]), np.array([1.0]))[0])       # a NaN is kept, not dropped
    assert np.isnan(OPS["min"].numpy(np.array([1.0]), np.array([np.nan]))[0])


def test_max_and_min_split_the_gradient_evenly_at_a_tie():
    a, dy = np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0])
    other = np.array([0.0, 2.0, 4.0])
    assert list(apply_backward("max_grad", [dy, a, other], {})) == [1.0, 0.5, 0.0]
    assert list(apply_backward("max_grad", [dy, other, a], {})) == [0.0, 0.5, 1.0]
    assert list(apply_backward("min_grad", [dy, a, other], {})) == [0.0, 0.5, 1.0]
    assert list(apply_backward("abs_grad", [dy, np.array([-2.0, 0.0, 2.0])], {})) == [-1.0, 0.0, 1.0]


def test_the_torch_spelling_is_the_same_function():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch spelling is checked with it)")
    import torch.nn.functional as F  # noqa: N812 -- the name the torch spellings use
    rng = np.random.default_rng(7)
    for name in NEW_OPS:
        spec = OPS[name]
        args = operands(name, rng)
        tensors = {port: torch.from_numpy(a) for port, a in zip(spec.ports, args)}
        got = eval(spec.torch.format(**spec_ports(spec)), {"torch": torch, "F": F}, tensors).numpy()  # noqa: S307
        np.testing.assert_allclose(got, spec.numpy(*args), rtol=1e-12, atol=1e-14, err_msg=name)


def spec_ports(spec) -> dict[str, str]:
    return {port: port for port in spec.ports}


@cell
def every_new_op(x, h, c):
    """Every new op once, with operands kept inside their domains so that random parameters give finite values."""
    a = W("W_a") @ x + W("U_a") @ h + b("b_a")
    g = W("W_g") @ x + W("U_g") @ h + b("b_g")
    ratio = dsl.max(a, h) / (1 + abs(dsl.min(g, c)))
    scale = rsqrt(1 + exp(-abs(g))) * sqrt(abs(a) + 0.1)
    c_next = silu(ratio) * scale + log(1 + abs(c)) - log_sigmoid(g)
    h_next = tanh(gelu(c_next) + softplus(-c_next))
    return {"h": h_next, "c": c_next}


def test_a_cell_of_every_new_op_runs_in_the_reference_as_written():
    network = engine.Network(every_new_op, 3, 4, 1)
    params = engine.init_params(network, seed=2)
    x = np.random.default_rng(3).standard_normal((4, 2, 3))
    run = engine.run(network, params, x, backend="reference", dtype=np.float64)
    p, h, c = params[0], np.zeros((2, 4)), np.zeros((2, 4))
    for t in range(4):
        a = x[t] @ p["W_a"].T + h @ p["U_a"].T + p["b_a"]
        g = x[t] @ p["W_g"].T + h @ p["U_g"].T + p["b_g"]
        ratio = np.maximum(a, h) / (1 + np.abs(np.minimum(g, c)))
        scale = 1 / np.sqrt(1 + np.exp(-np.abs(g))) * np.sqrt(np.abs(a) + 0.1)
        c = ratio / (1 + np.exp(-ratio)) * scale + np.log(1 + np.abs(c)) - np.log(1 / (1 + np.exp(-g)))
        gelu_c = 0.5 * c * (1 + np.tanh(np.sqrt(2 / np.pi) * (c + 0.044715 * c ** 3)))
        h = np.tanh(gelu_c + np.log1p(np.exp(-c)))
        np.testing.assert_allclose(run.outputs[t], h, rtol=1e-12, atol=1e-12)
    assert np.all(np.isfinite(run.final_states["c"]))


def test_bptt_through_every_new_op_matches_finite_differences():
    assert check_by_finite_differences(make_case(every_new_op, input_size=3, hidden_size=3, steps=3, seed=5)) > 60


def test_the_dsl_operators_build_div_and_abs_and_round_trip():
    @cell
    def ops_by_operator(x, h):
        a = W("W") @ x
        return {"h": a / (1 + abs(h)) - 2 / (3 + a * a)}
    nodes = {n.op for n in ops_by_operator.nodes}
    assert {"div", "abs"} <= nodes
    source = emit_dsl(ops_by_operator)
    assert "a / (const(1.0) + abs(h)) - const(2.0) / (const(3.0) + a * a)" in source, source
    assert canonical(rebuild(source)) == canonical(ops_by_operator)


def test_the_equations_write_division_as_a_fraction_and_parenthesise_its_right_operand_in_text():
    @cell
    def fractions(x, h):
        return {"h": h / (h * (W("W") @ x)) + dsl.max(h, exp(h))}
    latex = engine.to_latex(fractions)
    assert r"\frac{h_{t-1}}{h_{t-1} \odot W\,x_t}" in latex and r"\max(h_{t-1}, \exp(h_{t-1}))" in latex
    text = "\n".join(text_equations(fractions))
    assert "h[t-1] / (h[t-1] * W x[t])" in text


@pytest.mark.nvcc
def test_the_exported_program_of_every_new_op_compiles(tmp_path, nvcc_include_flags):
    """The fused step kernels with the new ops' CUDA forms and helpers, through nvcc with every warning an
    error (the float32 program; the float64 forms are the naive backend's, compiled in tests/gpu/test_naive.py)."""
    source = write_export(tmp_path, every_new_op, 3, 8, 2)
    text = source.read_text()
    assert all(helper in text for helper in ("softplusf_(", "siluf_(", "geluf_(", "maxf_(", "rsqrtf("))
    done = subprocess.run([shutil.which("nvcc"), "-O2", "-std=c++17", "-arch=sm_90", "-Werror", "all-warnings",
                           *nvcc_include_flags, "-c", str(source), "-o", str(tmp_path / "program.o")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@cell
def overflowing(x, h):
    """exp of a growing state: finite for the first steps, Inf in float32 once its exponent passes 88.7."""
    a = W("W") @ x
    grown = h + 30.0 + 0 * a
    return {"h": exp(grown) / exp(grown) * grown}


@pytest.mark.parametrize("body, op, kind", [
    (lambda x, h: sqrt(W("W") @ x - 100.0), "sqrt", "NaN"),
    (lambda x, h: (W("W") @ x) / (h - h), "div", "Inf"),
    (lambda x, h: log(abs(W("W") @ x) * 0 + h * h), "log", "Inf"),
], ids=["sqrt-negative", "divide-by-zero", "log-zero"])
def test_check_finite_names_the_node_that_made_the_first_nan_or_inf(body, op, kind):
    graph = cell(lambda x, h: {"h": body(x, h)}, name="broken")
    network = engine.Network(graph, 3, 4, 2)
    params = engine.init_params(network, seed=0)
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    with np.errstate(all="ignore"):
        quiet = engine.run(network, params, x, backend="reference", dtype=np.float32)     # off: no check, no error
        assert not np.all(np.isfinite(quiet.outputs))
        error = call_error(lambda: engine.run(network, params, x, backend="reference", dtype=np.float32,
                                              check_finite=True))
    made = next(n.name for n in graph.nodes if n.op == op)
    assert f"node '{made}' ({op}) made the first {kind} of the run at layer 0, step 0" in error, error
    assert "hint:" in error


def test_check_finite_reports_the_node_without_numpys_warnings(recwarn):
    """check_finite names the node itself, so NumPy's RuntimeWarnings about the same values are not printed first."""
    graph = cell(lambda x, h: {"h": tanh(W("W") @ x + W("R") @ h) + log(h * 0)}, name="log_of_zero")
    network = engine.Network(graph, 3, 4, 1)
    params = engine.init_params(network, seed=0)
    x = np.random.default_rng(0).standard_normal((4, 2, 3))
    error = call_error(lambda: engine.run(network, params, x, backend="reference", dtype=np.float32,
                                          check_finite=True))
    assert "(log) made the first" in error, error
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in recwarn]


def test_check_finite_finds_an_exp_overflow_at_the_step_where_float32_overflows():
    network = engine.Network(overflowing, 2, 3, 1)
    params = engine.init_params(network, seed=1)
    x = np.zeros((6, 1, 2))
    with np.errstate(all="ignore"):
        error = call_error(lambda: engine.run(network, params, x, backend="reference", dtype=np.float32,
                                              check_finite=True))
    # the exponent h + 30 is 30, 60, 90 at steps 0, 1, 2: exp(90) overflows float32 (past 88.7); float64 would not
    assert "(exp) made the first Inf of the run at layer 0, step 2" in error and "stabilizer" in error, error
    assert np.all(np.isfinite(engine.run(network, params, x, backend="reference", dtype=np.float64,
                                         check_finite=True).outputs))


def call_error(run) -> str:
    with pytest.raises(engine.EngineError) as info:
        run()
    return str(info.value)
