"""JSB Chorales (issue #35, item 2): the piano roll of a score, the fixed split, the cache, the task's batches, the
binary cross-entropy readout and training on it. CPU; music21's corpus holds the chorales."""
from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine.cli import main
from engine.training import TrainingError, jsb
from engine.training.loss import init_readout, readout_loss
from engine.training.tasks import Batch, get_task

music21 = pytest.importorskip("music21", reason="music21 is not installed (pip install -r requirements.txt)")


def score_of(voices: list[list[tuple[int | list[int], float]]]):
    """A music21 score: one part a voice, each a list of (MIDI number or chord or 0 for a rest, quarter length)."""
    score = music21.stream.Score()
    for notes in voices:
        part = music21.stream.Part()
        for pitch, length in notes:
            if pitch == 0:
                part.append(music21.note.Rest(quarterLength=length))
            elif isinstance(pitch, list):
                part.append(music21.chord.Chord(pitch, quarterLength=length))
            else:
                part.append(music21.note.Note(pitch, quarterLength=length))
        score.insert(0, part)
    return score


def test_a_score_is_sampled_on_the_eighth_note_grid():
    """Frame k holds the keys sounding at k eighth notes: a quarter note fills two frames, a chord all its keys, a
    rest none, and a sixteenth that starts and ends between two grid points is not sampled."""
    score = score_of([[(72, 1.0), (74, 0.5), (76, 0.5)],              # soprano: C5 a quarter, D5, E5 eighths
                      [(67, 0.5), (0, 0.5), ([64, 65], 1.0)],         # alto: G4, a rest, a chord E4 + F4
                      [(60, 0.5), (62, 0.25), (64, 0.25), (65, 1.0)],  # tenor: E4 at 0.75 lies between grid points
                      [(48, 2.0)]])                                    # bass: C3 a half note
    roll = jsb.piano_roll(score)
    assert roll.shape == (4, jsb.KEYS) and roll.dtype == bool
    on = [sorted(int(k) + jsb.LOWEST for k in np.flatnonzero(frame)) for frame in roll]
    assert on == [[48, 60, 67, 72], [48, 62, 72], [48, 64, 65, 74], [48, 64, 65, 76]]


def test_a_score_without_four_parts_is_not_a_chorale():
    assert jsb.piano_roll(score_of([[(60, 1.0)], [(64, 1.0)], [(67, 1.0)]])) is None


def test_the_split_is_three_of_five_train_then_valid_then_test():
    assert [jsb.split_of(i) for i in range(10)] == ["train"] * 3 + ["valid", "test"] + ["train"] * 3 + ["valid",
                                                                                                        "test"]


def test_the_corpus_is_read_in_path_order_and_only_four_voice_scores_are_kept(jsb_subset):
    scores = jsb.corpus_scores()
    names = [name for name, _ in scores]
    assert names == sorted(names) and all(n.startswith("bach/") for n in names) and len(names) > 300
    assert set(jsb_subset.names) <= set(names[:20]) and len(jsb_subset.names) >= 10
    for name, split in zip(jsb_subset.names, jsb_subset.splits):
        assert split == jsb.split_of(names.index(name))               # the place in the whole corpus decides
    assert set(jsb_subset.splits) == set(jsb.SPLITS)
    for roll in jsb_subset.rolls:
        assert roll.shape[1] == jsb.KEYS and len(roll) > 16
        assert np.mean(roll.sum(axis=1) >= 3) > 0.9                   # four voices (unisons and rests aside)


def test_the_cache_round_trips_and_a_bad_one_is_built_again(jsb_subset, tmp_path, monkeypatch):
    path = tmp_path / "jsb.npz"
    jsb.save(jsb_subset, path)
    again = jsb.load(path)
    assert again.names == jsb_subset.names and again.splits == jsb_subset.splits
    assert all(np.array_equal(a, b) for a, b in zip(again.rolls, jsb_subset.rolls))
    path.write_bytes(b"not a zip file")
    assert jsb.load(path) is None
    jsb.save(jsb_subset, path)
    good = path.read_bytes()
    for offset, value in ((10, 99), (8, 1)):      # a member of unknown compression, one marked encrypted
        damaged = bytearray(good)
        at = damaged.find(b"PK\x01\x02")
        damaged[at + offset:at + offset + 2] = value.to_bytes(2, "little")
        path.write_bytes(bytes(damaged))
        assert jsb.load(path) is None
    monkeypatch.setattr(jsb, "FORMAT", jsb.FORMAT + 1)
    jsb.save(jsb_subset, path)
    monkeypatch.setattr(jsb, "FORMAT", jsb.FORMAT - 1)
    assert jsb.load(path) is None                                      # another format: built again


