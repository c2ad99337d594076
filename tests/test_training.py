"""Training any cell (issue #13, item 3): the generated tasks, the readout loss and its gradients, Adam and clipping,
the loop (learns, deterministic, stops cleanly) and `python -m engine train`. CPU, float64."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.autodiff import bptt
from engine.backends.reference import run as reference_run
from engine.cli import main
from engine.dsl import W, b, cell, tanh, v
from engine.training import TrainingError, compare, load_results, save_results, train
from engine.training.loss import init_readout, log_softmax, readout_loss
from engine.training.optim import Adam, clip_by_global_norm, global_norm
from engine.training.tasks import COPY_SYMBOLS, Batch, copy_length, corpus, get_task, tasks

ROOT = Path(__file__).resolve().parents[1]


# ---- tasks ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(tasks()))
def test_every_task_is_a_pure_function_of_the_seed(name, request):
    if name == "jsb":
        request.getfixturevalue("jsb_subset")       # a few chorales, not the whole corpus
    task = get_task(name)
    first, again = (task.batch(np.random.default_rng(7), 5, 12) for _ in range(2))
    other = task.batch(np.random.default_rng(8), 5, 12)
    for a, b_ in ((first.x, again.x), (first.targets, again.targets), (first.loss_steps, again.loss_steps)):
        np.testing.assert_array_equal(a, b_)
    assert not np.array_equal(first.x, other.x)
    assert first.x.shape == (12, 5, task.input_size) and first.x.dtype == np.float64
    steps = len(first.loss_steps)
    assert first.targets.shape == {"mse": (steps, 5, 1), "bce": (steps, 5, task.output_size)}.get(task.loss,
                                                                                                 (steps, 5))
    if task.loss == "cross_entropy":
        assert first.targets.min() >= 0 and first.targets.max() < task.output_size
    assert np.all(np.diff(first.loss_steps) > 0) and first.loss_steps[-1] == 11


def test_adding_target_is_the_sum_of_the_two_marked_values():
    batch = get_task("adding").batch(np.random.default_rng(0), 64, 10)
    values, markers = batch.x[..., 0], batch.x[..., 1]                  # (T, B)
    assert np.all(markers.sum(axis=0) == 2)
    assert np.all(markers[:5].sum(axis=0) == 1) and np.all(markers[5:].sum(axis=0) == 1)   # one in each half
    assert np.all((values >= 0) & (values < 1))
    np.testing.assert_allclose(batch.targets[0, :, 0], (values * markers).sum(axis=0), rtol=0, atol=1e-15)
    assert list(batch.loss_steps) == [9]


def test_adding_baseline_is_the_variance_of_the_sum():
    """Predicting the mean sum (1) scores the variance of U(0,1) + U(0,1) = 1/6; checked on many sequences."""
    task = get_task("adding")
    targets = task.batch(np.random.default_rng(1), 20000, 4).targets
    assert task.baseline == pytest.approx(1 / 6)
    assert np.mean((targets - 1.0) ** 2) == pytest.approx(1 / 6, abs=0.005)


def test_copy_shows_symbols_then_the_marker_then_asks_for_them():
    T, B = 20, 6
    batch = get_task("copy").batch(np.random.default_rng(0), B, T)
    n = copy_length(T)
    ids = batch.x.argmax(axis=-1)                                       # (T, B)
    assert n == 4 and np.all(batch.x.sum(axis=-1) == 1)                # one-hot
    np.testing.assert_array_equal(ids[:n], batch.targets)              # the symbols shown are the ones asked for
    assert np.all(ids[T - n - 1] == COPY_SYMBOLS + 1)                  # the go marker
    assert np.all(ids[n:T - n - 1] == COPY_SYMBOLS) and np.all(ids[T - n:] == COPY_SYMBOLS)   # blanks
    assert list(batch.loss_steps) == list(range(T - n, T))


def test_parity_targets_are_the_parity_of_the_bits_so_far():
    bits_batch = get_task("parity").batch(np.random.default_rng(0), 8, 9)
    bits = bits_batch.x[..., 0].astype(int)                            # (T, B)
    for t in range(9):
        np.testing.assert_array_equal(bits_batch.targets[t], bits[:t + 1].sum(axis=0) % 2)
    end = get_task("parity-end").batch(np.random.default_rng(0), 8, 9)
    np.testing.assert_array_equal(end.targets[0], bits.sum(axis=0) % 2)   # same bits from the same seed
    assert list(end.loss_steps) == [8]


def test_chars_targets_are_the_next_character_of_the_text():
    text, vocab = corpus()
    assert 10_000 < len(text) < 40_000 and len(vocab) == get_task("chars").input_size
    cut = int(len(text) * 0.9)
    for split, part in (("train", text[:cut]), ("eval", text[cut:])):
        batch = get_task("chars").batch(np.random.default_rng(3), 4, 30, split=split)
        for column in range(4):
            shown = "".join(vocab[i] for i in batch.x[:, column].argmax(axis=-1))
            wanted = "".join(vocab[i] for i in batch.targets[:, column])
            assert shown[1:] == wanted[:-1] and (shown + wanted[-1]) in part


def test_unknown_task_names_the_closest_and_lists_the_known():
    with pytest.raises(TrainingError, match=r"unknown task 'addng'.*did you mean 'adding'.*known tasks: adding"):
        get_task("addng")


def test_too_short_sequences_are_refused_with_the_minimum():
    with pytest.raises(TrainingError, match=r"seq_len must be an integer of at least 3.*copy"):
        get_task("copy").batch(np.random.default_rng(0), 2, 2)


# ---- loss ----------------------------------------------------------------------------------------------------------

def loss_case(kind: str, rng):
    T, B, H, O = 5, 3, 4, (1 if kind == "mse" else 6)
    steps = np.array([1, 4]) if kind == "mse" else np.arange(T)
    targets = rng.standard_normal((len(steps), B, 1)) if kind == "mse" else rng.integers(0, O, (len(steps), B))
    outputs = rng.standard_normal((T, B, H))
    readout = init_readout(O, H, rng)
    readout = {k: w * 3 for k, w in readout.items()}                  # logits of a few units: softmax not flat
    return outputs, readout, Batch(np.zeros((T, B, 1)), targets, steps)


@pytest.mark.parametrize("kind", ["mse", "cross_entropy"])
def test_loss_gradients_match_finite_differences(kind):
    rng = np.random.default_rng(0)
    outputs, readout, batch = loss_case(kind, rng)
    scored = readout_loss(outputs, readout, batch, kind)
    eps = 1e-6

    def numeric(array, index):
        saved = array[index]
        array[index] = saved + eps
        up = readout_loss(outputs, readout, batch, kind).loss
        array[index] = saved - eps
        down = readout_loss(outputs, readout, batch, kind).loss
        array[index] = saved
        return (up - down) / (2 * eps)

    for name in ("W_out", "b_out"):
        for index in np.ndindex(readout[name].shape):
            assert scored.d_readout[name][index] == pytest.approx(numeric(readout[name], index), abs=1e-9)
    for index in np.ndindex(outputs.shape):                            # zero where the loss does not read
        assert scored.d_outputs[index] == pytest.approx(numeric(outputs, index), abs=1e-9)
    assert np.any(scored.d_outputs != 0)


def test_cross_entropy_is_stable_for_huge_logits_and_log_classes_when_flat():
    np.testing.assert_allclose(log_softmax(np.array([1000.0, 0.0, -1000.0])), [0.0, -1000.0, -2000.0], atol=1e-12)
    rng = np.random.default_rng(1)
    outputs, readout, batch = loss_case("cross_entropy", rng)
    huge = {k: w * 1e5 for k, w in readout.items()}
    scored = readout_loss(outputs, huge, batch, "cross_entropy")
    assert np.isfinite(scored.loss) and all(np.all(np.isfinite(g)) for g in scored.d_readout.values())
    flat = {k: np.zeros_like(w) for k, w in readout.items()}
    assert readout_loss(outputs, flat, batch, "cross_entropy").loss == pytest.approx(np.log(6))


def test_accuracy_counts_the_argmax():
    outputs = np.zeros((1, 4, 2))
    outputs[0, :, 0] = [1, -1, 1, -1]
    readout = {"W_out": np.array([[1.0, 0.0], [-1.0, 0.0]]), "b_out": np.zeros(2)}   # class 0 iff h0 > 0
    batch = Batch(np.zeros((1, 4, 1)), np.array([[0, 1, 1, 1]]), np.array([0]))
    assert readout_loss(outputs, readout, batch, "cross_entropy").metric == 0.75


# ---- optimiser -----------------------------------------------------------------------------------------------------

def test_adam_matches_the_first_two_steps_by_hand():
    # theta0 = 1, g1 = 0.5, g2 = -1, lr = 0.1, beta1 0.9, beta2 0.999, eps 1e-8.
    # Step 1: m = 0.05, v = 0.00025; bias-corrected m^ = 0.5, v^ = 0.25, so theta1 = 1 - 0.1 * 0.5 / (0.5 + 1e-8).
    # Step 2: m = 0.9 * 0.05 - 0.1 = -0.055, v = 0.999 * 0.00025 + 0.001 = 0.00124975;
    #         m^ = m / (1 - 0.81), v^ = v / (1 - 0.998001); theta2 = theta1 - 0.1 * m^ / (sqrt(v^) + 1e-8).
    theta = {"w": np.array([1.0])}
    adam = Adam(lr=0.1)
    adam.step([theta], [{"w": np.array([0.5])}])
    assert theta["w"][0] == pytest.approx(1 - 0.1 * 0.5 / (0.5 + 1e-8), abs=1e-15)
    theta1 = theta["w"][0]
    adam.step([theta], [{"w": np.array([-1.0])}])
    expected = theta1 - 0.1 * (-0.055 / 0.19) / (np.sqrt(0.00124975 / 0.001999) + 1e-8)
    assert theta["w"][0] == pytest.approx(expected, abs=1e-12)
    assert theta["w"][0] == pytest.approx(0.93661035424, abs=1e-10)
    assert adam.t == 2


def test_adam_updates_every_group_in_place():
    layer, readout = {"W": np.ones((2, 3))}, {"b_out": np.zeros(2)}
    held = layer["W"]
    Adam(lr=0.01).step([layer, readout], [{"W": np.ones((2, 3))}, {"b_out": -np.ones(2)}])
    assert layer["W"] is held
    np.testing.assert_allclose(layer["W"], 0.99, atol=1e-9)
    np.testing.assert_allclose(readout["b_out"], 0.01, atol=1e-9)


def test_clipping_scales_all_gradients_to_the_global_norm():
    grads = [{"a": np.array([3.0])}, {"b": np.array([0.0, 4.0])}]
    clipped, norm = clip_by_global_norm(grads, 2.0)
    assert norm == 5.0 and global_norm(clipped) == pytest.approx(2.0)
    np.testing.assert_allclose(clipped[0]["a"], [1.2])
    np.testing.assert_allclose(clipped[1]["b"], [0.0, 1.6])
    assert clip_by_global_norm(grads, 10.0)[0] is grads                # under the bound: untouched
    assert clip_by_global_norm(grads, None)[0] is grads and clip_by_global_norm(grads, 0)[0] is grads


# ---- the loop ------------------------------------------------------------------------------------------------------

def test_the_loss_gradient_through_bptt_matches_finite_differences():
    """The loop's chain, readout d_outputs into bptt, gives the gradient of the whole loss."""
    net = engine.Network(engine.preset("lstm").cell, input_size=2, hidden_size=3)
    params = engine.init_params(net, seed=0)
    rng = np.random.default_rng(0)
    batch = get_task("adding").batch(rng, 2, 4)
    readout = init_readout(1, 3, rng)

    def loss():
        return readout_loss(reference_run(net, params, batch.x).outputs, readout, batch, "mse")

    grads = bptt(net, params, batch.x, d_outputs=loss().d_outputs)
    eps = 1e-6
    for name in ("W_hi", "b_if", "W_ig"):
        array = params[0][name]
        for index in list(np.ndindex(array.shape))[:4]:
            saved = array[index]
            array[index] = saved + eps
            up = loss().loss
            array[index] = saved - eps
            down = loss().loss
            array[index] = saved
            assert grads.params[0][name][index] == pytest.approx((up - down) / (2 * eps), abs=1e-8)


