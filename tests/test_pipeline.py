"""The pipeline planner (issue #11, several GPUs): which layers go on which GPU, the chunk size and the predicted
bubble, from the layers' costs; and the requests it refuses, naming why. Runs without a GPU: it is a plan."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

import engine
from engine.errors import BackendError
from engine.multigpu import PipelineMeasurement, block_boundary_split, layers_net, plan_pipeline, units_of
from engine.multigpu.plan import linear_partition
from engine.nets.data import Layers, Net, Pool


@pytest.mark.parametrize("seed", range(20))
def test_the_split_is_the_best_contiguous_one(seed):
    import random
    rng = random.Random(seed)
    costs = [rng.uniform(0.1, 5.0) for _ in range(rng.randint(2, 9))]
    parts = rng.randint(1, len(costs))
    runs = linear_partition(costs, parts)
    assert [u for run in runs for u in run] == list(range(len(costs))) and all(runs)
    best = min(max(sum(costs[a:b]) for a, b in zip((0,) + cuts, cuts + (len(costs),)))
               for cuts in itertools.combinations(range(1, len(costs)), parts - 1))
    assert math.isclose(max(sum(costs[u] for u in run) for run in runs), best)


def test_deepspeech_on_two_gpus_balances_the_halved_layers_after_the_pool():
    net = engine.net_preset("deepspeech")
    units = units_of(net, 64)
    assert [u.label for u in units] == [f"rnn_a[{i}]" for i in range(4)] + [f"rnn_b[{i}]" for i in range(4)]
    assert math.isclose(units[4].step_flops * 2, units[1].step_flops)      # after a stride-2 pool: half the steps
    balanced = plan_pipeline(net, 2, 100, 64, host_us_per_run=0.0)     # no host cost: the FLOP-balanced split
    assert [len(g) for g in balanced.split] == [3, 5]                      # 3 full layers | 1 full + 4 halves
    assert math.isclose(balanced.per_gpu_step_us[0], balanced.per_gpu_step_us[1])
    assert 1.0 < balanced.predicted_speedup < 2.0 and 0 <= balanced.bubble < 1 and balanced.chunk % 2 == 0
    assert "GPU 1: rnn_a[3], rnn_b[0]" in balanced.describe()
    assert json.loads(json.dumps(balanced.as_dict()))["split"][0] == ["rnn_a[0]", "rnn_a[1]", "rnn_a[2]"]
    assert block_boundary_split(balanced) == [4, 4]
    # One Python thread issues every GPU's runs. Issued run by run (replay=False), [3, 5] makes three runs a chunk
    # (GPU 1 runs two pieces) and [4, 4] two: with the host's cost per run counted the planner takes the cut at the
    # pool, as the two-H200 measurements of direct runs did.
    direct = plan_pipeline(net, 2, 100, 64, replay=False)
    assert [len(g) for g in direct.split] == [4, 4] and block_boundary_split(direct) is None
    assert direct.predicted_ms < plan_pipeline(net, 2, 100, 64, split=[3, 5], replay=False).predicted_ms
    fixed = plan_pipeline(net, 2, 100, 64, split=[3, 5], chunk=direct.chunk, replay=False)
    assert fixed.predicted_ms > direct.predicted_ms and [len(g) for g in fixed.split] == [3, 5]
    # Replayed from CUDA graphs (the default), a GPU's chunk is one launch whatever its pieces: the balanced split wins
    # again, and the pipeline is predicted faster than one GPU (measured on two H200s: 5.9 ms against 6.9).
    plan = plan_pipeline(net, 2, 100, 64)
    assert [len(g) for g in plan.split] == [3, 5] and plan.predicted_ms < direct.predicted_ms
    assert plan.predicted_speedup > 1.0


def test_the_chunk_is_the_admissible_one_with_the_least_predicted_time():
    net = layers_net(engine.Network(engine.preset("lstm").cell, 1024, 1024, 16))
    plan = plan_pipeline(net, 2, 200, 128)
    every = {c: plan_pipeline(net, 2, 200, 128, chunk=c).predicted_ms for c in range(1, 201)}
    assert plan.predicted_ms == min(every.values()) and every[plan.chunk] == plan.predicted_ms
    assert every[1] > 1.5 * plan.predicted_ms and every[200] > 1.5 * plan.predicted_ms   # neither end is best
    costly = plan_pipeline(net, 2, 200, 128, layer_overhead_us=2000.0)
    assert costly.chunk > plan.chunk                                   # dearer chunks: fewer, longer ones
    one = plan_pipeline(net, 1, 200, 128)
    assert one.chunk == 200 and one.bubble == pytest.approx(0.0, abs=1e-12) and one.predicted_speedup == 1.0
    four = plan_pipeline(net, 4, 200, 128)
    assert four.predicted_speedup > plan_pipeline(net, 2, 200, 128).predicted_speedup > 1.6
    assert all(len(g) == 4 for g in four.split)
    pooled = Net(16, (Layers("lstm", 16, 2), Pool("max", 3, 3), Layers("lstm", 16, 2)))
    assert all(plan_pipeline(pooled, 2, 99, 4, chunk=c).chunk % 3 == 0 for c in (1, 4, 10, 50))


def test_a_measurement_reads_as_the_bubble_of_busy_time():
    m = PipelineMeasurement(ms=10.0, busy_ms=[8.0, 6.0], repeats=3, one_gpu_ms=17.0)
    assert m.bubble == pytest.approx(0.3) and "1.70x the one-GPU run's 17.00 ms" in m.describe()
    plan = plan_pipeline(engine.net_preset("deepspeech"), 2, 100, 64)
    plan.measured = m
    assert "measured: 10.00 ms" in plan.describe() and plan.as_dict()["measured"]["bubble"] == pytest.approx(0.3)


def test_a_bidirectional_layer_is_noted():
    net = Net(8, (Layers("lstm", 8, 2, direction="bidirectional"), Layers("gru", 8, 2)))
    plan = plan_pipeline(net, 2, 50, 4)
    assert any("bidirectional" in n for n in plan.notes) and "note: a bidirectional layer" in plan.describe()


def test_bad_requests_are_named():
    net = engine.net_preset("deepspeech")
    with pytest.raises(BackendError, match="8 layer\\(s\\), so 9 GPUs would leave 1 without work"):
        plan_pipeline(net, 9, 100, 64)
    with pytest.raises(BackendError, match=r"split \[8, 0\] leaves GPU 1 without layers"):
        plan_pipeline(net, 2, 100, 64, split=[8, 0])
    with pytest.raises(BackendError, match=r"split \[3, 3\] places 6 layers, but net 'deepspeech' has 8"):
        plan_pipeline(net, 2, 100, 64, split=[3, 3])
    with pytest.raises(BackendError, match="4 GPUs asked for, but this host has 2"):
        plan_pipeline(net, 4, 100, 64, available=2)
    with pytest.raises(BackendError, match="the pool window 2 is longer than the 1 step"):
        plan_pipeline(net, 2, 1, 64)
    with pytest.raises(BackendError, match="gpus must be a positive integer"):
        plan_pipeline(net, 0, 100, 64)
    with pytest.raises(BackendError, match="chunk must be a positive integer"):
        plan_pipeline(net, 2, 100, 64, chunk=0)


def test_the_net_command_prints_the_plan(capsys):
    from engine.cli import main
    assert main(["net", "deepspeech", "--gpus", "2", "-T", "100", "-B", "64"]) == 0
    out = capsys.readouterr().out
    assert "on 2 GPU(s), T=100, B=64" in out and "GPU 0: rnn_a[0], rnn_a[1], rnn_a[2]" in out
    assert main(["net", "deepspeech", "--gpus", "2", "--split", "4,x"]) == 2
    assert "--split must be layer counts" in capsys.readouterr().err
    assert main(["net", "deepspeech", "--gpus", "9"]) == 2
    captured = capsys.readouterr()
    assert "9 GPUs would leave 1 without work" in captured.err and captured.out == ""
    assert Pool("max").label == "max-pool 2/2"


# ---- running a plan: the schedule on the CPU reference ---------------------------------------------------

@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_pipelined_run_equals_the_one_piece_run(cell):
    """Chunks of the sequence flow through the GPUs' pieces with every layer's states carried from chunk to chunk,
    and the pool's windows cut at chunk boundaries: the result is the unchunked run's, bit for bit."""
    from engine.multigpu import PipelineProgram
    net = engine.net_preset("deepspeech", input_size=6, hidden_size=5, layers=2, cell=cell)
    params = engine.init_net_params(net, seed=1)
    x = np.random.default_rng(0).standard_normal((11, 3, 6))
    want = engine.run_net(net, params, x).outputs
    for gpus in (1, 2, 3, 4):
        for chunk in (1, 2, 4, 11):
            plan = plan_pipeline(net, gpus, 11, 3, chunk=chunk)
            assert plan.chunk % 2 == 0                            # whole windows of the stride-2 pool per chunk
            got = PipelineProgram(net, params, plan).run(x).outputs
            assert got.shape == want.shape and np.array_equal(got, want), (gpus, chunk)


def test_the_pool_goes_with_the_gpu_that_feeds_it():
    from engine.multigpu import Piece, pieces_of
    plan = plan_pipeline(engine.net_preset("deepspeech", input_size=6, hidden_size=5, layers=2), 3, 8, 2, chunk=2)
    assert pieces_of(plan) == [[Piece(0, 0, 1)], [Piece(0, 1, 2), Piece(1)], [Piece(2, 0, 2)]]


def test_what_cannot_be_cut_into_chunks_runs_as_one_chunk_with_a_note():
    from engine.multigpu import PipelineProgram
    for net in (Net(4, (Layers("lstm", 5, 2), Pool("max", 3, 2), Layers("gru", 5, 2))),
                Net(4, (Layers("lstm", 5, 1, direction="bidirectional"), Layers("gru", 5, 2)))):
        plan = plan_pipeline(net, 2, 9, 2, chunk=2)
        assert plan.chunk == 9 and plan.notes
        params = engine.init_net_params(net, seed=0)
        x = np.random.default_rng(1).standard_normal((9, 2, 4))
        assert np.array_equal(PipelineProgram(net, params, plan).run(x).outputs, engine.run_net(net, params, x).outputs)


def test_a_pipeline_checks_its_plan_and_input():
    from engine.multigpu import PipelineProgram
    net = engine.net_preset("deepspeech", input_size=6, hidden_size=5, layers=2)
    params = engine.init_net_params(net, seed=1)
    plan = plan_pipeline(net, 2, 8, 3)
    with pytest.raises(BackendError, match="the pipeline plan is for T=8, B=3"):
        PipelineProgram(net, params, plan).run(np.zeros((9, 3, 6)))
    other = engine.net_preset("deepspeech", input_size=6, hidden_size=5, layers=1)
    with pytest.raises(BackendError, match="made for another net"):
        PipelineProgram(other, engine.init_net_params(other), plan)


def test_explain_shows_a_nets_plan_over_gpus():
    net = engine.net_preset("deepspeech")
    text = engine.explain(net, gpus=2, steps=100, batch=64)
    assert text == plan_pipeline(net, 2, 100, 64).describe() and "GPU 1: rnn_a[3], rnn_b[0]" in text
    data = engine.explain(net, gpus=2, steps=100, batch=64, as_json=True)
    assert [len(g) for g in data["split"]] == [3, 5] and data["measured"] is None and data["chunk_steps"] % 2 == 0
    assert "on 1 GPU(s), T=16, B=8" in engine.explain(net)                   # explain's default sizes
    plan = plan_pipeline(net, 2, 100, 64)
    plan.measured = PipelineMeasurement(ms=7.1, busy_ms=[5.3, 3.0], repeats=7, one_gpu_ms=7.0)
    assert "measured: 7.10 ms (median of 7, 0.99x the one-GPU run's 7.00 ms), bubble 42%" in engine.explain(plan)
    with pytest.raises(engine.CompileError, match=r"explain\(gpus=N\) plans a network of blocks"):
        engine.explain("lstm", gpus=2)


def test_the_predicted_timeline_is_the_plans_stages():
    net = engine.net_preset("stack", input_size=64, hidden_size=64, layers=6)
    assert [u.label for u in units_of(net, 8)] == [f"stack[{i}]" for i in range(6)]
    plan = plan_pipeline(net, 3, 50, 8, chunk=12)                   # chunks of 12, 12, 12, 12 and a tail of 2
    events = plan.timeline()
    assert len(events) == 5 * 3 and {e["lane"] for e in events} == {"GPU 0", "GPU 1", "GPU 2"}
    for e in events:
        g = int(e["lane"].split()[1])
        assert e["start_ms"] == pytest.approx((e["chunk"] + g) * plan.stage_us / 1e3)
        steps = e["steps"][1] - e["steps"][0]
        assert steps == (2 if e["chunk"] == 4 else 12)
        full = plan.chunk_work_us[g] / 1e3
        assert e["end_ms"] - e["start_ms"] == pytest.approx(full - (12 - steps) * plan.per_gpu_step_us[g] / 1e3)
    for lane in ("GPU 0", "GPU 1", "GPU 2"):                      # a GPU never works on two chunks at once
        mine = sorted((e for e in events if e["lane"] == lane), key=lambda e: e["start_ms"])
        assert all(a["end_ms"] <= b["start_ms"] + 1e-12 for a, b in zip(mine, mine[1:]))
    assert max(e["end_ms"] for e in events) <= plan.predicted_ms + 1e-9


def test_which_gpus_run_their_pieces_as_one_fused_program():
    from engine.multigpu import PipelineProgram, gpu_fused_runs
    net = engine.net_preset("deepspeech")
    fused, why = gpu_fused_runs(plan_pipeline(net, 2, 100, 64, split=[3, 5]))
    (run, layers), = fused.values()
    assert list(fused) == [1] and run.network.num_layers == 5 and list(run.pools) == [0]     # the pool after rnn_a[3]
    assert layers == [(0, 3), (2, 0), (2, 1), (2, 2), (2, 3)] and why == {0: "one piece: nothing to fuse"}
    fused, why = gpu_fused_runs(plan_pipeline(net, 2, 100, 64, split=[4, 4]))
    assert list(fused) == [0] and list(fused[0][0].pools) == [3] and fused[0][0].network.input_size == 512
    fused, why = gpu_fused_runs(plan_pipeline(net, 2, 101, 64, split=[3, 5]))
    assert not fused and "T=101 is not a multiple of the pools' stride 2" in why[1]
    mixed = Net(8, (Layers("lstm", 8, 2), Pool("max", 2, 2), Layers("gru", 8, 2)))   # two cells: no one run
    fused, why = gpu_fused_runs(plan_pipeline(mixed, 2, 20, 4, split=[1, 3]))
    assert not fused and "not one run of blocks of one cell and size" in why[1]
    params = engine.init_net_params(net, seed=0)
    with pytest.raises(BackendError, match="fuse_pools=True folds the pools into a wavefront schedule's kernel"):
        PipelineProgram(net, params, plan_pipeline(net, 2, 100, 64), fuse_pools=True)


def test_a_tuned_plan_comes_back_from_the_cache(tmp_path, monkeypatch):
    """tune_pipeline writes its winner to pipelines.json (on a GPU machine: tests/gpu/test_pipeline_gpu.py); here an
    entry as it writes them, read back for the same net, sizes, backend and device only."""
    from engine.multigpu import PIPELINE_CACHE, tuned_key, tuned_plan
    from engine.schedules.autotune import cache_path, write_entry
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    net = engine.net_preset("stack")
    assert tuned_plan(net, 2, 200, 128, device="Test GPU") is None
    write_entry(tuned_key(net, 2, 200, 128, "persistent", False, "Test GPU"),
                {"split": [8, 8], "chunk": 8, "ms": 127.8, "busy_ms": [117.9, 117.6], "repeats": 7, "candidates": 5},
                cache_path(PIPELINE_CACHE))
    plan = tuned_plan(net, 2, 200, 128, device="Test GPU")
    assert plan.chunk == 8 and [len(g) for g in plan.split] == [8, 8] and plan.measured.ms == 127.8
    assert "tuned on Test GPU: the fastest of 5 measured candidates" in plan.describe()
    assert "measured: 127.80 ms" in plan.describe()
    for other in ({"device": "Other GPU"}, {"fuse_pools": True}, {"backend": "graph"}):
        assert tuned_plan(net, 2, 200, 128, **{"device": "Test GPU", **other}) is None
    assert tuned_plan(net, 2, 100, 128, device="Test GPU") is None
    assert tuned_plan(engine.net_preset("stack", hidden_size=512), 2, 200, 128, device="Test GPU") is None
    write_entry(tuned_key(net, 2, 200, 128, "persistent", False, "Test GPU"), {"split": [3, 3], "chunk": 8},
                cache_path(PIPELINE_CACHE))
    assert tuned_plan(net, 2, 200, 128, device="Test GPU") is None          # unusable: ignored, with a warning