def test_a_cache_of_another_music21_is_built_again_and_without_music21_it_is_used(jsb_subset, tmp_path, monkeypatch):
    path = tmp_path / "jsb.npz"
    jsb.save(jsb_subset, path)
    monkeypatch.setattr(jsb, "installed_music21_version", lambda: "0.0.1")
    assert jsb.load(path) is None                                      # another music21: built again
    monkeypatch.setattr(jsb, "installed_music21_version", lambda: None)
    assert jsb.load(path).names == jsb_subset.names                    # nothing to rebuild it with: used as it is


def test_a_cache_that_cannot_be_read_is_built_again_by_chorales(jsb_subset, tmp_path, monkeypatch):
    path = tmp_path / "broken.npz"
    path.write_bytes(b"\x00" * 100)
    monkeypatch.setenv("CELLFORGE_JSB_CACHE", str(path))
    scores, parsed = jsb.corpus_scores()[:12], []
    monkeypatch.setattr(jsb, "corpus_scores", lambda: parsed.append(True) or scores)
    monkeypatch.setattr(jsb.os, "cpu_count", lambda: 1)
    jsb.chorales.cache_clear()
    try:
        data = jsb.chorales()
    finally:
        jsb.chorales.cache_clear()
    assert parsed and set(data.names) <= {name for name, _ in scores}
    assert jsb.load(path).names == data.names                            # the good cache written in its place


def test_the_task_predicts_the_next_frame_of_one_chorale(jsb_subset):
    task = get_task("jsb")
    assert (task.input_size, task.output_size, task.loss, task.metric) == (88, 88, "bce", "nll")
    batch = task.batch(np.random.default_rng(3), 6, 12)
    assert batch.x.shape == batch.targets.shape == (12, 6, 88)
    assert set(np.unique(batch.x)) <= {0.0, 1.0} and list(batch.loss_steps) == list(range(12))
    np.testing.assert_array_equal(batch.targets[:-1], batch.x[1:])      # the target is the next input
    rolls = jsb_subset.rolls_of("train")
    for b in range(6):                                                   # each window lies inside one chorale
        window = np.concatenate([batch.x[:, b], batch.targets[-1:, b]]).astype(bool)
        assert any(any(np.array_equal(roll[s:s + 13], window) for s in range(len(roll) - 12)) for roll in rolls)
    test = task.batch(np.random.default_rng(3), 2, 5, split="test")
    assert test.x.shape == (5, 2, 88)


def test_a_window_longer_than_every_chorale_is_refused_with_the_longest(jsb_subset):
    longest = max(len(r) for r in jsb_subset.rolls_of("valid"))
    with pytest.raises(TrainingError, match=rf"seq_len={longest} is longer than every valid chorale .*hint: use "
                                            rf"seq_len <= {longest - 1}"):
        get_task("jsb").batch(np.random.default_rng(0), 2, longest, split="eval")
    with pytest.raises(TrainingError, match=r"task 'adding' has no split 'test'"):
        get_task("adding").batch(np.random.default_rng(0), 2, 5, split="test")


def test_the_baseline_is_the_nll_of_the_training_key_frequencies():
    train = [np.array([[1, 0], [1, 1], [0, 0]], dtype=bool)]
    held_out = [np.array([[1, 0]], dtype=bool)]
    p = np.array([3 / 5, 2 / 5])                                          # (on + 1) / (frames + 2)
    assert jsb.marginal_nll(train, held_out) == pytest.approx(-(np.log(p[0]) + np.log(1 - p[1])))


