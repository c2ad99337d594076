"""The pipelined run of a net (engine/multigpu) on GPUs: two pipeline stages on one GPU (devices [0, 0]: the
chunking, the carried states and the hand-over on the GPU code path, on any GPU machine), and on two GPUs where the
host has them (peer copies between devices). Outputs within float32 rounding of the one-piece reference run."""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import relative_error

import engine
from engine.multigpu import PipelineProgram, plan_pipeline, tune_pipeline

pytestmark = pytest.mark.gpu


def case():
    net = engine.net_preset("deepspeech", input_size=37, hidden_size=129, layers=2)
    params = engine.init_net_params(net, seed=2)
    x = np.random.default_rng(3).standard_normal((21, 4, 37))
    return net, params, x, engine.run_net(net, params, x).outputs


@pytest.mark.parametrize("backend", ["fused", "persistent"])
def test_two_stages_on_one_gpu(cupy, backend):
    net, params, x, want = case()
    plan = plan_pipeline(net, 2, 21, 4, chunk=6)
    program = PipelineProgram(net, params, plan, backend=backend, devices=[0, 0])
    got = program.run(cupy.asarray(x, dtype=cupy.float32))
    assert relative_error(cupy.asnumpy(got.outputs), want) <= 1e-5
    replays = [text.startswith("replayed") for text in program.replayed.values()]
    assert replays == ([False, False] if backend == "fused" else [True, True]), program.replayed


@pytest.mark.parametrize("backend", ["graph", "persistent"])
def test_replayed_chunks_equal_the_direct_run(cupy, backend):
    """Chunks replayed from CUDA graphs (chunks of 6, 6, 6 and 3: two graph pairs a GPU sharing the carried states)
    give the direct run's outputs bit for bit, on a second input too (the graphs' input buffers are refilled, the
    first chunk starts from zero states again)."""
    net, params, x, want = case()
    plan = plan_pipeline(net, 2, 21, 4, chunk=6)
    replayed = PipelineProgram(net, params, plan, backend=backend, devices=[0, 0])
    direct = PipelineProgram(net, params, plan, backend=backend, devices=[0, 0], replay=False)
    for seed in (3, 5):
        x = cupy.asarray(np.random.default_rng(seed).standard_normal((21, 4, 37)), dtype=cupy.float32)
        got, base = replayed.run(x).outputs, direct.run(x).outputs
        assert bool((got == base).all()), f"seed {seed}: {float(abs(got - base).max())}"
        assert relative_error(cupy.asnumpy(got), engine.run_net(net, params, cupy.asnumpy(x)).outputs) <= 1e-5
    assert all(text.startswith("replayed") for text in replayed.replayed.values()), replayed.replayed
    if backend == "persistent":
        # GPU 0 runs chunks of 6 and 3 steps, GPU 1 (after the pool of stride 2) of 3 and 1
        assert sorted(replayed.replays) == [(0, 3), (0, 6), (1, 1), (1, 3)]


def test_a_chunk_that_cannot_be_captured_runs_directly(cupy, monkeypatch):
    from engine import chunk_replay

    def refuse(self, first):
        raise chunk_replay.CaptureError("RuntimeError: refused for the test")
    monkeypatch.setattr(chunk_replay.ChunkReplay, "_capture", refuse)
    net, params, x, want = case()
    program = PipelineProgram(net, params, plan_pipeline(net, 2, 21, 4, chunk=6), backend="persistent",
                              devices=[0, 0])
    got = program.run(cupy.asarray(x, dtype=cupy.float32)).outputs
    assert relative_error(cupy.asnumpy(got), want) <= 1e-5
    assert all("refused for the test" in text for text in program.replayed.values()), program.replayed


def test_two_gpus(cupy):
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("this host has one GPU: the two-GPU pipeline is checked on a two-GPU machine")
    net, params, x, want = case()
    plan = plan_pipeline(net, 2, 21, 4, chunk=6, available=cupy.cuda.runtime.getDeviceCount())
    got = PipelineProgram(net, params, plan, backend="persistent").run(cupy.asarray(x, dtype=cupy.float32))
    assert relative_error(cupy.asnumpy(got.outputs), want) <= 1e-5


def test_a_measured_run_counts_each_gpus_busy_time(cupy):
    net, params, x, want = case()
    plan = plan_pipeline(net, 2, 21, 4, chunk=6)
    program = PipelineProgram(net, params, plan, backend="persistent", devices=[0, 0])
    m = program.measure(cupy.asarray(x, dtype=cupy.float32), warmup=1, repeats=3)
    assert m.ms > 0 and len(m.busy_ms) == 2 and all(0 < b < m.ms for b in m.busy_ms) and 0 <= m.bubble < 1
    got = program.run(cupy.asarray(x, dtype=cupy.float32)).outputs        # measuring left the program as it was
    assert relative_error(cupy.asnumpy(got), want) <= 1e-5


def test_the_tuner_keeps_the_fastest_candidate(cupy, tmp_path, monkeypatch):
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("this host has one GPU: the tuner runs plans over two GPUs on a two-GPU machine")
    from engine.multigpu import tuned_plan
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    net, params, _, _ = case()
    assert tuned_plan(net, 2, 20, 4) is None
    plan, rows = tune_pipeline(net, params, 2, 20, 4, chunks=[4, 10], splits=[[2, 2], [3, 1]], repeats=2)
    cached = tuned_plan(net, 2, 20, 4)
    assert (cached.chunk, cached.split, cached.measured.ms) == (plan.chunk, plan.split, plan.measured.ms)
    timed = [r for r in rows if "ms" in r]
    assert len(rows) == 4 and len(timed) == 4                    # 2 splits x 2 chunks
    assert plan.measured.ms == min(r["ms"] for r in timed) and (plan.chunk, [len(g) for g in plan.split]) in [
        (r["chunk"], r["split"]) for r in timed if r["ms"] == plan.measured.ms]


@pytest.mark.parametrize("split", [[1, 3], [2, 2], [3, 1]])
def test_fused_pieces_carry_their_states_across_chunks(cupy, split):
    """fuse_pools=True: a GPU's pieces (a layer, the pool, the next block's layers) as one wavefront program with
    the pool folded in, its states carried from chunk to chunk; on one GPU as two pipeline stages."""
    net, params, _, _ = case()
    x = np.random.default_rng(4).standard_normal((20, 4, 37))
    want = engine.run_net(net, params, x).outputs
    plan = plan_pipeline(net, 2, 20, 4, split=split, chunk=6)                 # chunks of 6, 6, 6 and 2
    program = PipelineProgram(net, params, plan, backend="persistent", devices=[0, 0], fuse_pools=True)
    assert sum("run as one wavefront" in text for text in program.fused.values()) == 1     # the other: one piece
    got = program.run(cupy.asarray(x, dtype=cupy.float32)).outputs
    assert relative_error(cupy.asnumpy(got), want) <= 1e-5
    again = program.run(cupy.asarray(x, dtype=cupy.float32)).outputs
    assert bool((again == got).all())
