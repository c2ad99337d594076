"""A pool over time folded into the wavefront kernels (issue #11, kernels/pool.cuh), checked without a GPU.

- kernels/pool.cuh's rnn_pool_step, compiled for the host with the machine's C++ compiler and driven over every step
  of random sequences (NaN included), equals engine.blocks.pool_over_time for max and mean and windows that
  overlap, tile or leave gaps;
- the generated module with a pool: the pooled-output fields in LayerArgs, the layer output's store replaced by the
  fold in the last layer only, nvcc-compiled for both schedules;
- what is refused, and how: a pool whose window is longer than the sequence, a bad pool argument, fuse_pools on a
  backend without wavefront kernels, a layer output the cell also reads.
The GPU side (the fused pool against the float64 reference on graph, persistent and auto) is tests/gpu/test_nets_gpu.py.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import engine
from engine.blocks import Layers, Net, NetProgram, Pool, pool_over_time
from engine.codegen.wavefront import check_pool_fusable, layer_fields, render_wavefront
from engine.errors import BackendError, CompileError
from engine.plan import compile_program, make_plan
from engine.schedules.base import WavefrontSchedule
from engine.schedules.tiling import H100, TileConfig, make_tiling

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
POOLS = [("max", 2, 2), ("mean", 2, 2), ("max", 3, 2), ("mean", 3, 1), ("max", 2, 3), ("mean", 1, 1), ("max", 5, 5)]

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include "pool.cuh"
// argv: op window stride T B F, then T*B*F floats on stdin; prints the T_out*B*F pooled floats.
template <int OP, int W, int S> void run(int T, int B, int F, const float* h, float* out) {
    const int steps = (T - W) / S + 1;
    for (int t = 0; t < T; ++t)                 // the kernel's order: step by step, each element by its own thread
        for (int b = 0; b < B; ++b)
            for (int j = 0; j < F; ++j)
                rnn_pool_step<OP, W, S>(out + (long)b * F + j, (long)B * F, h[((long)t * B + b) * F + j], t, steps);
}
int main(int argc, char** argv) {
    const int op = atoi(argv[1]), w = atoi(argv[2]), s = atoi(argv[3]), T = atoi(argv[4]), B = atoi(argv[5]),
              F = atoi(argv[6]);
    const int steps = (T - w) / s + 1;
    float* h = (float*)malloc(sizeof(float) * T * B * F);
    float* out = (float*)malloc(sizeof(float) * steps * B * F);
    for (int i = 0; i < steps * B * F; ++i) out[i] = NAN;          // poisoned: every output must be written
    for (int i = 0; i < T * B * F; ++i) if (scanf("%f", &h[i]) != 1) return 2;
#define CASE(O, W_, S_) if (op == O && w == W_ && s == S_) run<O, W_, S_>(T, B, F, h, out);
    CASES
    for (int i = 0; i < steps * B * F; ++i) printf("%.9g\n", out[i]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def pool_binary(tmp_path_factory):
    compiler = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if compiler is None:
        pytest.skip("no C++ compiler on PATH for the host build of kernels/pool.cuh")
    cases = " ".join(f"CASE({0 if op == 'max' else 1}, {w}, {s})" for op, w, s in POOLS)
    folder = tmp_path_factory.mktemp("pool")
    (folder / "harness.cpp").write_text(HARNESS.replace("CASES", cases))
    binary = folder / "harness"
    job = subprocess.run([compiler, "-O1", "-std=c++17", f"-I{KERNELS}", "-o", str(binary), str(folder / "harness.cpp")],
                         capture_output=True, text=True)
    assert job.returncode == 0, job.stderr[-3000:]
    return binary


@pytest.mark.parametrize("op,window,stride", POOLS)
@pytest.mark.parametrize("T", [5, 8, 11])
def test_the_fold_equals_pool_over_time(pool_binary, op, window, stride, T):
    B, F = 3, 4
    h = np.random.default_rng(T * 100 + window * 10 + stride).standard_normal((T, B, F)).astype(np.float32)
    h[0, 1, 2] = np.nan                          # in the first window: max and mean carry NaN as NumPy does
    job = subprocess.run([str(pool_binary), "0" if op == "max" else "1", str(window), str(stride), str(T), str(B),
                          str(F)], input="\n".join(f"{v:.9g}" for v in h.ravel()), capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    got = np.array([float(v) for v in job.stdout.split()], dtype=np.float32)
    want = pool_over_time(h, Pool(op, window, stride))
    assert np.isnan(want[0, 1, 2])
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-6, atol=0)   # NaN exactly where NumPy has it


def _module(cell: str, persistent: bool, pool: Pool, layers: int = 2, batch: int = 19, config=None):
    network = engine.Network(engine.preset(cell).cell, 37, 129, layers)
    plan = make_plan(network, 10, batch, layout="interleaved")
    tiling = make_tiling(plan.program, network, batch, config or TileConfig(), H100, persistent=persistent)
    return plan.program, render_wavefront(plan.program, network, tiling, pool=pool), tiling


@pytest.mark.parametrize("cell", ["lstm", "gru", "gru_cho", "indrnn"])
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "graph"])
def test_the_module_folds_the_last_layers_output_into_the_pool(cell, persistent):
    program, source, tiling = _module(cell, persistent, Pool("mean", 3, 2))
    assert "constexpr int POOL_OP = RNN_POOL_MEAN, POOL_WINDOW = 3, POOL_STRIDE = 2;" in source
    assert "float* pool_out;" in source and "long long pool_steps;" in source
    names = [f.name for f in layer_fields(program, tiling, Pool())]
    assert names[-2:] == ["pool_out", "pool_steps"] and "pool_out" not in [f.name for f in layer_fields(program, tiling)]
    folds = source.count("rnn_pool_step<POOL_OP, POOL_WINDOW, POOL_STRIDE>(L.pool_out + ")
    assert folds == 1, "the layer output is stored once a step, so it is folded once"
    fold = source.index("if (L.pool_out)")
    assert f"{program.output_buffer}[row * " in source[fold:fold + 400], "the other layers still store their output"
    plain = _module(cell, persistent, None)[1]
    assert "pool_out" not in plain and "kernels/pool.cuh" not in plain


@pytest.mark.nvcc
@pytest.mark.parametrize("cell,persistent,batch,config", [
    ("lstm", True, 19, TileConfig()), ("gru_cho", False, 64, TileConfig()), ("lstm", True, 2, TileConfig()),
    ("gru", True, 64, TileConfig(sync="layer")), ("lstm", True, 64, TileConfig(layers_per_launch=1))],
    ids=["tiles", "graph-two-stages", "gemv", "layer-sync", "layer-by-layer"])
def test_the_module_with_a_pool_compiles_with_nvcc(tmp_path, cell, persistent, batch, config):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    source = tmp_path / "pooled.cu"
    source.write_text(_module(cell, persistent, Pool("max", 2, 2), batch=batch, config=config)[1])
    job = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-rdc=true", "-cubin", "-o", str(tmp_path / "p.cubin"),
                          "-Werror", "all-warnings", str(source)], capture_output=True, text=True)
    assert job.returncode == 0, (job.stdout + job.stderr)[-4000:]


def test_a_layer_output_the_cell_reads_or_writes_twice_is_not_folded():
    program = compile_program(engine.preset("lstm").cell, layout="interleaved")
    reader = SimpleNamespace(name="reads_h", stores=[], params=[SimpleNamespace(name="h_seq", source=program.output_buffer,
                                                                                 writes=False, kind="buffer")])
    read = SimpleNamespace(kernels=list(program.kernels) + [reader], gemms=program.gemms,
                           output_buffer=program.output_buffer, cell=program.cell)
    with pytest.raises(CompileError, match="reads_h reads it within the layer.*without fuse_pools"):
        check_pool_fusable(read, Pool())
    twice = SimpleNamespace(kernels=list(program.kernels) * 2, gemms=program.gemms,
                            output_buffer=program.output_buffer, cell=program.cell)
    with pytest.raises(CompileError, match="written 2 times a step"):
        check_pool_fusable(twice, Pool())
    with pytest.raises(CompileError, match="pool op 'min' is not one of max, mean"):
        check_pool_fusable(program, Pool("min"))


def test_bad_pools_and_backends_are_refused_by_name():
    network = engine.Network(engine.preset("lstm").cell, 8, 16, 1)
    params = engine.init_params(network, seed=0)
    with pytest.raises(BackendError, match="schedule 'wavefront', argument 'pool': window must be a positive integer"):
        WavefrontSchedule(network, params, pool=Pool("max", 0, 2))
    with pytest.raises(BackendError, match="argument 'pool': a pool is an engine.Pool"):
        WavefrontSchedule(network, params, pool=("max", 2, 2))
    net = Net(8, (Layers("lstm", 16), Pool("max", 2, 2)))
    with pytest.raises(BackendError, match="fuse_pools=True .* backend must be one of auto, graph, persistent, not "
                                           "'fused'"):
        NetProgram(net, engine.init_net_params(net, seed=0), "fused", fuse_pools=True)
    short = SimpleNamespace(name="persistent", pool=Pool("mean", 4, 2))
    with pytest.raises(BackendError, match=r"needs at least 4 steps, got T=3"):
        WavefrontSchedule._pooled_steps(short, 3)
    assert WavefrontSchedule._pooled_steps(short, 9) == 3
