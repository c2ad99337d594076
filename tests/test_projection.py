"""States of a size other than H (issue #9, expressivity): the LSTM with a recurrent projection, as
torch.nn.LSTM(proj_size=P) and cuDNN's projection compute it:

    c_t = f * c_{t-1} + i * g          (size H)
    h_t = W_hr (o * tanh(c_t))         (size P: W_hr is P x H; the gates read h through H x P weights)

A state says its size with dim "P" (DSL: @cell(state_dims={"h": "P"}); JSON: "attrs": {"dim": "P"}), weights and
vectors may have P rows or columns, and Network(proj_size=P) gives P (the hidden size when left out). The next layer
reads the projected output (size P). The reference runs it and matches torch.nn.LSTM(proj_size=...) to 1e-10 in
float64 for 1 and 3 layers; the compiled plan (passes, buffers, generated kernels that take P) computes it too,
checked through the plan's NumPy executor and nvcc; on the GPU the fused backend runs it (tests/gpu/
test_projection_gpu.py, against the reference and cuDNN). The wavefront schedules and the export do not take P yet.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine.backends import reference
from engine.dsl import W, cell, sigmoid, tanh
from engine.dsl_emit import emit_dsl
from engine.errors import BackendError, CellGraphError, CompileError


def lstm_proj():
    """The gallery's LSTMP (presets/lstm_proj.py)."""
    return engine.preset("lstm_proj").cell


def test_sizes_shapes_and_round_trips():
    graph = lstm_proj()
    assert graph.state_dim("h") == "P" and graph.state_dim("c") == "H" and graph.output_dim == "P"
    assert graph.dims["W_hi_h"] == "H" and graph.dims["h_next"] == "P" and graph.uses_projection
    net = engine.Network(graph, input_size=5, hidden_size=8, num_layers=3, proj_size=3)
    assert net.param_shape(0, "W_hi") == (8, 3) and net.param_shape(0, "W_hr") == (3, 8)
    assert net.param_shape(0, "W_ii") == (8, 5) and net.param_shape(1, "W_ii") == (8, 3)   # layer 1 reads P
    assert net.layer_sizes(1) == {"I": 3, "H": 8, "P": 3} and net.output_size == 3
    data = engine.to_dict(graph)
    assert next(n for n in data["nodes"] if n["name"] == "h")["attrs"] == {"dim": "P"}
    assert "attrs" not in next(n for n in data["nodes"] if n["name"] == "c")                  # H: as before
    assert engine.from_json(json.dumps(data)) == graph
    source = emit_dsl(graph)
    assert 'state_dims={"h": "P"}' in source and 'rows="P"' in source
    namespace: dict = {}
    exec(compile(source, "<emitted>", "exec"), namespace)                                   # noqa: S102
    (rebuilt,) = [v for v in namespace.values() if isinstance(v, engine.CellGraph)]
    assert rebuilt == graph
    assert engine.Network(graph, 5, 8).projection_size == 8                                 # P = H by default


def test_mistakes_name_the_node_or_field():
    def bad(x, h, c):
        c_next = sigmoid(W("W_x") @ x + W("W_h") @ h) * c
        return {"h": tanh(c_next), "c": c_next}                  # h is P-sized, its next value is H-sized
    with pytest.raises(CellGraphError) as e:
        cell(bad, state_dims={"h": "P"})
    assert e.value.problems[0].node == "h" and "has size H, the state has size P" in str(e.value)
    with pytest.raises(CellGraphError) as e:
        cell(bad, state_dims={"k": "P"})
    assert "state_dims" in str(e.value) and "'k'" in str(e.value)
    data = engine.to_dict(lstm_proj())
    next(n for n in data["nodes"] if n["name"] == "h")["attrs"] = {"dim": "I"}
    with pytest.raises(CellGraphError) as e:
        engine.from_dict(data)
    assert any(p.node == "h" and p.field == "attrs.dim" for p in e.value.problems)
    with pytest.raises(BackendError, match="proj_size=4 was given, but cell 'lstm'"):
        engine.Network(engine.preset("lstm").cell, 5, 8, proj_size=4)
    with pytest.raises(BackendError, match="proj_size must be a positive integer"):
        engine.Network(lstm_proj(), 5, 8, proj_size=0)
    net = engine.Network(lstm_proj(), 5, 8, proj_size=3)
    params = engine.init_params(net, seed=0)
    x = np.zeros((2, 4, 5))
    with pytest.raises(BackendError, match=r"initial_states\['h'\] has shape \(1, 4, 8\), expected \(1, 4, 3\)"):
        reference.run(net, params, x, {"h": np.zeros((1, 4, 8))})


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("layout", ["blocked", "interleaved"])
def test_the_compiled_plan_computes_it(num_layers, layout):
    """The passes lay out P-sized buffers (the h state, the layer output, the projection's GEMM block) and the plan's
    NumPy executor runs the very program the fused backend runs, chunked wavefront included."""
    from engine.backends import plan_numpy
    net = engine.Network(lstm_proj(), 5, 8, num_layers, proj_size=3)
    params = engine.init_params(net, seed=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 2, 5))
    states = {"h": rng.standard_normal((num_layers, 2, 3)), "c": rng.standard_normal((num_layers, 2, 8))}
    ref = reference.run(net, params, x, states, dtype=np.float64)
    got = plan_numpy.run(net, params, x, states, layout=layout, chunk_steps=2)
    assert got.outputs.shape == (6, 2, 3)
    assert np.abs(got.outputs - ref.outputs).max() < 1e-12
    for name in ("h", "c"):
        assert np.abs(got.final_states[name] - ref.final_states[name]).max() < 1e-12


