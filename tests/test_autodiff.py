"""bptt against finite differences of the NumPy reference: every preset, the compiler's unusual cells and random
cells (the fuzzer's generator), gradients of the parameters, the input and the initial states; and its refusals.

The loss is L = <d_outputs, outputs> + sum over states <d_final_states[s], final_states[s]>, so its gradients with
respect to the outputs and final states are exactly the random d_outputs and d_final_states handed to bptt: every
path (output, carried state, layer below) is exercised. Central differences in float64, element by element.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from compiler_cells import CELLS
from hypothesis import HealthCheck, given, settings
from test_fuzz_cells import cell_designs

import engine
from engine.autodiff import Gradients, bptt
from engine.dsl import W, cell, sigmoid, tanh
from engine.errors import BackendError

EPS = 1e-6
RTOL, ATOL = 1e-6, 1e-8          # central differences in float64 are good to ~1e-9 at these sizes


@cell(input_is_hidden=True)
def residual_gate(x, h):
    """x meets H-sized values elementwise: its adjoint has elementwise terms besides the matmul's."""
    z = sigmoid(W("W_z") @ x + W("U_z") @ h)
    h_next = z * tanh(x + W("U") @ h) + (1 - z) * x
    return {"h": h_next}


@dataclass
class Case:
    network: engine.Network
    params: engine.Params
    x: np.ndarray                          # (T, B, I)
    initial_states: dict[str, np.ndarray]  # name -> (L, B, size)
    d_outputs: np.ndarray                  # (T, B, output size)
    d_final_states: dict[str, np.ndarray]  # name -> (L, B, size)

    def gradients(self, dtype=np.float64) -> Gradients:
        return bptt(self.network, self.params, self.x, self.initial_states, self.d_outputs, self.d_final_states,
                    dtype=dtype)

    def loss(self) -> float:
        run = engine.run(self.network, self.params, self.x, self.initial_states, backend="reference",
                         dtype=np.float64)
        return float(np.sum(self.d_outputs * run.outputs)
                     + sum(np.sum(self.d_final_states[s] * run.final_states[s]) for s in self.d_final_states))


def make_case(graph, input_size=3, hidden_size=4, num_layers=2, steps=4, batch=2, proj_size=None, seed=0) -> Case:
    network = engine.Network(graph, input_size, hidden_size, num_layers, proj_size)
    rng = np.random.default_rng(seed)
    sizes = {s: (num_layers, batch, network.state_size(s)) for s in graph.state_names}
    return Case(network=network, params=engine.init_params(network, seed=seed),
                x=rng.standard_normal((steps, batch, input_size)),
                initial_states={s: rng.uniform(-0.8, 0.8, shape) for s, shape in sizes.items()},
                d_outputs=rng.standard_normal((steps, batch, network.output_size)),
                d_final_states={s: rng.standard_normal(shape) for s, shape in sizes.items()})


def numeric_gradient(loss, array: np.ndarray) -> np.ndarray:
    """Central differences of loss() with respect to each element of `array` (perturbed in place, restored)."""
    numeric = np.empty_like(array)
    for index in np.ndindex(array.shape):
        old = array[index]
        array[index] = old + EPS
        up = loss()
        array[index] = old - EPS
        down = loss()
        array[index] = old
        numeric[index] = (up - down) / (2 * EPS)
    return numeric


def near_a_kink(loss, array: np.ndarray, index) -> bool:
    """Whether a relu or hard_sigmoid kink lies within EPS of the point along this element: its two one-sided
    slopes then differ by a jump, not by the ~EPS * curvature of a smooth function, and a central difference
    means nothing there."""
    old = array[index]
    center = loss()
    array[index] = old + EPS
    right = (loss() - center) / EPS
    array[index] = old - EPS
    left = (center - loss()) / EPS
    array[index] = old
    return abs(right - left) > 1e-3 * max(1.0, abs(right), abs(left))


