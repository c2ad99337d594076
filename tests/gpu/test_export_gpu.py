"""The exported standalone programs on a GPU: built with nvcc and cuBLAS, run, compared with the engine.

Every preset, 3 layers, I=37, H=129, T=17, B=3, non-zero initial states: the program's out.bin must
match the fused backend (same kernels, same packed weights) and the float64 NumPy reference.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import engine
from engine.backends import fused, reference
from engine.errors import CompileError
from engine.export import export_plan, nvcc_command, program_name, read_outputs, render_program, write_run_files

pytestmark = pytest.mark.gpu

# Every preset the export takes: not LSTMP (values of size P), refused by name (tests/test_projection.py).
PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)
I, H, L, T, B = 37, 129, 3, 17, 3


def _arch(cupy) -> str:
    return f"sm_{cupy.cuda.Device().compute_capability}"


@pytest.fixture(scope="module")
def build(cupy, tmp_path_factory):
    """name -> (plan, path of the built program), each preset's program built when a test first asks for it. Under
    xdist the tests spread over the workers; a module fixture that built every preset in each of them ran ~15 x 25
    nvcc builds at once (60 s of setup a worker on a 16-core host), where one build takes ~3 s."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    try:
        nvcc_command("x.cu", "x")
    except CompileError as e:
        pytest.skip(str(e))
    root = tmp_path_factory.mktemp("exports")
    arch = _arch(cupy)
    built = {}

    def program(name):
        if name not in built:
            plan = export_plan(engine.preset(name), I, engine.preset(name).cell.fit_size(H), L, chunk_steps=5)
            source = root / f"{program_name(plan)}.cu"
            source.write_text(render_program(plan, arch=arch))
            binary = root / program_name(plan)
            run = subprocess.run(nvcc_command(source, binary, arch=arch), capture_output=True, text=True, timeout=600)
            assert run.returncode == 0, f"nvcc failed for {name}:\n" + f"{run.stdout}{run.stderr}"[-3000:]
            built[name] = plan, binary
        return built[name]
    return program


@pytest.mark.parametrize("name", PRESETS)
def test_exported_program_matches_the_engine(cupy, build, name, tmp_path):
    plan, binary = build(name)
    network = plan.network
    params = engine.init_params(network, seed=5)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((T, B, I))
    states = {s: rng.uniform(-0.8, 0.8, (L, B, network.hidden_size)) for s in network.cell.state_names}
    paths = write_run_files(tmp_path, plan.program, network, params, x, states)
    run = subprocess.run([str(binary), str(paths["weights"]), str(paths["x"]), str(T), str(B),
                          str(tmp_path / "out.bin"), str(paths["states"])], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    outputs, final = read_outputs(tmp_path / "out.bin", plan.program, network, T, B)
    engine_result = fused.run(network, params, x, states, chunk_steps=5)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    for got, want_engine, want_ref, what in [(outputs, engine_result.outputs, ref.outputs, "outputs")] + [
            (final[s], engine_result.final_states[s], ref.final_states[s], f"final {s}") for s in final]:
        assert np.linalg.norm(got - want_engine) <= 1e-5 * np.linalg.norm(want_engine), f"{what} vs fused"
        assert np.linalg.norm(got - want_ref) <= 1e-5 * np.linalg.norm(want_ref), f"{what} vs reference"
