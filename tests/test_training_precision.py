"""engine.train / compare / `python -m engine train` in a precision mode (precision=, --precision): the step's
matmuls rounded to the mode, fp32 accumulation and master weights; on the CPU the reference emulates the mode."""
import json

import numpy as np
import pytest

import engine
from engine.cli import main
from engine.training.errors import TrainingError


def small(**settings):
    return engine.train("lstm", "adding", **{"hidden_size": 8, "steps": 12, "seq_len": 6, "batch": 8, "seed": 1,
                                             **settings})


def test_a_mode_trains_close_to_float32_but_not_as_it():
    strict, bf16 = small(), small(precision="bf16")
    assert strict.settings["precision"] == "float32" and bf16.settings["precision"] == "bfloat16"
    a, b = np.array(strict.losses), np.array(bf16.losses)
    assert not np.array_equal(a, b)                                   # the mode is applied
    assert np.max(np.abs(a - b) / np.abs(a)) < 0.05                   # and is a rounding, not another model
    for layer_a, layer_b in zip(strict.params.layers, bf16.params.layers):
        for name in layer_a:
            assert np.allclose(layer_a[name], layer_b[name], atol=0.05)


def test_the_held_out_score_is_computed_in_the_mode():
    strict, bf16 = small(steps=1), small(steps=1, precision="bfloat16")
    # before any step the parameters are equal, so only the held-out forward's mode can tell the scores apart
    assert strict.eval_losses[0] != bf16.eval_losses[0]
    assert abs(strict.eval_losses[0] - bf16.eval_losses[0]) < 0.01 * abs(strict.eval_losses[0])


def test_an_unknown_mode_is_refused_by_name_before_training():
    with pytest.raises(TrainingError, match="precision must be one of .*got 'fp8'"):
        small(precision="fp8")
    with pytest.raises(TrainingError, match="precision must be one of"):
        engine.compare(["lstm", "gru"], "adding", hidden_size=4, steps=2, precision=3)


def test_the_cli_takes_precision_and_records_it(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["train", "gru", "--task", "parity", "--steps", "4", "--hidden-size", "4", "--seq-len", "4",
                 "--batch", "4", "--precision", "float16", "--json", str(out)]) == 0
    capsys.readouterr()
    assert json.loads(out.read_text())["results"][0]["settings"]["precision"] == "float16"
    assert main(["train", "gru", "--task", "parity", "--precision", "fp8"]) == 2
    assert "--precision" in capsys.readouterr().err
