"""The scan schedule's analysis (engine/passes/scan.py) and its executor on NumPy (engine/schedules/scan.py): which
cells are a linear recurrence, which node stops the others and why, and the executor against the reference. The CUDA
scan is held to the reference in tests/gpu/test_scan_gpu.py."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import engine
from engine.backends.naive import preamble
from engine.dsl import W, b, cell, sigmoid, tanh, v
from engine.errors import BackendError
from engine.passes.scan import analyse_scan
from engine.schedules.scan import KERNEL, run_arrays
from engine.schedules.scan_backward_kernel import backward_source, walk_back_source
from engine.schedules.scan_grad import scan_gradients
from engine.schedules.scan_kernel import CARRY, Layout, free_kernel, fused_scan_source, unroll_defines
from engine.schedules.scan_values import grouped_matmuls


@cell
def diagonal_linear(x, h):
    """A diagonal linear RNN: h[t] = lam * h[t-1] + B x[t] + b."""
    return {"h": v("lam") * h + W("B") @ x + b("b")}


@cell
def decaying(x, h):
    """a = 0.5 * sigmoid(...) through a scale and a subtraction: h - 0.5 * g * h + ..."""
    g = sigmoid(W("W_g") @ x)
    return {"h": h - 0.5 * (g * h) + (-tanh(W("W_u") @ x))}


@cell
def coupled(x, h, c):
    return {"h": 0.5 * c + W("W") @ x, "c": 0.5 * h}


@cell
def quadratic(x, h):
    return {"h": h * h + W("W") @ x}


@cell
def divided(x, h):
    return {"h": (W("W") @ x) / (h + 2.0)}


QUALIFYING = {"mingru", "minlstm", "qrnn_f"}


def test_exactly_the_linear_recurrences_among_the_presets_qualify():
    found = {name for name in engine.presets() if analyse_scan(engine.preset(name).cell).qualifies}
    assert found == QUALIFYING


@pytest.mark.parametrize("graph, node, words", [
    (engine.preset("lstm").cell, "W_hi_h", "by the matrix 'W_hi': a matrix mixes the hidden units"),
    (engine.preset("indrnn").cell, "h_next", "applies relu to a value that depends on state 'h'"),
    (coupled, "h_next", "depends on state 'c': the states are coupled"),
    (quadratic, "h_next_mul", "multiplies two values that depend on state 'h'"),
    (divided, "h_next", "divides by a value that depends on state 'h'"),
], ids=["lstm", "indrnn", "coupled", "quadratic", "divided"])
def test_the_node_that_stops_the_scan_is_named_with_the_reason(graph, node, words):
    found = analyse_scan(graph)
    assert not found.qualifies and found.node == node and words in found.reason, found.reason
    assert f"node '{node}'" in found.describe()


def test_the_coefficients_are_the_cells_own_values():
    found = analyse_scan(engine.preset("mingru").cell)
    h = found.scanned["h"]
    assert (h.a.text, h.b.text) == ("h_next_one_minus", "h_next_mul")
    qrnn = analyse_scan(engine.preset("qrnn_f").cell)
    assert set(qrnn.scanned) == {"c"} and qrnn.after == ("h",) and qrnn.scanned["c"].a.text == "f"
    diag = analyse_scan(diagonal_linear).scanned["h"]
    assert diag.a.text == "lam" and diag.b.text == "B_x + b"
    assert analyse_scan(decaying).scanned["h"].a.text == "1 - 0.5 * g"


CASES = [engine.preset(name).cell for name in sorted(QUALIFYING)] + [diagonal_linear, decaying]


@pytest.mark.parametrize("graph", CASES, ids=[c.name for c in CASES])
def test_the_executor_on_numpy_equals_the_reference(graph):
    network = engine.Network(graph, 3, 5, 3)
    params = engine.init_params(network, seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((37, 4, 3))
    initial = {s: rng.standard_normal((3, 4, 5)) for s in graph.state_names}
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64)
    got = run_arrays(network, params, x, initial, np.float64, np)
    np.testing.assert_allclose(got.outputs, want.outputs, rtol=1e-13, atol=1e-13)
    for s in graph.state_names:
        np.testing.assert_allclose(got.final_states[s], want.final_states[s], rtol=1e-13, atol=1e-13)
    # and with the chunked order of the CUDA scan (maps per chunk, carried, replayed), written here in NumPy
    chunked = run_arrays(network, params, x, initial, np.float64, np, scan=chunked_scan)
    np.testing.assert_allclose(chunked.outputs, want.outputs, rtol=1e-12, atol=1e-12)


def chunked_scan(a, b, initial, xp, chunk=8):
    """kernels/scan.cu's three passes, in NumPy: the order of its products and sums, for the CPU test."""
    T = b.shape[0]
    starts = range(0, T, chunk)
    maps = []
    for t0 in starts:
        pa, pb = np.ones_like(initial), np.zeros_like(initial)
        for t in range(t0, min(t0 + chunk, T)):
            pb = a[t] * pb + b[t]
            pa = pa * a[t]
        maps.append((pa, pb))
    out, s = np.empty_like(b), initial
    for t0, (pa, pb) in zip(starts, maps):
        entering, s = s, pa * s + pb
        for t in range(t0, min(t0 + chunk, T)):
            entering = a[t] * entering + b[t]
            out[t] = entering
    return out