def test_bce_is_the_nll_of_independent_keys_and_its_gradient_is_exact():
    rng = np.random.default_rng(0)
    S, B, H, O = 3, 2, 4, 5
    outputs = rng.standard_normal((S, B, H))
    readout = init_readout(O, H, rng)
    batch = Batch(outputs, (rng.random((S, B, O)) < 0.4).astype(np.float64), np.arange(S))
    scored = readout_loss(outputs, readout, batch, "bce")
    p = 1 / (1 + np.exp(-(outputs @ readout["W_out"].T + readout["b_out"])))
    want = -(batch.targets * np.log(p) + (1 - batch.targets) * np.log(1 - p)).sum(axis=-1).mean()
    assert scored.loss == pytest.approx(want, rel=1e-12) and scored.metric == scored.loss
    eps = 1e-6
    for name in ("W_out", "b_out"):
        for index in [(0,), (O - 1,)] if name == "b_out" else [(0, 0), (O - 1, H - 1)]:
            bumped = {k: v.copy() for k, v in readout.items()}
            bumped[name][index] += eps
            up = readout_loss(outputs, bumped, batch, "bce").loss
            bumped[name][index] -= 2 * eps
            down = readout_loss(outputs, bumped, batch, "bce").loss
            assert scored.d_readout[name][index] == pytest.approx((up - down) / (2 * eps), rel=1e-6, abs=1e-9)
    bumped = outputs.copy()
    bumped[1, 0, 2] += eps
    up = readout_loss(bumped, readout, batch, "bce").loss
    bumped[1, 0, 2] -= 2 * eps
    down = readout_loss(bumped, readout, batch, "bce").loss
    assert scored.d_outputs[1, 0, 2] == pytest.approx((up - down) / (2 * eps), rel=1e-6, abs=1e-9)


def test_bce_stays_finite_where_the_logits_are_huge():
    outputs = np.array([[[1.0]]])
    batch = Batch(outputs, np.array([[[1.0, 0.0]]]), np.array([0]))
    readout = {"W_out": np.array([[-1e4], [1e4]]), "b_out": np.zeros(2)}
    with np.errstate(over="raise", invalid="raise", divide="raise"):      # (exp(-huge) may underflow to 0)
        scored = readout_loss(outputs, readout, batch, "bce")
    assert scored.loss == pytest.approx(2e4) and np.isfinite(scored.d_outputs).all()


def test_an_lstm_learns_the_chorales_below_the_input_blind_baseline(jsb_subset):
    result = engine.train("lstm", "jsb", hidden_size=24, steps=120, batch=16, seq_len=24, lr=0.02, seed=0,
                          eval_batch=32)
    assert result.metric == "nll" and result.baseline == pytest.approx(
        jsb.marginal_nll(jsb_subset.rolls_of("train"), jsb_subset.rolls_of("valid")))
    assert result.eval_metrics[0] > 55                                   # 88 keys at p = 1/2: 61 nats
    assert result.eval_metrics[-1] < result.baseline < result.eval_metrics[0]