def check_by_finite_differences(case: Case) -> int:
    """Every gradient bptt gives against central differences; returns how many elements were checked."""
    g = case.gradients()
    L = case.network.num_layers
    checks = [(f"params layer {l} '{p}'", case.params[l][p], g.params[l][p]) for l in range(L) for p in case.params[l]]
    checks.append(("x", case.x, g.x))
    checks += [(f"initial_states['{s}']", case.initial_states[s], g.initial_states[s]) for s in case.initial_states]
    checked = 0
    for label, array, analytic in checks:
        assert analytic.shape == array.shape, label
        numeric = numeric_gradient(case.loss, array)
        wrong = [tuple(int(k) for k in i) for i in zip(*np.nonzero(~np.isclose(analytic, numeric, rtol=RTOL,
                                                                                     atol=ATOL)))]
        wrong = [i for i in wrong if not near_a_kink(case.loss, array, i)]
        assert not wrong, (f"{label}: {len(wrong)} element(s) differ, the first at {wrong[0]}: bptt "
                           f"{float(analytic[wrong[0]])!r}, finite differences {float(numeric[wrong[0]])!r}")
        checked += array.size
    return checked


# ---- finite differences --------------------------------------------------------------------------------------

PRESET_CASES = [(name, None) for name in sorted(engine.presets())] + [("lstm_proj", 3)]


@pytest.mark.parametrize("name,proj_size", PRESET_CASES, ids=[f"{n}-P{p}" if p else n for n, p in PRESET_CASES])
def test_every_preset_by_finite_differences(name, proj_size):
    case = make_case(engine.preset(name).cell, proj_size=proj_size, seed=len(name))
    assert check_by_finite_differences(case) > 50


UNUSUAL = {**CELLS, "residual_gate": residual_gate}


@pytest.mark.parametrize("name", sorted(UNUSUAL))
def test_unusual_cells_by_finite_differences(name):
    """Consts, dead values, a weight used three times, next values that are a state or a parameter expression,
    I-sized values inside the step, a state never read, x met elementwise (compiler_cells.py and above)."""
    graph = UNUSUAL[name]
    size = 4 if graph.input_is_hidden else 3
    check_by_finite_differences(make_case(graph, input_size=size, hidden_size=4, seed=3))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell_designs())
def test_random_cells_by_finite_differences(design):
    case = make_case(engine.from_dict(design), input_size=2, hidden_size=3, steps=3, seed=5)
    check_by_finite_differences(case)


def test_a_wrong_gradient_is_caught():
    """The check can fail: a gradient off in one element of one weight is reported by name."""
    case = make_case(engine.preset("gru").cell)
    right = case.gradients
    wrong = right()
    wrong.params[1]["W_hn"][2, 1] += 1e-4
    case.gradients = lambda dtype=np.float64: wrong
    with pytest.raises(AssertionError, match=r"params layer 1 'W_hn': 1 element\(s\) differ, the first at \(2, 1\)"):
        check_by_finite_differences(case)


# ---- what bptt returns ---------------------------------------------------------------------------------------

def test_outputs_and_shapes_are_the_reference_forward():
    case = make_case(engine.preset("lstm_proj").cell, proj_size=3, num_layers=3)
    g = case.gradients()
    ref = engine.run(case.network, case.params, case.x, case.initial_states, backend="reference", dtype=np.float64)
    np.testing.assert_array_equal(g.outputs, ref.outputs)
    for s in ref.final_states:
        np.testing.assert_array_equal(g.final_states[s], ref.final_states[s])
        assert g.initial_states[s].shape == case.initial_states[s].shape
    assert g.x.shape == case.x.shape and len(g.params) == 3
    for layer in range(3):
        assert {k: v.shape for k, v in g.params[layer].items()} == {k: v.shape for k, v in case.params[layer].items()}