def test_a_cell_that_does_not_qualify_is_refused_naming_the_node():
    network = engine.Network(engine.preset("gru").cell, 3, 4, 1)
    with pytest.raises(BackendError, match=r"schedule 'scan' cannot run cell 'gru': node 'W_hr_h'.*hint:"):
        run_arrays(network, engine.init_params(network), np.zeros((2, 1, 3)), None, np.float64, np)


def test_explain_says_whether_and_why():
    data = engine.explain_json("qrnn_f", 3, 4, 1, 5, 2)["scan"]
    assert data["qualifies"] and data["states"] == {"c": {"a": "f", "b": "c_next_mul"}} and data["after"] == ["h"]
    text = engine.explain_text("lstm", 3, 4, 1, 5, 2, sources=False)
    assert "scan: no: node 'W_hi_h' multiplies state 'h' by the matrix 'W_hi'" in text
    assert "precision modes: the scan's matmuls" not in text
    assert "precision modes: the scan's matmuls take any" in engine.explain_text("mingru", 3, 4, 1, 5, 2, sources=False)


def test_backend_scan_needs_a_gpu_and_says_so(monkeypatch):
    from engine import backends
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no GPU here"))
    network = engine.Network(engine.preset("mingru").cell, 3, 4, 1)
    with pytest.raises(BackendError, match="backend 'scan' needs a GPU: no GPU here"):
        engine.run(network, engine.init_params(network), np.zeros((2, 1, 3)), backend="scan")


def test_engine_run_names_a_bad_argument_before_saying_the_gpu_is_missing(monkeypatch):
    """The arguments first, then whether this machine can run them: a dtype, check_finite or opt-in that is wrong is
    named even where the backend asked for needs a GPU the machine lacks."""
    from engine import backends
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no GPU here"))
    network = engine.Network(engine.preset("lstm").cell, 3, 4, 1)
    params, x = engine.init_params(network), np.zeros((2, 1, 3))
    for options, named in (({"dtype": "int8"}, "dtype"), ({"check_finite": "yes"}, "check_finite"),
                           ({"allow_tensor_core_fp32": True}, "allow_tensor_core_fp32")):
        with pytest.raises(BackendError, match=named):
            engine.run(network, params, x, backend="fused", **options)
    with pytest.raises(BackendError, match="backend 'fused' needs a GPU: no GPU here"):
        engine.run(network, params, x, backend="fused")


@pytest.mark.parametrize("graph", CASES, ids=[c.name for c in CASES])
def test_the_executor_with_every_matmul_grouped_equals_the_op_by_op_run(graph):
    """run_arrays stacks the weights that multiply the same value into one GEMM; the NumPy run checks its slicing."""
    network = engine.Network(graph, 3, 5, 1)
    params = engine.init_params(network, seed=4)
    x = np.random.default_rng(5).standard_normal((6 * 2, 3))
    found = analyse_scan(graph)
    env = {n.name: x for n in graph.nodes if n.op == "input"}
    grouped_matmuls(graph, found.free, env, params[0], np)
    for node in graph.nodes:
        if node.op == "matmul" and node.name in found.free:
            np.testing.assert_allclose(env[node.name], x @ params[0][node.args[0]].T, rtol=1e-14)