@pytest.mark.parametrize("preset", ["lstm", "gru"])
def test_lstm_and_gru_learn_the_adding_problem(preset):
    task = get_task("adding")
    result = train(preset, task, hidden_size=16, steps=300, batch=32, seq_len=10, lr=0.01, clip=1.0, seed=0,
                   eval_every=50)
    assert result.eval_metrics[0] > task.baseline * 0.9               # untrained: no better than the mean
    assert result.final_metric < task.baseline / 4                     # 1/6 -> below 0.042 on held-out sequences
    assert len(result.losses) == 300 and result.eval_steps == [0, 50, 100, 150, 200, 250, 300]
    assert np.mean(result.losses[-50:]) < np.mean(result.losses[:50]) / 3
    assert result.seconds < 60


@pytest.mark.parametrize("preset,task,hidden,seq_len", [("gru", "parity", 8, 8), ("lstm", "copy", 16, 5)])
def test_parity_and_copy_are_learnt_at_tiny_size(preset, task, hidden, seq_len):
    result = train(preset, task, hidden_size=hidden, steps=150, batch=16, seq_len=seq_len, lr=0.03, seed=0)
    assert result.eval_metrics[0] < 0.6 and result.final_metric > 0.95


def test_a_cell_of_ones_own_design_trains():
    @cell
    def leaky_tanh(x, h):
        h_next = tanh(W("W") @ x + v("u") * h + b("b"))
        return {"h": h_next}

    result = train(leaky_tanh, "parity", hidden_size=8, steps=60, batch=16, seq_len=6, lr=0.03, seed=0)
    assert result.cell == "leaky_tanh" and np.all(np.isfinite(result.losses))
    assert np.mean(result.losses[-10:]) < np.mean(result.losses[:10])