def test_the_cli_trains_on_jsb_and_lists_it(jsb_subset, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["train", "lstm", "gru", "--task", "jsb", "--steps", "3", "-H", "4", "-T", "8", "-B", "2",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "task jsb: nll" in printed and "lower is better" in printed and "test nll" in printed
    assert [r["task"] for r in json.loads(out.read_text())["results"]] == ["jsb", "jsb"]
    assert main(["train", "--list-tasks"]) == 0
    assert "jsb" in capsys.readouterr().out


def test_the_task_list_says_when_the_data_is_built_on_first_use(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CELLFORGE_JSB_CACHE", str(tmp_path / "none.npz"))
    assert main(["train", "--list-tasks"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("jsb")][0]
    assert "baseline (on first use: its data is built then)" in line
    assert not (tmp_path / "none.npz").exists()                          # listing builds nothing


def test_the_whole_corpus_gives_the_documented_split():
    """Every four-voice chorale of music21's Bach corpus, parsed on every core: the split's sizes (about 60/20/20)
    and the keys they use."""
    data = jsb.build(jsb.corpus_scores())
    counts = {s: len(data.rolls_of(s)) for s in jsb.SPLITS}
    assert counts == {"train": 219, "valid": 72, "test": 74}, counts
    keys = np.flatnonzero(np.concatenate(data.rolls).any(axis=0)) + jsb.LOWEST
    assert keys.min() >= 36 and keys.max() <= 81                          # C2 to A5: the four voices' range


# ---- whole sequences: the held-out set and the masked loss ------------------------------------------------------------

@pytest.mark.parametrize("loss", ["bce", "cross_entropy", "mse"])
def test_a_masked_loss_is_the_mean_over_the_counted_steps_only(loss):
    """Two sequences of 5 and 3 steps padded to 5: the loss, metric and gradients are those of the counted 8
    positions, whatever the padding holds."""
    rng = np.random.default_rng(1)
    T, B, H, O = 5, 2, 3, 4
    outputs = rng.standard_normal((T, B, H))
    readout = init_readout(O, H, rng)
    targets = {"bce": (rng.random((T, B, O)) < 0.5).astype(float), "cross_entropy": rng.integers(0, O, (T, B)),
               "mse": rng.standard_normal((T, B, O))}[loss]
    mask = np.ones((T, B))
    mask[3:, 1] = 0.0
    scored = readout_loss(outputs, readout, Batch(outputs, targets, np.arange(T), mask), loss)
    garbage = outputs.copy()
    garbage[3:, 1] = 1e3                                                  # what the padding holds does not count
    again = readout_loss(garbage, readout, Batch(garbage, targets, np.arange(T), mask), loss)
    assert again.loss == pytest.approx(scored.loss, rel=1e-12)
    one = readout_loss(outputs[:, :1], readout, Batch(outputs[:, :1], targets[:, :1], np.arange(T)), loss)
    two = readout_loss(outputs[:3, 1:], readout, Batch(outputs[:3, 1:], targets[:3, 1:], np.arange(3)), loss)
    assert scored.loss == pytest.approx((5 * one.loss + 3 * two.loss) / 8, rel=1e-12)
    assert scored.metric == pytest.approx((5 * one.metric + 3 * two.metric) / 8, rel=1e-12)
    assert not scored.d_outputs[3:, 1].any()                               # no gradient into the padding
    np.testing.assert_allclose(scored.d_outputs[:, 0], one.d_outputs[:, 0] * 5 / 8, rtol=1e-12)
    with pytest.raises(TrainingError, match="the batch's mask counts no loss step"):
        readout_loss(outputs, readout, Batch(outputs, targets, np.arange(T), np.zeros((T, B))), loss)


def test_the_held_out_chorales_are_whole_and_the_padding_changes_no_counted_output(jsb_subset):
    from engine.backends.reference import run as reference_run
    from engine.training.tasks import jsb_whole
    valid = jsb_subset.rolls_of("valid")
    batch = jsb_whole("eval")
    longest = max(len(r) for r in valid)
    assert batch.x.shape == batch.targets.shape == (longest - 1, len(valid), 88)
    assert batch.mask.sum() == sum(len(r) - 1 for r in valid)
    shortest = int(np.argmin([len(r) for r in valid]))
    n = len(valid[shortest])
    np.testing.assert_array_equal(batch.x[:n - 1, shortest], valid[shortest][:-1])
    np.testing.assert_array_equal(batch.targets[:n - 1, shortest], valid[shortest][1:])
    assert not batch.x[n:, shortest].any() and not batch.mask[n - 1:, shortest].any()
    network = engine.Network(engine.preset("gru").cell, 88, 8, 1)
    params = engine.init_params(network, seed=0)
    padded = reference_run(network, params, batch.x, dtype=np.float64).outputs[:n - 1, shortest]
    alone = reference_run(network, params, batch.x[:n - 1, shortest:shortest + 1], dtype=np.float64).outputs[:, 0]
    np.testing.assert_allclose(padded, alone, rtol=1e-12, atol=1e-15)       # (BLAS sums a batch in its own order)


def test_training_scores_the_valid_chorales_whole(jsb_subset):
    from engine.training.loss import readout_loss as score
    from engine.training.tasks import jsb_whole
    result = engine.train("gru", "jsb", hidden_size=6, steps=2, batch=4, seq_len=8, seed=3, eval_batch=5)
    network = engine.Network(engine.preset("gru").cell, 88, 6, 1)
    batch = jsb_whole("eval")
    outputs = engine.run(network, result.params, batch.x, backend="reference", dtype=np.float64).outputs
    assert result.eval_metrics[-1] == pytest.approx(score(outputs, result.readout, batch, "bce").metric, rel=1e-12)
    test = jsb_whole("test")                                              # and the test chorales once, at the end
    outputs = engine.run(network, result.params, test.x, backend="reference", dtype=np.float64).outputs
    assert result.test_metric == pytest.approx(score(outputs, result.readout, test, "bce").metric, rel=1e-12)
    again = engine.training.TrainResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.test_metric == result.test_metric and again.test_loss == result.test_loss
    assert engine.train("lstm", "adding", hidden_size=3, steps=1, seq_len=4).test_metric is None
