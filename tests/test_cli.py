"""The CLI: every command works on good input and, on bad input, exits 2 with one clear message and a hint
(tests/test_contract_cli.py checks the contract itself: exit codes, --debug, flags, destinations)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_presets_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in engine.presets():
        assert name in out


def test_presets_json(capsys):
    assert main(["presets", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in listed} == set(engine.presets())
    assert all(p["latex"] and p["citation"] for p in listed)


def test_show_prints_equations_states_params(capsys):
    assert main(["show", "lstm", "-I", "10", "-H", "20"]) == 0
    out = capsys.readouterr().out
    assert r"\sigma" in out and "c <- c_next" in out
    assert "W_ii" in out and "(20, 10)" in out and "validation: OK" in out


def test_show_json_round_trips(capsys, tmp_path):
    assert main(["show", "gru", "--json"]) == 0
    path = tmp_path / "gru.json"
    path.write_text(capsys.readouterr().out)
    assert engine.load(path) == engine.preset("gru").cell
    assert main(["show", str(path)]) == 0


def test_run_saves_outputs_matching_the_api(tmp_path):
    out = tmp_path / "o.npz"
    assert main(["run", "lstm", "-I", "6", "-H", "5", "-L", "2", "-T", "4", "-B", "3", "--seed", "3",
                 "-o", str(out)]) == 0
    saved = np.load(out)
    net = engine.Network(engine.preset("lstm").cell, 6, 5, 2)
    x = np.random.default_rng(4).standard_normal((4, 3, 6))
    ref = engine.run(net, engine.init_params(net, seed=3), x, backend="reference", dtype=np.float64)
    np.testing.assert_allclose(saved["outputs"], ref.outputs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(saved["final_c"], ref.final_states["c"], rtol=0, atol=1e-12)


def test_run_precision_emulates_the_mode_on_the_reference(tmp_path, capsys):
    out = tmp_path / "o.npz"
    assert main(["run", "gru", "-I", "6", "-H", "5", "-T", "4", "-B", "3", "--precision", "bfloat16",
                 "-o", str(out)]) == 0
    assert "in bfloat16" in capsys.readouterr().out
    net = engine.Network(engine.preset("gru").cell, 6, 5, 1)
    x = np.random.default_rng(1).standard_normal((4, 3, 6))
    params = engine.init_params(net, seed=0)
    emulated = engine.run(net, params, x, backend="reference", dtype=np.float64, precision="bfloat16")
    strict = engine.run(net, params, x, backend="reference", dtype=np.float64)
    saved = np.load(out)["outputs"]
    np.testing.assert_allclose(saved, emulated.outputs, rtol=0, atol=1e-12)
    assert np.abs(saved - strict.outputs).max() > 1e-4       # the mode did round something
    assert main(["run", "gru", "--precision", "float8"]) == 2      # argparse names the flag and the choices
    assert "--precision" in capsys.readouterr().err


def test_run_with_given_input_and_params(tmp_path):
    net = engine.Network(engine.preset("gru").cell, 3, 4, 1)
    params = engine.init_params(net, seed=9)
    params.save(tmp_path / "p.npz")
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    np.save(tmp_path / "x.npy", x)
    assert main(["run", "gru", "-H", "4", "--input", str(tmp_path / "x.npy"), "--params", str(tmp_path / "p.npz"),
                 "-o", str(tmp_path / "o.npz")]) == 0
    ref = engine.run(net, params, x, backend="reference", dtype=np.float64)
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["outputs"], ref.outputs, atol=1e-12)


@pytest.mark.parametrize("argv, needle", [
    (["show", "no_such_cell"], "no_such_cell"),
    (["show", "missing.json"], "missing.json"),
    (["run", "lstm", "--steps", "0"], "--steps"),
    (["run", "lstm", "--hidden-size", "0"], "--hidden-size"),
    (["run", "lstm", "--backend", "warp"], "warp"),
    (["run", "lstm", "--input", "nope.npy"], "--input"),
])
def test_bad_arguments_exit_2_with_a_named_message(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err
    assert "Traceback" not in err


def test_bad_cell_json_names_the_field(tmp_path, capsys):
    data = engine.to_dict(engine.preset("lstm").cell)
    data["version"] = 99
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["show", str(path)]) == 2
    assert "version" in capsys.readouterr().err


def test_module_entry_point_runs_as_a_subprocess():
    done = subprocess.run([sys.executable, "-m", "engine", "presets"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "lstm" in done.stdout
    done = subprocess.run([sys.executable, "-m", "engine", "frobnicate"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "invalid choice" in done.stderr


# ---- explain --schedule -------------------------------------------------------------------------------

@pytest.fixture
def nominal_limits(monkeypatch, tmp_path):
    """No GPU (the nominal H100 tilings) and an empty autotune cache, whatever this machine has."""
    monkeypatch.setattr(engine.backends, "gpu_status", lambda: (False, "no CUDA device (test)"))
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path / "cache"))


def test_explain_schedule_prints_the_schedules(nominal_limits, capsys):
    assert main(["explain", "gru", "-L", "2", "-T", "5", "-B", "8", "--schedule", "graph", "--no-source"]) == 0
    out = capsys.readouterr().out
    assert "passes (in order" in out and "schedules (tilings for NVIDIA H100 (nominal)" in out
    assert "graph: one kernel per stage of every wavefront step (6 x 1 = 6 launches)" in out
    assert "selected: graph: asked for" in out and "__global__" not in out


def test_explain_schedule_source_only_prints_just_the_generated_cuda(nominal_limits, capsys):
    argv = ["explain", "lstm", "-L", "2", "-T", "5", "-B", "8", "--schedule", "persistent"]
    assert main(argv + ["--source-only"]) == 0
    source = capsys.readouterr().out
    assert source.startswith("// Generated by engine.codegen.wavefront for cell 'lstm'")
    assert "lstm_persistent(" in source and "grid.sync()" in source and "passes (in order" not in source
    assert main(argv + ["--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["schedules"]["persistent"]["source"].rstrip("\n") == source.rstrip("\n")
    assert main(["explain", "lstm", "--schedule", "fused", "--source-only"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == engine.explain_json("lstm", input_size=64, hidden_size=128,
                                                                       steps=20, batch=4)["source"].rstrip("\n")


def test_explain_source_only_of_an_ineligible_cell_says_why(nominal_limits, capsys, tmp_path):
    from compiler_cells import input_sized
    path = tmp_path / "input_sized.json"
    engine.save(input_sized, path)
    assert main(["explain", str(path), "--schedule", "persistent", "--source-only"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: cell 'input_sized' cannot use schedule 'persistent'")
    assert "h_gx_gemm" in captured.err and "hint:" in captured.err


def test_explain_bad_schedule_lists_the_choices(capsys):
    assert main(["explain", "lstm", "--schedule", "warp"]) == 2
    err = capsys.readouterr().err
    assert "--schedule" in err and "'warp'" in err and "'persistent'" in err and "'auto'" in err


def test_run_takes_float32x3_and_refuses_the_opt_in_flag_off_auto(tmp_path, capsys):
    out = tmp_path / "o.npz"
    assert main(["run", "lstm", "-I", "4", "-H", "8", "--steps", "3", "--batch", "2", "--precision", "float32x3",
                 "-o", str(out)]) == 0
    assert "in float32x3" in capsys.readouterr().out and out.exists()
    assert main(["run", "lstm", "-I", "4", "-H", "8", "--steps", "3", "--batch", "2", "--allow-tensor-core-fp32",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--allow-tensor-core-fp32" in err and "--backend auto" in err
    assert main(["explain", "lstm", "--precision", "float32x3", "--no-source"]) == 0