def test_same_seed_gives_identical_curves_and_params():
    settings = dict(hidden_size=6, steps=20, batch=8, seq_len=6, lr=0.02, seed=3, eval_every=5)
    first, again = train("lstm", "parity", **settings), train("lstm", "parity", **settings)
    assert first.losses == again.losses and first.eval_metrics == again.eval_metrics
    assert first.eval_losses == again.eval_losses
    for name, value in first.params.flat().items():
        np.testing.assert_array_equal(value, again.params.flat()[name])
    np.testing.assert_array_equal(first.readout["W_out"], again.readout["W_out"])
    strip = lambda r: {k: v for k, v in r.to_dict().items() if k != "seconds"}     # noqa: E731
    assert strip(first) == strip(again) and first.key == again.key
    other = train("lstm", "parity", **{**settings, "seed": 4})
    assert other.losses != first.losses and other.key != first.key


def test_compare_trains_each_cell_on_the_same_data():
    settings = dict(hidden_size=4, steps=6, batch=4, seq_len=5, seed=1, eval_every=3)
    calls = []
    lstm, gru = compare(["lstm", engine.preset("gru").cell], "adding",
                        on_progress=lambda *a: calls.append(a), **settings)
    assert (lstm.cell, gru.cell) == ("lstm", "gru")
    assert lstm.losses == train("lstm", "adding", **settings).losses   # as if trained alone
    assert [c[:2] for c in calls] == [(i, 12) for i in range(1, 13)]
    assert [c[2] for c in calls] == lstm.losses + gru.losses


