"""Every preset of the gallery: metadata, JSON round trip, validation, determinism, shapes, LaTeX."""
from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

import engine
from engine.ir import diagnose

PRESETS = engine.presets()
NAMES = sorted(PRESETS)

# The gallery the project promises (issue 2). More may be added; none of these may disappear.
EXPECTED = {
    "lstm", "gru", "lstm_nofg", "peephole_lstm", "vanilla_lstm", "lstm_nig", "lstm_nfg", "lstm_nog",
    "lstm_niaf", "lstm_noaf", "lstm_np", "lstm_cifg", "lstm_fgr", "gru_cho", "mgu", "indrnn", "elman_tanh",
    "elman_relu",
}
# The presets whose function cuDNN computes, and the mode. Everything else must say cudnn=None.
CUDNN = {"lstm": "lstm", "gru": "gru", "elman_tanh": "rnn_tanh", "elman_relu": "rnn_relu"}
# cuDNN mode <-> the torch module (and nonlinearity) that computes the same function.
CUDNN_TO_TORCH = {"lstm": ("LSTM", None), "gru": ("GRU", None), "rnn_tanh": ("RNN", "tanh"),
                  "rnn_relu": ("RNN", "relu")}


# ---- the gallery as a whole ------------------------------------------------------------------

def test_gallery_has_every_promised_preset():
    assert len(PRESETS) >= 18
    missing = EXPECTED - set(PRESETS)
    assert not missing, f"presets missing from the gallery: {sorted(missing)}"


def test_cudnn_flags_are_exactly_the_cudnn_cells():
    flagged = {name: p.cudnn for name, p in PRESETS.items() if p.cudnn is not None}
    assert flagged == CUDNN


@pytest.mark.parametrize("name", NAMES)
def test_cudnn_presets_have_a_matching_torch_layout(name):
    """A cuDNN claim is checked against PyTorch on the CPU (test_torch_parity), so it needs a layout."""
    p = PRESETS[name]
    if p.cudnn is None:
        return
    assert p.torch is not None, f"{name} claims cuDNN mode {p.cudnn!r} but has no TorchLayout to check it"
    assert (p.torch.module, p.torch.nonlinearity) == CUDNN_TO_TORCH[p.cudnn]


@pytest.mark.parametrize("name", NAMES)
def test_metadata(name):
    p = PRESETS[name]
    assert p.name == name == p.cell.name
    assert p.family in {"LSTM", "GRU", "RNN", "min-RNN", "xLSTM", "LayerNorm"}
    assert p.title.strip()
    assert re.search(r"\b(19|20)\d\d\b", p.citation), "the citation names the year of the paper"
    assert p.latex.strip()
    # The module docstring (equations in plain text) is carried as the preset's doc.
    assert "=" in p.equations_doc and len(p.equations_doc) > 80


@pytest.mark.parametrize("name", NAMES)
def test_preset_file_is_named_after_its_cell(name):
    """One DSL file per preset, found by convention: presets/<cell name>.py defines PRESET."""
    module = importlib.import_module(f"presets.{name}")
    assert module.PRESET.cell is PRESETS[name].cell
    assert module.__doc__ and module.__doc__.strip()


@pytest.mark.parametrize("name", NAMES)
def test_test_sizes(name):
    """Each preset carries its test inputs; I != H so that an I/H mix-up cannot pass unnoticed."""
    sizes = PRESETS[name].test_sizes
    for key in ("input_size", "hidden_size", "batch", "steps"):
        assert isinstance(sizes[key], int) and sizes[key] >= 1, key
    assert sizes["input_size"] != sizes["hidden_size"]
    assert sizes["batch"] >= 2 and sizes["steps"] >= 2


@pytest.mark.parametrize("name", NAMES)
def test_torch_layout_covers_every_parameter_once(name):
    p = PRESETS[name]
    if p.torch is None:
        return
    listed = [n for key in ("weight_ih", "weight_hh", "bias_ih", "bias_hh") for n in getattr(p.torch, key)]
    assert sorted(listed) == sorted(q.name for q in p.cell.params)
    assert {ours for _, ours in p.torch.state_map} == set(p.cell.state_names)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(engine.CellGraphError) as err:
        engine.preset("lstm_typo")
    assert err.value.field == "preset"
    assert "lstm_typo" in str(err.value) and "vanilla_lstm" in str(err.value)