def test_a_loss_gradient_given_as_a_function_of_the_outputs_equals_the_array():
    """bptt(d_outputs=f): f gets the forward outputs of bptt's own pass (training needs them for the loss) and its
    result is used as d_outputs, the same gradients as handing that array in; a wrong shape is refused as an array."""
    case = make_case(engine.preset("gru").cell, seed=4)
    seen = []

    def loss_gradient(outputs):
        seen.append(outputs.copy())
        return case.d_outputs
    given_fn = bptt(case.network, case.params, case.x, case.initial_states, loss_gradient, case.d_final_states)
    given_array = case.gradients()
    assert len(seen) == 1 and np.array_equal(seen[0], given_array.outputs)
    for layer in range(case.network.num_layers):
        for name, value in given_array.params[layer].items():
            assert np.array_equal(given_fn.params[layer][name], value), name
    assert np.array_equal(given_fn.x, given_array.x)
    with pytest.raises(BackendError, match="d_outputs"):
        bptt(case.network, case.params, case.x, d_outputs=lambda outputs: outputs[:, :1])


def test_float32_is_float64_to_single_precision():
    case = make_case(engine.preset("gru_cho").cell)
    g64, g32 = case.gradients(np.float64), case.gradients(np.float32)
    assert g32.x.dtype == np.float32 and g32.params[0]["U_r"].dtype == np.float32
    for layer in range(2):
        for name, value in g64.params[layer].items():
            np.testing.assert_allclose(g32.params[layer][name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(g32.x, g64.x, rtol=1e-4, atol=1e-5)


def test_no_loss_gradient_gives_zero_gradients_and_missing_states_are_zeros():
    case = make_case(engine.preset("lstm").cell)
    g = bptt(case.network, case.params, case.x)
    assert not g.x.any() and not any(v.any() for layer in g.params for v in layer.values())
    assert set(g.initial_states) == {"h", "c"} and g.initial_states["c"].shape == (2, 2, 4)
    only_h = bptt(case.network, case.params, case.x, {"h": case.initial_states["h"]}, case.d_outputs,
                  {"c": case.d_final_states["c"]})
    assert only_h.initial_states["c"].any() and only_h.params[0]["W_ii"].any()


def test_without_the_input_gradient_x_gets_none_and_nothing_else_changes():
    """input_gradient=False (x is data): gradients.x is None, every other gradient the same as with it, through
    bptt and through a tape's backward."""
    case = make_case(engine.preset("lstm").cell, seed=2)
    full = case.gradients()
    lean = bptt(case.network, case.params, case.x, case.initial_states, case.d_outputs, case.d_final_states,
                input_gradient=False)
    tape = engine.autodiff.record(case.network, case.params, case.x, case.initial_states)
    taped = tape.backward(case.d_outputs, case.d_final_states, input_gradient=False)
    for got in (lean, taped):
        assert got.x is None
        for layer in range(case.network.num_layers):
            for name, value in full.params[layer].items():
                assert np.array_equal(got.params[layer][name], value), (layer, name)
        for s, value in full.initial_states.items():
            assert np.array_equal(got.initial_states[s], value), s


def test_an_unused_parameter_gets_a_zero_gradient_of_its_shape():
    case = make_case(CELLS["dead_value"])
    g = case.gradients()
    assert g.params[0]["U_dead"].shape == (4, 4) and not g.params[0]["U_dead"].any()
    assert g.params[0]["U"].any()


# ---- refusals ------------------------------------------------------------------------------------------------

def _nan_at(array, index):
    array = array.copy()
    array[index] = np.nan
    return array


BAD_INPUTS = {
    "d_outputs shape": (lambda c: {"d_outputs": c.d_outputs[:, :, :2]},
                        r"argument 'd_outputs' has shape \(4, 2, 2\), expected \(4, 2, 4\)"),
    "d_outputs NaN": (lambda c: {"d_outputs": _nan_at(c.d_outputs, (3, 1, 0))},
                      r"argument 'd_outputs' has 1 NaN or Inf value\(s\), the first at index \(3, 1, 0\)"),
    "d_outputs ints": (lambda c: {"d_outputs": np.zeros(c.d_outputs.shape, dtype=int)},
                       "argument 'd_outputs' must be a floating-point array"),
    "unknown state": (lambda c: {"d_final_states": {"q": c.d_final_states["h"]}},
                      r"d_final_states: 'q' is not a state of cell 'lstm' \(states: h, c\)"),
    "state shape": (lambda c: {"d_final_states": {"c": c.d_final_states["c"][:1]}},
                    r"argument 'd_final_states\['c'\]' has shape \(1, 2, 4\), expected \(2, 2, 4\)"),
    "state NaN": (lambda c: {"d_final_states": {"h": _nan_at(c.d_final_states["h"], (1, 0, 3))}},
                  r"argument 'd_final_states\['h'\]' has 1 NaN or Inf"),
    "states not a dict": (lambda c: {"d_final_states": [c.d_final_states["h"]]},
                          "argument 'd_final_states' must be a dict"),
    "x shape": (lambda c: {"x": c.x[:, :, :2]}, "argument 'x' has input size 2"),
    "x NaN": (lambda c: {"x": _nan_at(c.x, (0, 0, 0))}, r"x has 1 NaN or Inf value\(s\)"),
    "initial state unknown": (lambda c: {"initial_states": {"z": c.initial_states["h"]}},
                              "initial_states: 'z' is not a state"),
    "dtype": (lambda c: {"dtype": np.float16}, "argument 'dtype': bptt computes in float64 or float32"),
    "input_gradient": (lambda c: {"input_gradient": "no"},
                       "argument 'input_gradient' of bptt must be True or False, got 'no'"),
}


@pytest.mark.parametrize("what", sorted(BAD_INPUTS))
def test_bad_inputs_are_refused_naming_the_argument(what):
    case = make_case(engine.preset("lstm").cell)
    change, message = BAD_INPUTS[what]
    args = dict(network=case.network, params=case.params, x=case.x, initial_states=case.initial_states,
                d_outputs=case.d_outputs, d_final_states=case.d_final_states)
    args.update(change(case))
    with pytest.raises(BackendError, match=message):
        bptt(**args)


def test_a_network_that_is_not_one_is_refused():
    case = make_case(engine.preset("lstm").cell)
    with pytest.raises(BackendError, match="argument 'network' must be an engine Network, got CellGraph"):
        bptt(case.network.cell, case.params, case.x)


def test_saved_values_that_cannot_fit_are_refused_before_allocating(monkeypatch):
    from engine import memory
    case = make_case(engine.preset("lstm").cell)
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 1_000)
    with pytest.raises(BackendError, match=r"bptt needs about [\d,]+ bytes .* T=4, B=2, L=2 .*hint: truncate"):
        case.gradients()
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 10**9)
    case.gradients()


