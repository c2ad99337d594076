"""Presets that PyTorch has (lstm, gru, elman_tanh, elman_relu) against torch.nn on the CPU in float64.

The same weights go both ways through engine.torch_layout: our seeded parameters into a torch module,
and a torch module's own random parameters into ours. Outputs and final states, from non-zero
initial states, must agree to 1e-10 for 1 and 3 layers. Because cuDNN computes the same functions
(the preset's `cudnn` mode), this is also what backs the cudnn flags of the gallery.
"""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.errors import BackendError
from engine.torch_layout import check_layout, from_torch_state_dict, to_torch_state_dict

TORCH_PRESETS = sorted(name for name, p in engine.presets().items() if p.torch is not None)
TOL = 1e-10


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: parity with torch.nn is not checked "
                                               "(pip install -r requirements-test.txt)")


def build_module(torch, layout: engine.TorchLayout, network: engine.Network):
    kwargs = dict(input_size=network.input_size, hidden_size=network.hidden_size,
                  num_layers=network.num_layers, bias=True)
    if layout.module == "RNN":
        kwargs["nonlinearity"] = layout.nonlinearity
    return getattr(torch.nn, layout.module)(**kwargs).double()


def run_torch(torch, module, layout, x, initial_states):
    """The module over x (T, B, I); states mapped through layout.state_map (torch order)."""
    hx = [torch.from_numpy(initial_states[ours]) for _, ours in layout.state_map]
    with torch.no_grad():
        out, final = module(torch.from_numpy(x), tuple(hx) if len(hx) > 1 else hx[0])
    final = final if isinstance(final, tuple) else (final,)
    return out.numpy(), {ours: f.numpy() for (_, ours), f in zip(layout.state_map, final)}


def assert_same(result, torch_out, torch_final):
    np.testing.assert_allclose(result.outputs, torch_out, rtol=0, atol=TOL)
    assert set(torch_final) == set(result.final_states)
    for name, value in torch_final.items():
        np.testing.assert_allclose(result.final_states[name], value, rtol=0, atol=TOL, err_msg=name)


def test_the_torch_cells_are_covered():
    assert {"lstm", "gru", "elman_tanh", "elman_relu"} <= set(TORCH_PRESETS)


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("name", TORCH_PRESETS)
def test_our_weights_in_torch(name, num_layers, torch, make_case, run_reference):
    preset = engine.preset(name)
    case = make_case(preset, num_layers=num_layers, seed=7)
    module = build_module(torch, preset.torch, case.network)
    state_dict = {k: torch.from_numpy(v) for k, v in to_torch_state_dict(case.network, case.params,
                                                                          preset.torch).items()}
    module.load_state_dict(state_dict, strict=True)
    torch_out, torch_final = run_torch(torch, module, preset.torch, case.x, case.initial_states)
    assert_same(run_reference(case), torch_out, torch_final)


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("name", TORCH_PRESETS)
def test_torch_weights_in_ours(name, num_layers, torch, make_case, run_reference):
    preset = engine.preset(name)
    case = make_case(preset, num_layers=num_layers, seed=8)
    torch.manual_seed(num_layers)
    module = build_module(torch, preset.torch, case.network)
    params = from_torch_state_dict(case.network, module.state_dict(), preset.torch)
    torch_out, torch_final = run_torch(torch, module, preset.torch, case.x, case.initial_states)
    assert_same(run_reference(case, params=params), torch_out, torch_final)
    # and back: the conversion is exact in both directions
    again = to_torch_state_dict(case.network, params, preset.torch)
    for key, value in module.state_dict().items():
        np.testing.assert_array_equal(again[key], value.numpy())


@pytest.mark.parametrize("name", TORCH_PRESETS)
def test_parity_check_can_fail(name, torch, make_case, run_reference):
    """Swapping two row blocks (a wrong gate order) must break parity; one-block cells get a nudge."""
    preset = engine.preset(name)
    case = make_case(preset, num_layers=1, seed=9)
    module = build_module(torch, preset.torch, case.network)
    state_dict = to_torch_state_dict(case.network, case.params, preset.torch)
    H = case.network.hidden_size
    weight = state_dict["weight_hh_l0"]
    if weight.shape[0] >= 2 * H:
        weight = np.concatenate([weight[H:2 * H], weight[:H], weight[2 * H:]])
    else:
        weight = weight + 1e-6
    state_dict["weight_hh_l0"] = weight
    module.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict.items()})
    torch_out, _ = run_torch(torch, module, preset.torch, case.x, case.initial_states)
    assert np.max(np.abs(run_reference(case).outputs - torch_out)) > TOL


# ---- layout conversion errors (no torch needed) ----------------------------------------------

def _lstm_case(make_case, num_layers=2):
    preset = engine.preset("lstm")
    return preset, make_case(preset, num_layers=num_layers)


def test_missing_key_is_named(make_case):
    preset, case = _lstm_case(make_case)
    state_dict = to_torch_state_dict(case.network, case.params, preset.torch)
    del state_dict["bias_hh_l1"]
    with pytest.raises(BackendError, match="bias_hh_l1"):
        from_torch_state_dict(case.network, state_dict, preset.torch)


def test_wrong_hidden_size_is_named(make_case):
    preset, case = _lstm_case(make_case)
    state_dict = to_torch_state_dict(case.network, case.params, preset.torch)
    state_dict["weight_hh_l0"] = state_dict["weight_hh_l0"][:-1]
    with pytest.raises(BackendError, match="weight_hh_l0"):
        from_torch_state_dict(case.network, state_dict, preset.torch)


def test_wrong_input_size_is_named(make_case):
    preset, case = _lstm_case(make_case)
    state_dict = to_torch_state_dict(case.network, case.params, preset.torch)
    state_dict["weight_ih_l0"] = state_dict["weight_ih_l0"][:, :-1]
    with pytest.raises(BackendError, match="W_ii"):
        from_torch_state_dict(case.network, state_dict, preset.torch)


def test_layout_must_match_the_cell(make_case):
    preset, case = _lstm_case(make_case)
    gru_layout = engine.preset("gru").torch
    with pytest.raises(BackendError, match="W_ir"):
        check_layout(case.network, gru_layout)
    incomplete = engine.TorchLayout(module="LSTM", weight_ih=preset.torch.weight_ih, weight_hh=preset.torch.weight_hh,
                                    bias_ih=preset.torch.bias_ih, bias_hh=preset.torch.bias_hh[:3],
                                    state_map=preset.torch.state_map)
    with pytest.raises(BackendError, match="b_ho"):
        to_torch_state_dict(case.network, case.params, incomplete)