def test_compare_refuses_a_bad_cell_before_training_any():
    with pytest.raises(TrainingError, match="cannot train a int"):
        compare(["lstm", 3], "adding", hidden_size=4, steps=1000)


def test_progress_is_reported_every_step():
    calls = []
    result = train("gru", "adding", hidden_size=4, steps=5, batch=4, seq_len=4, on_progress=lambda *a: calls.append(a))
    assert calls == [(step, 5, loss) for step, loss in zip(range(1, 6), result.losses)]


def test_a_diverging_run_stops_naming_the_step_with_a_hint():
    with pytest.raises(TrainingError, match=r"training stopped at step \d+ of 5.*hint: lower the learning rate") as e:
        train("lstm", "adding", hidden_size=4, steps=5, batch=4, seq_len=4, lr=1e300)
    assert e.value.step is not None


@pytest.mark.parametrize("settings,message", [
    (dict(steps=0), "steps must be an integer of at least 1"),
    (dict(lr=-1.0), "lr must be a positive number"),
    (dict(lr=float("nan")), "lr must be a positive number"),
    (dict(clip=-1.0), "clip must be a non-negative number"),
    (dict(seq_len=1), "seq_len must be an integer of at least 2, got 1; hint: seq_len >= 2 for task 'adding'"),
    (dict(hidden_size=0), "hidden_size must be an integer of at least 1"),
    (dict(hidden_size=None), "hidden_size is needed"),
    (dict(device="tpu"), "device must be one of cpu, gpu, got 'tpu'"),
])
def test_bad_settings_are_refused_with_a_hint(settings, message):
    with pytest.raises(TrainingError, match=message) as e:
        train("lstm", "adding", **{"hidden_size": 4, **settings})
    assert "; hint: " in str(e.value)


