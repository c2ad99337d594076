"""The engine's GPU backends against cuDNN (torch.nn.LSTM / GRU / RNN on the GPU, fp32, TF32 off).

For every preset that names a cuDNN mode, with the same weights (engine.torch_layout) and the same
non-zero initial states, the outputs and final states of `naive` and (when it imports) `fused` must
agree with cuDNN to 1e-5 relative, for 1 and 3 layers at odd sizes. cuDNN itself is also checked
against the float64 NumPy reference, so a disagreement says which side is wrong.
"""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import backends
from engine.backends import reference
from engine.torch_layout import to_torch_state_dict

pytestmark = pytest.mark.gpu

CUDNN_PRESETS = sorted(name for name, p in engine.presets().items() if p.cudnn and p.torch is not None)
SIZES = {"input_size": 37, "hidden_size": 129, "batch": 3, "steps": 17}
TOL = 1e-5


@pytest.fixture(scope="module")
def torch_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: no cuDNN baseline to compare with")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA device: cuDNN parity is not checked")
    if not torch.backends.cudnn.is_available():
        pytest.skip(f"torch {torch.__version__} was built without cuDNN")
    return torch


@pytest.fixture
def tf32_off(torch_cuda):
    torch = torch_cuda
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.enabled)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.enabled = True
    yield torch
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
     torch.backends.cudnn.enabled) = saved


def backend_or_skip(name: str):
    try:
        return backends.get(name)             # engine/backends, or engine/schedules for the schedules
    except ImportError as e:
        pytest.skip(f"backend '{name}' does not import here ({e})")


def to_numpy(value) -> np.ndarray:
    return value.get() if hasattr(value, "get") else np.asarray(value)


def relative_error(got, want) -> float:
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def make_case(name: str, num_layers: int, seed: int):
    preset = engine.preset(name)
    network = engine.Network(preset.cell, SIZES["input_size"], SIZES["hidden_size"], num_layers)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(200 + seed)
    x = rng.standard_normal((SIZES["steps"], SIZES["batch"], SIZES["input_size"])).astype(np.float32)
    states = {s: rng.uniform(-0.8, 0.8, (num_layers, SIZES["batch"], SIZES["hidden_size"])).astype(np.float32)
              for s in preset.cell.state_names}
    return preset, network, params, x, states


def run_cudnn(torch, preset, network, params, x, states):
    layout = preset.torch
    kwargs = dict(input_size=network.input_size, hidden_size=network.hidden_size, num_layers=network.num_layers,
                  bias=True)
    if layout.module == "RNN":
        kwargs["nonlinearity"] = layout.nonlinearity
    module = getattr(torch.nn, layout.module)(**kwargs)
    state_dict = to_torch_state_dict(network, params, layout)
    module.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in state_dict.items()}, strict=True)
    module = module.cuda().float()
    module.flatten_parameters()
    hx = [torch.from_numpy(states[ours]).cuda() for _, ours in layout.state_map]
    with torch.no_grad():
        out, final = module(torch.from_numpy(x).cuda(), tuple(hx) if len(hx) > 1 else hx[0])
    final = final if isinstance(final, tuple) else (final,)
    torch.cuda.synchronize()
    return out.cpu().numpy(), {ours: f.cpu().numpy() for (_, ours), f in zip(layout.state_map, final)}


def test_the_cudnn_cells_are_covered():
    assert {"lstm", "gru", "elman_tanh", "elman_relu"} <= set(CUDNN_PRESETS)


# The scan schedule runs only linear recurrences, and cuDNN has none: tests/gpu/test_scan_gpu.py holds it to the
# reference.
@pytest.mark.parametrize("backend", [b for b in backends.GPU_BACKENDS if b != "scan"])
@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("name", CUDNN_PRESETS)
def test_backend_matches_cudnn(cupy, tf32_off, name, num_layers, backend):
    torch = tf32_off
    module = backend_or_skip(backend)
    preset, network, params, x, states = make_case(name, num_layers, seed=num_layers)
    cudnn_out, cudnn_final = run_cudnn(torch, preset, network, params, x, states)
    want = reference.run(network, params, x.astype(np.float64), {k: v.astype(np.float64) for k, v in states.items()})
    assert relative_error(cudnn_out, want.outputs) <= TOL, "cuDNN itself is off the float64 reference"

    result = module.run(network, params, x, states, dtype=np.float32)
    outputs = to_numpy(result.outputs)
    assert np.isfinite(outputs).all()
    assert relative_error(outputs, cudnn_out) <= TOL
    for name_, value in cudnn_final.items():
        assert relative_error(to_numpy(result.final_states[name_]), value) <= TOL, name_


def test_parity_check_can_fail(cupy, tf32_off):
    """Swapped gate blocks (a wrong gate order) must break the comparison."""
    torch = tf32_off
    preset, network, params, x, states = make_case("lstm", 1, seed=9)
    swapped = engine.Params([dict(layer) for layer in params.layers])
    swapped.layers[0]["W_hi"], swapped.layers[0]["W_hf"] = params.layers[0]["W_hf"], params.layers[0]["W_hi"]
    cudnn_out, _ = run_cudnn(torch, preset, network, swapped, x, states)
    result = backend_or_skip("naive").run(network, params, x, states, dtype=np.float32)
    assert relative_error(to_numpy(result.outputs), cudnn_out) > TOL
