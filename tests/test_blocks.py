"""Networks of blocks (issue #11): cell layers (forward or bidirectional, concatenated or summed) and pooling over
time, checked on the CPU against torch.nn in float64 (the DeepSpeech block: LSTM layers, max-pool over time by 2,
LSTM layers; a bidirectional LSTM), against NumPy for the mean pool and the summed directions, through JSON, and
with bad input named by block and field.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine.errors import BackendError, CellGraphError
from engine.nets.data import Layers, Net, Pool
from engine.nets.pooling import pool_over_time
from engine.network import Network
from engine.params import Params
from engine.torch_layout import to_torch_state_dict

TOL = 1e-10


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: networks are not checked against torch.nn "
                                               "(pip install -r requirements-test.txt)")


def torch_weights(block: Layers, params: dict, block_input: int, suffix: str = "") -> dict:
    """One Layers block's parameters (one direction) as a torch state_dict: layer l's keys end in _l{l}{suffix}."""
    layout = engine.preset(block.cell.name).torch
    out = {}
    for layer in range(block.num_layers):
        network = block.layer_network(layer, block_input)
        one = to_torch_state_dict(network, Params([params[suffix and "backward" or "forward"].layers[layer]]), layout)
        out.update({key.replace("_l0", f"_l{layer}{suffix}"): value for key, value in one.items()})
    return out


def load(torch, module, weights: dict):
    module.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()})
    return module


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_deepspeech_block_matches_torch(torch, cell):
    net = engine.net_preset("deepspeech", input_size=6, hidden_size=5, layers=2, cell=cell)
    assert [type(b).__name__ for b in net.blocks] == ["Layers", "Pool", "Layers"] and net.output_size == 5
    params = engine.init_net_params(net, seed=4)
    x = np.random.default_rng(5).standard_normal((9, 3, 6))
    ours = engine.run_net(net, params, x)
    kind = getattr(torch.nn, cell.upper())
    first = load(torch, kind(6, 5, 2).double(), torch_weights(net.blocks[0], params.blocks[0], 6))
    second = load(torch, kind(5, 5, 2).double(), torch_weights(net.blocks[2], params.blocks[2], 5))
    with torch.no_grad():
        a, _ = first(torch.from_numpy(x))
        pooled = torch.nn.functional.max_pool1d(a.permute(1, 2, 0), kernel_size=2, stride=2).permute(2, 0, 1)
        b, _ = second(pooled.contiguous())
    assert ours.outputs.shape == (4, 3, 5) == tuple(b.shape)                     # 9 steps -> 4 after the pool
    np.testing.assert_allclose(ours.block_outputs[1], pooled.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(ours.outputs, b.numpy(), rtol=0, atol=TOL)


def test_a_bidirectional_lstm_matches_torch(torch):
    block = Layers("lstm", 5, num_layers=2, direction="bidirectional")
    net = Net(4, (block,))
    assert net.output_size == 10 and block.layer_network(1, 4).input_size == 10
    params = engine.init_net_params(net, seed=2)
    x = np.random.default_rng(3).standard_normal((7, 2, 4))
    weights = torch_weights(block, params.blocks[0], 4) | torch_weights(block, params.blocks[0], 4, "_reverse")
    module = load(torch, torch.nn.LSTM(4, 5, 2, bidirectional=True).double(), weights)
    with torch.no_grad():
        want, _ = module(torch.from_numpy(x))
    np.testing.assert_allclose(engine.run_net(net, params, x).outputs, want.numpy(), rtol=0, atol=TOL)


def test_summed_directions_are_the_two_halves_added():
    concat = Net(4, (Layers("gru", 6, direction="bidirectional"),))
    summed = Net(4, (Layers("gru", 6, direction="bidirectional", merge="sum"),))
    params = engine.init_net_params(concat, seed=1)
    x = np.random.default_rng(0).standard_normal((5, 3, 4))
    both = engine.run_net(concat, params, x).outputs
    np.testing.assert_allclose(engine.run_net(summed, params, x).outputs, both[..., :6] + both[..., 6:], atol=1e-14)
    assert summed.output_size == 6 and concat.output_size == 12


def test_mean_pool_with_window_and_stride():
    x = np.random.default_rng(1).standard_normal((10, 2, 3))
    pool = Pool("mean", window=3, stride=2)
    got = pool_over_time(x, pool)
    assert got.shape == (4, 2, 3) and pool.steps_out(10) == 4
    np.testing.assert_allclose(got, np.stack([x[t * 2:t * 2 + 3].mean(axis=0) for t in range(4)]))
    np.testing.assert_allclose(pool_over_time(x, Pool("max", 1, 1)), x)


def test_json_round_trip_with_a_custom_cell_embedded():
    custom = engine.preset("mgu").cell.replace(name="my_mgu")
    net = Net(8, (Layers(custom, 6, 2, name="mine"), Pool("mean", 2, 1), Layers("lstm", 4, direction="bidirectional",
                                                                             merge="sum")), name="mixed", doc="test")
    data = engine.net_to_dict(net)
    assert data["blocks"][0]["cell"]["name"] == "my_mgu" and data["blocks"][2]["cell"] == "lstm"
    assert engine.net_from_json(json.dumps(data)) == net
    x = np.random.default_rng(0).standard_normal((6, 2, 8))
    out = engine.run_net(net, engine.init_net_params(net, seed=0), x).outputs
    assert out.shape == (5, 2, 4) and np.isfinite(out).all()


def test_bad_nets_name_the_block_and_field(tmp_path):
    with pytest.raises(BackendError, match=r"block 1 \('lstm x1'\) expects input size 7, but block 0 \('lstm x2'\) "
                                           r"gives 5"):
        Net(3, (Layers("lstm", 5, 2), Layers("lstm", 4, input_size=7)))
    with pytest.raises(BackendError, match=r"block 1 \('pool'\): the pool window 4 is longer than the 3 step"):
        net = Net(3, (Layers("lstm", 5), Pool("max", 4, 2, name="pool")))
        engine.run_net(net, engine.init_net_params(net), np.zeros((3, 1, 3)))
    with pytest.raises(BackendError, match=r"block 0 .*direction must be one of forward, bidirectional"):
        Net(3, (Layers("lstm", 5, direction="backwards"),))
    with pytest.raises(BackendError, match="window must be a positive integer"):
        Net(3, (Layers("lstm", 5), Pool("max", 0)))
    with pytest.raises(BackendError, match=r"block 0 .*combines the input with hidden-sized values"):
        from test_input_is_hidden import mut1
        Net(3, (Layers(mut1(), 5),))
    with pytest.raises(CellGraphError, match=r"did you mean 'lstm'"):
        Layers("lstmm", 5)
    data = engine.net_to_dict(Net(3, (Layers("lstm", 5),)))
    data["blocks"][0]["cell"] = "gruu"
    with pytest.raises(CellGraphError, match=r"field 'blocks\[0\]\.cell': unknown preset 'gruu'\n  hint: did you "
                                             r"mean 'gru'"):
        engine.net_from_dict(data)
    data["blocks"][0] = {"kind": "pool", "windw": 2}
    with pytest.raises(BackendError, match=r"'blocks\[0\]\.windw' is not a field of a pool block"):
        engine.net_from_dict(data)
    (tmp_path / "net.json").write_text("{not json")
    with pytest.raises(BackendError, match="net.json' is not valid JSON"):
        engine.load_net(tmp_path / "net.json")
    with pytest.raises(BackendError, match="unknown network preset 'deepspeach'; hint: did you mean 'deepspeech'"):
        engine.net_preset("deepspeach")
    net = Net(3, (Layers("lstm", 5),))
    with pytest.raises(BackendError, match=r"argument 'x' must have shape \(T, B, 3\)"):
        engine.run_net(net, engine.init_net_params(net), np.zeros((4, 2, 5)))
    wrong = engine.init_net_params(Net(3, (Layers("lstm", 6),)))
    with pytest.raises(BackendError, match=r"block 0 \('lstm x1'\), forward layer 0"):
        engine.run_net(net, wrong, np.zeros((4, 2, 3)))


def test_a_projected_lstm_block_feeds_the_next_block_its_projection():
    from test_projection import lstm_proj
    net = Net(4, (Layers(lstm_proj(), 8, 2, proj_size=3), Pool("max", 2, 2), Layers("gru", 5)))
    assert net.sizes == (4, 3, 3) and net.output_size == 5
    out = engine.run_net(net, engine.init_net_params(net, seed=0), np.random.default_rng(0).standard_normal((6, 2, 4)))
    assert out.block_outputs[0].shape == (6, 2, 3) and out.outputs.shape == (3, 2, 5)
    assert isinstance(Layers("lstm", 5).layer_network(0, 3), Network)


def test_the_net_command_describes_edits_and_runs_a_net(capsys, tmp_path):
    from engine.cli import main
    assert main(["net", "deepspeech", "-I", "8", "-H", "6", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    data["blocks"][1]["op"] = "mean"                                    # edit the JSON, run the file
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "o.npz"
    assert main(["net", str(path), "--run", "-T", "9", "-B", "2", "--seed", "3", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "block 1 'pool': mean over 2 step(s), stride 2; reads (9, B, 6)" in text
    assert "block 2 'rnn_b': 4 x lstm, hidden 6, forward; reads (4, B, 6)" in text
    net = engine.load_net(path)
    x = np.random.default_rng(4).standard_normal((9, 2, 8))
    want = engine.run_net(net, engine.init_net_params(net, seed=3), x).outputs
    np.testing.assert_allclose(np.load(out)["outputs"], want)
    assert main(["net", "deepspeach"]) == 2
    assert "did you mean 'deepspeech'" in capsys.readouterr().err
    assert main(["net", "deepspeech", "-T", "1", "-I", "4", "-H", "4"]) == 2
    assert "the pool window 2 is longer than the 1 step(s)" in capsys.readouterr().err
    assert main(["net", str(path), "-H", "5"]) == 2
    assert "edit the sizes in the JSON file" in capsys.readouterr().err
    assert main(["net", "deepspeech", "--run", "--fuse-pools", "-o", str(out)]) == 2    # the reference folds nothing
    assert "fuse_pools=True folds a pool into a wavefront schedule's kernel" in capsys.readouterr().err


def test_the_pipeline_flags_of_the_net_command_name_what_is_missing(capsys, monkeypatch):
    from engine import backends
    from engine.cli import main
    assert main(["net", "deepspeech", "--gpus", "2", "-T", "100", "-B", "64", "--chunk", "20"]) == 0
    assert "chunks of 20 step(s)" in capsys.readouterr().out
    assert main(["net", "deepspeech", "--tune"]) == 2
    assert "--measure, --tune and --chunk apply to a pipeline plan\n  hint: add --gpus N" in capsys.readouterr().err
    assert main(["net", "deepspeech", "--gpus", "2", "--run", "--measure"]) == 2
    assert "leave out --run" in capsys.readouterr().err
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "CuPy sees no CUDA device"))
    assert main(["net", "deepspeech", "--gpus", "2", "-T", "100", "-B", "64", "--measure"]) == 2
    assert ("--measure runs the plan on 2 GPU(s), but this machine has none usable: CuPy sees no CUDA device"
            in capsys.readouterr().err)
    # On a GPU machine the plan --tune kept (engine.multigpu.tuner.tuned_plan, by the machine's GPU name) is shown too.
    from engine import multigpu
    asked = []

    def cached(net, gpus, steps, batch, **options):
        asked.append((net.name, gpus, steps, batch, options))
        plan = multigpu.plan_pipeline(net, gpus, steps, batch, split=[4, 4], chunk=32)
        plan.measured = multigpu.PipelineMeasurement(7.1, [5.3, 3.0], 7)
        return plan
    monkeypatch.setattr(backends, "gpu_status", lambda: (True, "GPU Test"))
    monkeypatch.setattr(multigpu.tuner, "tuned_plan", cached)
    assert main(["net", "deepspeech", "--gpus", "2", "-T", "100", "-B", "64"]) == 0
    out = capsys.readouterr().out
    assert "the tuned plan on this machine" in out and "chunks of 32 step(s)" in out and "measured: 7.10 ms" in out
    assert asked == [("deepspeech", 2, 100, 64, {"backend": "persistent", "fuse_pools": False})]


def test_a_prepared_net_runs_again_and_refuses_unknown_backends():
    net = engine.net_preset("deepspeech", input_size=4, hidden_size=3, layers=1)
    params = engine.init_net_params(net, seed=0)
    program = engine.prepare_net(net, params)
    x = np.random.default_rng(0).standard_normal((6, 2, 4))
    np.testing.assert_array_equal(program.run(x).outputs, engine.run_net(net, params, x).outputs)
    with pytest.raises(BackendError, match="a net runs on one of reference, auto, fused, graph, persistent, "
                                           "not 'naive'"):
        engine.prepare_net(net, params, "naive")