def test_gpu_training_without_a_gpu_is_refused_before_any_cell_trains():
    from engine.backends import gpu_status
    if gpu_status()[0]:
        pytest.skip("this machine has a GPU: tests/gpu/test_fused_training_gpu.py trains there")
    progress = []
    with pytest.raises(TrainingError, match=r"device='gpu' needs a CUDA GPU with CuPy: .*; hint: device='cpu'"):
        compare(["lstm", "gru"], "adding", hidden_size=4, steps=2, device="gpu",
                on_progress=lambda *a: progress.append(a))
    assert progress == []


def test_a_network_is_trained_as_given_and_must_fit_the_task():
    net = engine.Network(engine.preset("gru").cell, input_size=1, hidden_size=5, num_layers=2)
    result = train(net, "parity", steps=3, batch=4, seq_len=4)
    assert len(result.params.layers) == 2 and result.settings["num_layers"] == 2
    assert result.params[1]["W_ir"].shape == (5, 5)
    with pytest.raises(TrainingError, match=r"input_size is 1, but task 'adding' gives inputs of size 2"):
        train(net, "adding", steps=3)


def test_results_round_trip_through_json(tmp_path):
    results = compare(["lstm", "gru"], "parity", hidden_size=3, steps=4, batch=2, seq_len=3)
    path = tmp_path / "results.json"
    save_results(results, path)
    loaded = load_results(path)
    assert [r.to_dict() for r in loaded] == [r.to_dict() for r in results]
    assert engine.from_dict(loaded[0].cell_json) == engine.preset("lstm").cell
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TrainingError, match="not a training results file"):
        load_results(tmp_path / "bad.json")


def test_engine_exports_train_compare_and_tasks():
    assert engine.train is train and engine.compare is compare
    assert engine.tasks() == ["adding", "copy", "parity", "parity-end", "chars", "jsb"]
    assert {"train", "compare", "tasks"} <= set(engine.__all__)


# ---- the CLI -------------------------------------------------------------------------------------------------------

def test_cli_trains_and_compares_and_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    cell_file = tmp_path / "mine.json"
    engine.save(engine.preset("mgu").cell, cell_file)
    assert main(["train", "lstm", str(cell_file), "--task", "parity", "--steps", "6", "--hidden-size", "4",
                 "--seq-len", "4", "--batch", "4", "--seed", "2", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("task parity: accuracy") and "seed 2" in lines[0]
    assert lines[1].split() == ["cell", "params", "held-out", "loss", "accuracy", "seconds"]
    assert lines[2].split()[0] == "lstm" and lines[3].split()[0] == "mgu"
    assert "[2/2] mgu: step 6/6" in captured.err
    saved = json.loads(out.read_text())
    assert [r["cell"] for r in saved["results"]] == ["lstm", "mgu"]
    assert saved["results"][0]["settings"]["seed"] == 2 and len(saved["results"][0]["losses"]) == 6


def test_cli_lists_the_tasks(capsys):
    assert main(["train", "--list-tasks"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in tasks()) and "baseline 0.1667" in out


@pytest.mark.parametrize("argv,message", [
    (["train", "lstm", "--task", "addng"], "error: unknown task 'addng'\n  hint: did you mean 'adding'?"),
    (["train", "lstmm"], "'lstmm' is neither a preset nor a JSON file"),
    (["train"], "error: no cell to train\n  hint:"),
    (["train", "lstm", "--steps", "0"], "error: argument --steps: must be at least 1, got 0"),
    (["train", "lstm", "--clip", "-1"], "error: argument --clip: must be at least 0, got -1"),
    (["train", "lstm", "gru", "nope.json"], "file 'nope.json' does not exist"),
    (["train", "lstm", "--json", "."], "error: --json (training results): '.' is a folder, not a file"),
])
def test_cli_refuses_bad_input_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_bad_flag_exits_non_zero_without_a_traceback():
    for argv, code, message in ((["--steps", "many"], 2, "argument --steps: expected a whole number, got 'many'"),
                                (["--task", "adding", "--hidden-size", "0", "--steps", "1"], 2,
                                 "argument --hidden-size/-H: must be at least 1, got 0")):
        done = subprocess.run([sys.executable, "-m", "engine", "train", "lstm", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == code and message in done.stderr and "Traceback" not in done.stderr