def test_the_gpu_backend_without_a_gpu_says_why_and_an_unknown_backend_is_named():
    case = make_case(engine.preset("gru").cell)
    with pytest.raises(BackendError, match="backend.*reference, naive, fused"):
        bptt(case.network, case.params, case.x, backend="cudnn")
    from engine.backends import gpu_status
    if gpu_status()[0]:
        pytest.skip("a GPU is present: tests/gpu/test_autodiff_gpu.py runs backend='naive' there")
    with pytest.raises(BackendError, match="needs a CUDA GPU.*hint: backend='reference'"):
        bptt(case.network, case.params, case.x, backend="naive")
    with pytest.raises(BackendError, match=r"backend='fused'\) needs a CUDA GPU.*hint: backend='reference'"):
        bptt(case.network, case.params, case.x, dtype=np.float32, backend="fused")


def test_a_tape_runs_its_backward_pass_once():
    case = make_case(engine.preset("lstm").cell, seed=2)
    tape = engine.autodiff.record(case.network, case.params, case.x, case.initial_states)
    assert np.array_equal(tape.outputs, case.gradients().outputs)
    first = tape.backward(case.d_outputs, case.d_final_states)
    assert np.array_equal(first.x, case.gradients().x)
    with pytest.raises(engine.autodiff.AutodiffError, match="has run already"):
        tape.backward(case.d_outputs)
