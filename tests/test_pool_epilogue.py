"""A pool over time folded into the wavefront kernels (issue #11, kernels/pool.cuh), checked without a GPU.

- kernels/pool.cuh's rnn_pool_step, compiled for the host with the machine's C++ compiler and driven over every step
  of random sequences (NaN included), equals engine.nets.pooling.pool_over_time for max and mean and windows that
  overlap, tile or leave gaps;
- the step timing of one wavefront through the pools (engine/schedules/steps.py) against a brute-force earliest
  schedule, and which blocks of a net fuse_pools joins into one program (fused_runs);
- the generated module with pools: the pooled-output and timing fields in LayerArgs, the layer output's store
  replaced by the fold where a pool follows, each layer stepping on its own timing, nvcc-compiled;
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
from engine.codegen.layer_args import TIMING_FIELDS, layer_fields
from engine.codegen.wavefront import check_pool_fusable, render_wavefront
from engine.compiler import compile_program, make_plan
from engine.errors import BackendError, CompileError
from engine.nets.data import Layers, Net, Pool
from engine.nets.fusion import fused_runs
from engine.nets.pooling import pool_over_time
from engine.nets.runner import NetProgram
from engine.schedules.base import WavefrontSchedule
from engine.schedules.steps import layer_steps
from engine.schedules.tiling import H100, TileConfig, make_tiling

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
POOLS = [("max", 2, 2), ("mean", 2, 2), ("max", 3, 2), ("mean", 3, 1), ("max", 2, 3), ("mean", 1, 1), ("max", 5, 5)]

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include "pool.cuh"
// argv: op window stride T B F, then T*B*F floats on stdin; prints the T_out*B*F pooled floats.
void run(int op, int W, int S, int T, int B, int F, const float* h, float* out) {
    const int steps = (T - W) / S + 1;
    for (int t = 0; t < T; ++t)                 // the kernel's order: step by step, each element by its own thread
        for (int b = 0; b < B; ++b)
            for (int j = 0; j < F; ++j)
                rnn_pool_step(out + (long)b * F + j, (long)B * F, h[((long)t * B + b) * F + j], t, steps, op, W, S);
}
int main(int argc, char** argv) {
    const int op = atoi(argv[1]), w = atoi(argv[2]), s = atoi(argv[3]), T = atoi(argv[4]), B = atoi(argv[5]),
              F = atoi(argv[6]);
    const int steps = (T - w) / s + 1;
    float* h = (float*)malloc(sizeof(float) * T * B * F);
    float* out = (float*)malloc(sizeof(float) * steps * B * F);
    for (int i = 0; i < steps * B * F; ++i) out[i] = NAN;          // poisoned: every output must be written
    for (int i = 0; i < T * B * F; ++i) if (scanf("%f", &h[i]) != 1) return 2;
    run(op, w, s, T, B, F, h, out);
    for (int i = 0; i < steps * B * F; ++i) printf("%.9g\n", out[i]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def pool_binary(tmp_path_factory):
    compiler = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if compiler is None:
        pytest.skip("no C++ compiler on PATH for the host build of kernels/pool.cuh")
    folder = tmp_path_factory.mktemp("pool")
    (folder / "harness.cpp").write_text(HARNESS)
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


def _module(cell: str, persistent: bool, pools: dict | None, layers: int = 2, batch: int = 19, config=None):
    network = engine.Network(engine.preset(cell).cell, 37, 129, layers)
    plan = make_plan(network, 10, batch, layout="interleaved")
    tiling = make_tiling(plan.program, network, batch, config or TileConfig(), H100, persistent=persistent)
    return plan.program, render_wavefront(plan.program, network, tiling, pools=pools), tiling


FOLD = "rnn_pool_step(L.pool_out + "


@pytest.mark.parametrize("cell", ["lstm", "gru", "gru_cho", "indrnn"])
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "graph"])
def test_the_module_folds_a_layers_output_into_its_pool_and_steps_each_layer_on_its_own(cell, persistent):
    program, source, tiling = _module(cell, persistent, {0: Pool("mean", 3, 2), 1: Pool("max", 2, 2)})
    assert "float* pool_out;" in source and "long long below_offset;" in source
    names = [f.name for f in layer_fields(program, tiling, True)]
    assert names[-10:] == ["pool_out", *TIMING_FIELDS] and "pool_out" not in [f.name for f in layer_fields(program, tiling)]
    assert source.count(FOLD) == 1, "the layer output is stored once a step, so it is folded once"
    fold = source.index("if (L.pool_out)")
    assert f"{program.output_buffer}[row * " in source[fold:fold + 500], "a layer without a pool stores its output"
    assert "const bool busy = tu > 0 && tk >= 0 && tk == t * (int)L.scale && t < (int)L.steps;" in source
    assert "t < T" not in source.split("LayerArgs {")[1], "with pools no layer runs on the launch's T"
    plain = _module(cell, persistent, None)[1]
    assert "pool_out" not in plain and "kernels/pool.cuh" not in plain and "L.scale" not in plain


def test_the_layer_synchronised_module_waits_for_the_last_step_of_the_window_below():
    source = _module("lstm", True, {0: Pool("max", 2, 2)}, config=TileConfig(sync="layer"))[1]
    assert "for (int t = 0; t < (int)L.steps; ++t)" in source
    assert ("rnn_wait_for(arrivals + (layer - 1) * HEADS + hd, BLOCKS_PER_HEAD * ((unsigned)(t * (int)L.below_scale "
            "+ (int)L.below_offset) + 1u) * S);") in source


@pytest.mark.nvcc
@pytest.mark.parametrize("cell,persistent,batch,config", [
    ("lstm", True, 19, TileConfig()), ("gru_cho", False, 64, TileConfig()), ("lstm", True, 2, TileConfig()),
    ("gru", True, 64, TileConfig(sync="layer")), ("lstm", True, 64, TileConfig(layers_per_launch=1))],
    ids=["tiles", "graph-two-stages", "gemv", "layer-sync", "layer-by-layer"])
def test_the_module_with_pools_compiles_with_nvcc(tmp_path, cell, persistent, batch, config):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    source = tmp_path / "pooled.cu"
    source.write_text(_module(cell, persistent, {0: Pool("max", 2, 2), 1: Pool("mean", 3, 1)}, batch=batch,
                              config=config)[1])
    job = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-rdc=true", "-cubin", "-o", str(tmp_path / "p.cubin"),
                          "-Werror", "all-warnings", str(source)], capture_output=True, text=True)
    assert job.returncode == 0, (job.stdout + job.stderr)[-4000:]


def _earliest(num_layers: int, T: int, pools: dict) -> list[list[int]]:
    """Brute force: the wavefront step of every layer's every step when each runs as soon as it may (its own step
    before, and the steps of the layer below that its input needs, done at earlier wavefront steps)."""
    steps = [T]
    for layer in range(num_layers - 1):
        steps.append(pools[layer].steps_out(steps[-1]) if layer in pools else steps[-1])
    done = [[None] * n for n in steps]
    k = 0
    while any(None in d for d in done):
        ready = []
        for layer in range(num_layers):
            t = done[layer].index(None) if None in done[layer] else None
            if t is None or (t and done[layer][t - 1] >= k):
                continue
            if layer:
                pool = pools.get(layer - 1)
                need = t * pool.stride + pool.window - 1 if pool else t
                if done[layer - 1][need] is None or done[layer - 1][need] >= k:
                    continue
            ready.append((layer, t))
        for layer, t in ready:
            done[layer][t] = k
        k += 1
    return done


@pytest.mark.parametrize("num_layers,T,pools", [
    (1, 7, {}), (3, 9, {}), (8, 100, {3: Pool("max", 2, 2)}), (4, 23, {0: Pool("mean", 3, 2), 2: Pool("max", 2, 3)}),
    (3, 12, {0: Pool("max", 1, 1), 1: Pool("mean", 4, 4)}), (2, 5, {1: Pool("max", 5, 1)})])
def test_the_step_timing_is_the_earliest_the_dependencies_allow(num_layers, T, pools):
    timing = layer_steps(num_layers, T, pools)
    want = _earliest(num_layers, T, {p: v for p, v in pools.items() if p < num_layers - 1})
    got = [[s.wavefront_step(t) for t in range(s.steps)] for s in timing.layers]
    assert got == want
    assert timing.wavefront == max(max(row) for row in got) + 1
    last = timing.layers[-1].steps
    assert timing.output_steps == (pools[num_layers - 1].steps_out(last) if num_layers - 1 in pools else last)


def test_fused_runs_join_blocks_of_one_cell_through_their_pools():
    [run] = fused_runs(engine.net_preset("deepspeech"))
    assert (run.first, run.last, run.network.num_layers, list(run.pools)) == (0, 2, 8, [3])
    assert run.layers[3] == (0, 3) and run.layers[4] == (2, 0) and run.largest_block == 4
    net = Net(8, (Layers("lstm", 16, 2), Pool("mean", 3, 2), Layers("gru", 16), Pool("max", 2, 2),
                  Layers("lstm", 16, direction="bidirectional"), Layers("lstm", 32), Layers("lstm", 32),
                  Layers("lstm_proj", 32, proj_size=8), Pool("max", 2, 2)))
    runs = [(r.first, r.last, r.network.num_layers, sorted(r.pools)) for r in fused_runs(net)]
    assert runs == [(0, 1, 2, [1]), (2, 3, 1, [0]), (5, 6, 2, [])], "another cell, a bidirectional block or a " \
        "projection ends a run"
    assert fused_runs(Net(8, (Layers("lstm", 16), Pool("max", 2, 2), Layers("lstm", 24)))) \
        [0].network.num_layers == 1, "another hidden size ends a run after its pool"


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
    network = engine.Network(engine.preset("lstm").cell, 8, 16, 2)
    params = engine.init_params(network, seed=0)
    with pytest.raises(BackendError, match="schedule 'wavefront', argument 'pool': window must be a positive integer"):
        WavefrontSchedule(network, params, pool=Pool("max", 0, 2))
    with pytest.raises(BackendError, match="argument 'pools\\[0\\]': a pool is an engine.Pool"):
        WavefrontSchedule(network, params, pools={0: ("max", 2, 2)})
    with pytest.raises(BackendError, match="argument 'pools' has key 2, not a layer of this 2-layer network"):
        WavefrontSchedule(network, params, pools={2: Pool()})
    with pytest.raises(BackendError, match="give pool .* or pools .*, not both"):
        WavefrontSchedule(network, params, pool=Pool(), pools={0: Pool()})
    net = Net(8, (Layers("lstm", 16), Pool("max", 2, 2)))
    with pytest.raises(BackendError, match="fuse_pools=True .* backend must be one of auto, graph, persistent, not "
                                           "'fused'"):
        NetProgram(net, engine.init_net_params(net, seed=0), "fused", fuse_pools=True)
    with pytest.raises(ValueError, match="the pool after layer 1 .* needs at least 4 steps, and 3 reach it"):
        layer_steps(2, 6, {0: Pool("max", 2, 2), 1: Pool("mean", 4, 1)})