@pytest.mark.nvcc
def test_its_kernels_take_p_and_compile_with_nvcc(tmp_path):
    import shutil
    import subprocess

    from engine.compiler import compile_program
    sources = [compile_program(lstm_proj(), layout=layout).source for layout in ("blocked", "interleaved")]
    assert all("const int I, const int H, const int P)" in source for source in sources)
    assert "const int I, const int H)" in compile_program(engine.preset("lstm").cell).source     # others as before
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    for k, source in enumerate(sources):
        (tmp_path / f"k{k}.cu").write_text(source)
        build = subprocess.run(["nvcc", "-arch=sm_90", "--cubin", "-Werror", "all-warnings", "-o",
                                str(tmp_path / f"k{k}.cubin"), str(tmp_path / f"k{k}.cu")],
                               capture_output=True, text=True, timeout=300)
        assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]


def test_the_paths_that_do_not_take_it_yet_refuse_it_by_name():
    from engine.backends import naive
    from engine.compiler import compile_program
    from engine.export import export_plan
    from engine.schedules.tiling import eligibility
    assert "projection size P" in eligibility(compile_program(lstm_proj(), layout="interleaved"))
    net = engine.Network(lstm_proj(), 5, 8, proj_size=3)
    with pytest.raises(BackendError, match="backend 'naive' keeps every state H wide .*cell 'lstm_proj'"):
        naive.prepare(net, engine.init_params(net, seed=0))
    with pytest.raises(CompileError, match="'lstm_proj' has values of the projection size P: the exported program"):
        export_plan(lstm_proj(), 5, 8)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: parity with torch.nn.LSTM(proj_size) is "
                                               "not checked (pip install -r requirements-test.txt)")


@pytest.mark.parametrize("num_layers", [1, 3])
def test_matches_torch_lstm_with_proj_size(torch, num_layers):
    I, H, P, T, B = 5, 7, 3, 6, 4
    net = engine.Network(lstm_proj(), I, H, num_layers, proj_size=P)
    module = torch.nn.LSTM(I, H, num_layers, proj_size=P).double()
    params = []
    sd = module.state_dict()
    for layer in range(num_layers):
        w_ih, w_hh = sd[f"weight_ih_l{layer}"].numpy(), sd[f"weight_hh_l{layer}"].numpy()
        b_ih, b_hh = sd[f"bias_ih_l{layer}"].numpy(), sd[f"bias_hh_l{layer}"].numpy()
        p = {"W_hr": sd[f"weight_hr_l{layer}"].numpy()}
        for k, gate in enumerate("ifgo"):                                   # torch's row blocks: i, f, g, o
            rows = slice(k * H, (k + 1) * H)
            p.update({f"W_i{gate}": w_ih[rows], f"W_h{gate}": w_hh[rows], f"b_i{gate}": b_ih[rows],
                      f"b_h{gate}": b_hh[rows]})
        params.append(p)
    params = engine.Params(params)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((T, B, I))
    h0, c0 = rng.uniform(-0.8, 0.8, (num_layers, B, P)), rng.uniform(-0.8, 0.8, (num_layers, B, H))
    ours = reference.run(net, params, x, {"h": h0, "c": c0}, dtype=np.float64)
    with torch.no_grad():
        out, (hT, cT) = module(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    assert ours.outputs.shape == (T, B, P)
    np.testing.assert_allclose(ours.outputs, out.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(ours.final_states["h"], hT.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(ours.final_states["c"], cT.numpy(), rtol=0, atol=1e-10)
    assert engine.run(net, params, x, {"h": h0, "c": c0}, backend="reference").outputs.shape == (T, B, P)


def test_the_cli_takes_the_projection_size(tmp_path, capsys):
    from engine.cli import main
    path = tmp_path / "lstm_proj.json"
    engine.save(lstm_proj(), path)
    assert main(["show", str(path), "-I", "5", "-H", "8", "-P", "3"]) == 0
    out = capsys.readouterr().out
    assert "(I=5, H=8, P=3)" in out and "W_hr         weight  (3, 8)" in out and "W_hi         weight  (8, 3)" in out
    out_file = tmp_path / "r.npz"
    assert main(["run", str(path), "-I", "5", "-H", "8", "-P", "3", "-T", "4", "-B", "2", "-o", str(out_file)]) == 0
    assert np.load(out_file)["outputs"].shape == (4, 2, 3) and np.load(out_file)["final_c"].shape == (1, 2, 8)
    capsys.readouterr()
    assert main(["explain", str(path), "-I", "5", "-H", "8", "-P", "3", "--no-source"]) == 0
    assert "sizes: I=5 H=8 P=3 L=1" in capsys.readouterr().out
    assert main(["show", "lstm", "-P", "3"]) == 2
    assert "proj_size=3 was given, but cell 'lstm' has no value of size P" in capsys.readouterr().err