@pytest.mark.nvcc
def test_the_generated_state_free_kernels_compile(tmp_path):
    """engine/schedules/scan_kernel.py's ElementwiseKernel bodies of every case, float32 and float64, each wrapped in
    a __global__ function as CuPy wraps it, through nvcc in one translation unit with every warning an error."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the generated kernels are not compile-checked here")
    source, fused_sources = [preamble()], []
    for graph in CASES:
        found = analyse_scan(graph)
        for dtype, c_type in ((np.float32, "float"), (np.float64, "double")):
            spec = free_kernel(graph, found, (), dtype)
            assert spec.outputs == tuple(f"{part}:{s}" for s in found.scanned for part in "ab")
            ins = [p.split()[1] for p in spec.in_params.split(", ") if p]
            outs = [p.split()[1] for p in spec.out_params.split(", ")]
            params = ", ".join([f"const {c_type}* p_{n}" for n in ins] + [f"{c_type}* p_{n}" for n in outs])
            loads = "".join(f"const {c_type} {n} = p_{n}[i]; " for n in ins) + "".join(f"{c_type} {n}; " for n in outs)
            stores = "".join(f"p_{n}[i] = {n}; " for n in outs)
            source.append(f'extern "C" __global__ void {graph.name}_{c_type}({params}) {{ const int i = threadIdx.x; '
                          f"{loads}\n{spec.operation}\n{stores}}}")
            if len(found.scanned) == 1 and not found.after:          # the scan that forms a and b itself
                layouts = tuple(Layout("vector") if graph[n].is_param else Layout("rows", 10, 2) for n in spec.inputs)
                (state,) = found.scanned                # the forward's kernels with the gradients' walk back
                fused = walk_back_source(graph, spec, state, layouts, np.dtype(dtype))
                assert fused.startswith(fused_scan_source(spec, layouts, dtype))
                own = re.sub(r"\b(Raw|Vec|DVec|load_raw|load_vec|form|coefficients|backward_step|"
                             r"scan_(?:chunks|carry|apply|walk|walk_back))\b", rf"{graph.name}_{c_type}_\1", fused)
                fused_sources.append(re.sub(r"#define (SCAN_T|SCAN_U1|SCAN_U3|WALK_WARPS|WALK_U|BACK_WARPS|BACK_U)\b",
                                            r"#undef \1\n#define \1", own))
                backward = backward_source(graph, spec, state, layouts, np.dtype(dtype))
                fused_sources.append(backward.replace("scan_free_backward", f"{graph.name}_{c_type}_backward"))
    assert len(fused_sources) == 16         # mingru, minlstm, diagonal_linear, decaying; float32 and float64
    from engine.schedules.scan_grad import BATCH_SUMS
    fused_sources += [BATCH_SUMS.format(t=t) for t in ("float", "double")]     # the walks' bias sums
    for c_type in ("float", "double"):          # and the plain scan's kernels (CudaScan), as it composes them
        plain = (f"#undef SCAN_T\n#define SCAN_T {c_type}\n#undef SCAN_U1\n#undef SCAN_U3\n" + unroll_defines(c_type)
                 + CARRY.read_text() + KERNEL.read_text())
        fused_sources.append(plain.replace('void scan_', f'void plain_{c_type}_scan_'))
    path = tmp_path / "free.cu"
    path.write_text("\n".join(source + [f.replace(preamble(), "") for f in fused_sources]))
    done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-Werror", "all-warnings", "-c", str(path), "-o",
                           str(tmp_path / "free.o")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_walks_host_helpers_on_numpy():
    """scan_values.as_dtype gives the array itself where its dtype is already the one asked for, a converted copy otherwise;
    scan_values.stack_rows is np.concatenate by rows; scan_grad.batch_sums sums (rows, B x n) over B. Their CuPy branches
    run in tests/gpu/test_scan_gpu.py (every walk's gradients)."""
    from engine.schedules.scan_grad import batch_sums
    from engine.schedules.scan_values import as_dtype, stack_rows
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert as_dtype(a, np.float32, np) is a
    converted = as_dtype(a, np.float64, np)
    assert converted.dtype == np.float64 and np.array_equal(converted, a)
    assert np.array_equal(stack_rows([a, a[:1] * 2], np), np.concatenate([a, a[:1] * 2]))
    q = np.random.default_rng(0).standard_normal((2, 3 * 5))
    assert np.allclose(batch_sums(q, 3, 5, np), q.reshape(2, 3, 5).sum(axis=1))


@pytest.mark.parametrize("graph", CASES, ids=[c.name for c in CASES])
def test_the_gradients_as_scans_equal_bptt(graph):
    """engine/schedules/scan_grad.py (a reverse scan, then the state-free part over all steps at once) against the
    step-by-step engine.bptt: every parameter, the input and the initial states, three layers."""
    network = engine.Network(graph, 3, 5, 3)
    params = engine.init_params(network, seed=6)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((23, 4, 3))
    initial = {s: rng.standard_normal((3, 4, 5)) for s in graph.state_names}
    d_out = rng.standard_normal((23, 4, 5))
    d_final = {s: rng.standard_normal((3, 4, 5)) for s in graph.state_names}
    want = engine.bptt(network, params, x, initial, d_outputs=d_out, d_final_states=d_final)
    got = scan_gradients(network, params, x, initial, d_out, d_final)
    np.testing.assert_allclose(got.outputs, want.outputs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.x, want.x, rtol=1e-10, atol=1e-12)
    for s in graph.state_names:
        np.testing.assert_allclose(got.initial_states[s], want.initial_states[s], rtol=1e-10, atol=1e-12, err_msg=s)
        np.testing.assert_allclose(got.final_states[s], want.final_states[s], rtol=1e-12, atol=1e-12, err_msg=s)
    for layer in range(3):
        for name, value in want.params[layer].items():
            np.testing.assert_allclose(got.params[layer][name], value, rtol=1e-10, atol=1e-12,
                                       err_msg=f"layer {layer} '{name}'")


def test_coefficients_that_would_grow_without_bound_stop_the_analysis_at_once():
    """A state read twice at each of 40 levels is linear, but its coefficients would have 2^40 terms: refused, naming
    the node, in well under a second."""
    import time

    @cell
    def doubling(x, h):
        value = h
        for _ in range(40):
            value = 0.5 * value + 0.5 * value
        return {"h": value + W("W") @ x}
    start = time.perf_counter()
    found = analyse_scan(doubling)
    assert time.perf_counter() - start < 1.0
    assert not found.qualifies and "longer than 256 terms" in found.reason and found.node


def test_bptt_with_the_scan_needs_a_gpu_and_says_so(monkeypatch):
    from engine import backends
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no GPU here"))
    network = engine.Network(engine.preset("mingru").cell, 3, 4, 1)
    with pytest.raises(BackendError, match=r"bptt\(backend='scan'\) needs a GPU: no GPU here"):
        engine.bptt(network, engine.init_params(network), np.zeros((2, 1, 3)), backend="scan")
    grads = engine.bptt(network, engine.init_params(network), np.ones((2, 1, 3)), d_outputs=np.ones((2, 1, 4)))
    assert grads.x.shape == (2, 1, 3)                         # the other backends as before


def test_the_walk_call_takes_the_cells_whose_layer_is_one_gemm_of_its_input_and_parameters():
    """scan.WalkCall issues a run as one cublasLt product and one scan_walk launch a layer: only for a float32 cell
    whose scan forms its coefficients itself from one GEMM of the layer input and parameters."""
    from engine.schedules.scan import WalkCall, scan_plan
    mingru = engine.preset("mingru").cell
    assert WalkCall.fits(mingru, scan_plan(mingru, np.float32, True, on_gpu=True), np.float32)
    assert not WalkCall.fits(mingru, scan_plan(mingru, np.float64, True, on_gpu=True), np.float64)
    assert not WalkCall.fits(mingru, scan_plan(mingru, np.float32, True, on_gpu=False), np.float32)   # NumPy: no
    qrnn = engine.preset("qrnn_f").cell                       # h = o * c after the scan: not formed inside it
    assert not WalkCall.fits(qrnn, scan_plan(qrnn, np.float32, True, on_gpu=True), np.float32)
    assert WalkCall.fits(diagonal_linear, scan_plan(diagonal_linear, np.float32, True, on_gpu=True), np.float32)
