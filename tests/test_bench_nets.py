"""The harness's network configurations (issue #11, engine/bench/nets.py) without a GPU: `deepspeech` parses as a
net configuration, the CLI lists it and refuses to run without a GPU, and bench_net measures a small DeepSpeech-shaped
net on the CPU: cuDNN's row as torch modules (the engine's weights, max_pool1d between them) and the engine's
reference backend in float32, both checked against the float64 reference of the whole net before they are timed;
the GPU rows and a cell cuDNN has no form of say why they did not run; a row whose output is wrong is not timed."""
from __future__ import annotations

import pytest

import engine
from engine.bench import NET_ANCHORS, NetBenchConfig, nets, parse_configs
from engine.bench.nets import bench_net, net_flops, net_implementations, net_markdown_table
from engine.errors import BackendError
from engine.flops import network_flops


@pytest.fixture
def no_gpu(monkeypatch):
    from engine import backends
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no CUDA device (test)"))


TINY = NetBenchConfig("tiny", "deepspeech", input_size=5, hidden_size=7, layers=2, steps=8, batch=3)


def test_deepspeech_is_a_net_configuration():
    (config,) = parse_configs(["deepspeech"])
    assert config == NET_ANCHORS["deepspeech"]
    assert (config.input_size, config.hidden_size, config.layers, config.steps, config.batch) == (512, 512, 4, 100, 64)
    net = config.build("gru")
    assert [type(b).__name__ for b in net.blocks] == ["Layers", "Pool", "Layers"]
    assert net.blocks[0].cell.name == "gru" and net.blocks[2].num_layers == 4
    with pytest.raises(BackendError, match="networks: deepspeech"):
        parse_configs(["deepspeeh"])


def test_the_cli_lists_it_and_needs_a_gpu_to_run_it(no_gpu, capsys):
    from engine.cli import main
    assert main(["bench", "--list-configs"]) == 0
    assert "deepspeech" in capsys.readouterr().out
    assert main(["bench", "--config", "deepspeech"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_net_flops_count_each_block_at_its_steps():
    net = TINY.build("lstm")
    first = network_flops(engine.Network(net.blocks[0].cell, 5, 7, 2), 8, 3)["total"]
    second = network_flops(engine.Network(net.blocks[2].cell, 7, 7, 2), 4, 3)["total"]
    assert net_flops(net, 8, 3) == first + second


def test_rows_of_a_net_benchmark():
    assert net_implementations(None) == ["cudnn-fp32", "fused", "graph", "persistent", "auto", "persistent-fused-pools",
                                         "graph-fused-pools"]
    assert net_implementations(["naive", "persistent", "cudnn-fp32"]) == ["persistent", "cudnn-fp32"]
    with pytest.raises(BackendError, match="none of the implementations naive runs a network"):
        net_implementations(["naive"])


@pytest.fixture(scope="module")
def cpu_net():
    pytest.importorskip("torch", reason="PyTorch is not installed: the cuDNN row is not checked on the CPU")
    lstm = bench_net("lstm", "lstm", TINY, ["cudnn-fp32", "reference", "persistent"], reps=20, warmup=1, buffers=2,
                     device="cpu")
    peephole = bench_net("peephole_lstm", "peephole_lstm", TINY, ["cudnn-fp32", "reference"], reps=20, warmup=1,
                         buffers=2, device="cpu")
    return lstm, peephole


def test_right_rows_are_timed_against_the_whole_nets_reference(cpu_net):
    lstm, _ = cpu_net
    rows = {e["name"]: e for e in lstm["implementations"]}
    assert lstm["block_steps"] == [8, 8, 4] and lstm["net"]["name"] == "deepspeech"
    for name in ("cudnn-fp32", "reference"):
        e = rows[name]
        assert e["status"] == "ok", e["reason"]
        assert e["reps"] == 20 and e["min_ms"] <= e["median_ms"] <= e["max_ms"]
        assert e["error"]["rel"] < 1e-5 and e["error"]["within_tolerance"]
        assert len(e["divergence"]["vs_reference"]["max"]) == 4            # the pooled sequence: 4 steps
        assert e["tf32_flags"] == {"torch.backends.cuda.matmul.allow_tf32": False,
                                   "torch.backends.cudnn.allow_tf32": False}
    ratio = rows["reference"]["speedup"]["vs_cudnn_fp32"]
    assert ratio == pytest.approx(rows["cudnn-fp32"]["median_ms"] / rows["reference"]["median_ms"])
    assert rows["persistent"]["status"] == "unavailable" and "needs a GPU" in rows["persistent"]["reason"]
    table = net_markdown_table({"nets": [lstm]})
    assert "| lstm | tiny | lstm x2 -> max-pool 2/2 -> lstm x2 | 5,7,8,3 |" in table and "(1.00x)" in table


def test_a_cell_cudnn_lacks_is_said(cpu_net):
    _, peephole = cpu_net
    rows = {e["name"]: e for e in peephole["implementations"]}
    assert rows["cudnn-fp32"]["status"] == "unavailable"
    assert "cuDNN has no form of cell 'peephole_lstm'" in rows["cudnn-fp32"]["reason"]
    assert rows["reference"]["status"] == "ok" and rows["reference"]["speedup"]["vs_cudnn_fp32"] is None


def test_a_wrong_row_is_not_timed(monkeypatch):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    real = nets.cudnn_net

    def off_by_a_little(torch, net, params, device):
        forward = real(torch, net, params, device)
        return lambda x: forward(x) * 1.01
    monkeypatch.setattr(nets, "cudnn_net", off_by_a_little)
    result = bench_net("lstm", "lstm", TINY, ["cudnn-fp32"], reps=20, warmup=1, buffers=2, device="cpu")
    (row,) = result["implementations"]
    assert row["status"] == "failed" and "exceeds" in row["reason"] and "median_ms" not in row