@pytest.mark.parametrize("typo,suggested", [("lstn", "'lstm'"), ("GRU", "'gru'"), ("peephole", "'peephole_lstm'"),
                                            ("gru-cho", "'gru_cho'")])
def test_a_near_miss_suggests_the_closest_preset(typo, suggested, capsys):
    with pytest.raises(engine.CellGraphError, match="did you mean") as err:
        engine.preset(typo)
    assert suggested in str(err.value)
    from engine.cli import main
    assert main(["show", typo]) != 0                                           # the CLI's resolver too
    message = capsys.readouterr().err
    assert "did you mean" in message and suggested in message


def test_a_far_miss_suggests_nothing():
    with pytest.raises(engine.CellGraphError) as err:
        engine.preset("transformer")
    assert "did you mean" not in str(err.value)


# ---- each preset -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_json_round_trip_is_exact(name):
    cell = PRESETS[name].cell
    text = engine.to_json(cell)
    back = engine.from_json(text)
    assert back == cell
    assert engine.to_json(back) == text
    assert engine.from_dict(engine.to_dict(cell)) == cell
    assert back.structural_hash == cell.structural_hash


@pytest.mark.parametrize("name", NAMES)
def test_validates_without_warnings(name):
    cell = PRESETS[name].cell
    problems, warnings = diagnose(cell)
    assert problems == [] and warnings == []
    assert cell.warnings == ()
    output_only = {cell.output} - cell.live_nodes          # a state only the next layer reads (qrnn_f's h)
    assert cell.live_nodes | output_only == {n.name for n in cell.nodes}, "every node feeds some next state"


@pytest.mark.parametrize("name", NAMES)
def test_outputs_are_deterministic_for_a_seed(name, make_case, run_reference):
    p = PRESETS[name]
    first = run_reference(make_case(p, seed=3))
    again = run_reference(make_case(p, seed=3))
    other = run_reference(make_case(p, seed=4))
    np.testing.assert_array_equal(first.outputs, again.outputs)
    for s in p.cell.state_names:
        np.testing.assert_array_equal(first.final_states[s], again.final_states[s])
    assert not np.allclose(first.outputs, other.outputs)


@pytest.mark.parametrize("name", NAMES)
def test_output_and_final_state_shapes(name, make_case, run_reference):
    p = PRESETS[name]
    num_layers = 3
    case = make_case(p, num_layers=num_layers)
    result = run_reference(case)
    T, B, _ = case.x.shape
    H = case.network.hidden_size
    assert result.outputs.shape == (T, B, H)
    assert result.outputs.dtype == np.float64
    assert set(result.final_states) == set(p.cell.state_names)
    for s, value in result.final_states.items():
        assert value.shape == (num_layers, B, H), s
    # the output sequence is the last layer's output state, and its last step is that state's final value
    np.testing.assert_array_equal(result.outputs[-1], result.final_states[p.cell.output][-1])
    assert np.all(np.isfinite(result.outputs))
    assert np.std(result.outputs) > 1e-3, "outputs should depend on the input"


@pytest.mark.parametrize("name", NAMES)
def test_latex_renders(name):
    """Structural LaTeX checks (no TeX engine here): balanced, no double subscripts, one line per state."""
    cell = PRESETS[name].cell
    text = engine.to_latex(cell)
    assert text.startswith("\\begin{aligned}\n") and text.endswith("\n\\end{aligned}")
    assert _balanced(text), text
    assert text.count(r"\left(") == text.count(r"\right)")
    # "a_{b}_{c}" or "a_b_c" is a TeX error (double subscript)
    assert not re.search(r"_(\{[^{}]*\}|\w)_", text), text
    assert "%" not in text and "_pre" not in text, "auto-named intermediates are inlined"
    lines = text.split("\n")[1:-1]
    lhs = [line.split("&=")[0].strip() for line in lines]
    for state in cell.state_names:
        assert engine.latex.symbol(state, "t") in lhs, f"no equation for state {state}"
    for p in cell.params:
        assert engine.latex.symbol(p.name) in text, f"parameter {p.name} missing from the equations"


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text.replace(r"\{", "").replace(r"\}", ""):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0
