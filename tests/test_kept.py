"""engine.run(backend="auto") keeps the program it prepared for its next calls (engine/kept.py): reused for the same
choice and equal parameters only, never shared by two callers at once. CPU: the autotuner and the schedule are
stand-ins, so what is checked is which program runs, and when one is prepared."""
import threading

import numpy as np
import pytest

import engine
from engine import backends, kept
from engine.backends import reference
from engine.backends.common import RunResult
from engine.schedules import autotune


class FakeProgram:
    """A prepared program that runs the reference with the parameters it was prepared with (as a schedule's
    device copy of them would), and counts its runs."""

    def __init__(self, network, params):
        self.network, self.params = network, engine.Params([dict((k, np.array(v)) for k, v in layer.items())
                                                             for layer in params.layers])
        self.runs = 0

    def run(self, x, initial_states=None, lengths=None):
        self.runs += 1
        if getattr(self, "fail", False):
            raise RuntimeError("the run failed")
        out = reference.run(self.network, self.params, x, initial_states, dtype=np.float32)
        return RunResult(outputs=out.outputs, final_states=out.final_states, backend="persistent")


@pytest.fixture
def on_fake_gpu(monkeypatch):
    """engine.run's 'auto' path with a stand-in autotuner and schedule; yields the list of prepared programs."""
    prepared = []
    monkeypatch.setattr(backends, "select", lambda name="auto": ("auto", "using the autotuned schedule (stand-in)"))

    def tune(network, params, steps, batch, precision="float32", lengths=False, **_):
        return autotune.Choice("persistent", None, "stand-in", f"{network.cell.name}|T{steps}|B{batch}|{precision}")

    def prepare(candidate, network, params, precision="float32"):
        prepared.append(FakeProgram(network, params))
        return prepared[-1]

    monkeypatch.setattr(autotune, "tune", tune)
    monkeypatch.setattr(autotune, "prepare", prepare)
    kept.forget()
    yield prepared
    kept.forget()


def lstm():
    network = engine.Network(engine.preset("lstm").cell, 3, 4, 2)
    return network, engine.init_params(network, seed=0, dtype=np.float32)


def x_of(T=5, B=2, seed=1):
    return np.random.default_rng(seed).standard_normal((T, B, 3)).astype(np.float32)


def test_a_second_call_with_the_same_parameters_runs_the_kept_program(on_fake_gpu):
    network, params = lstm()
    first = engine.run(network, params, x_of())
    second = engine.run(network, params, x_of(seed=2))
    assert len(on_fake_gpu) == 1 and on_fake_gpu[0].runs == 2
    want = reference.run(network, params, x_of(seed=2), dtype=np.float32).outputs
    np.testing.assert_allclose(second.outputs, want, rtol=1e-6)
    assert not np.allclose(first.outputs, second.outputs)


def test_a_parameter_changed_in_place_prepares_the_program_again(on_fake_gpu):
    network, params = lstm()
    engine.run(network, params, x_of())
    params.layers[1]["W_hi"][2, 3] += 0.5                       # the same array object, one value changed
    result = engine.run(network, params, x_of())
    assert len(on_fake_gpu) == 2
    np.testing.assert_allclose(result.outputs, reference.run(network, params, x_of(), dtype=np.float32).outputs,
                               rtol=1e-6)


def test_other_sizes_or_another_dtype_of_the_parameters_are_another_program(on_fake_gpu):
    network, params = lstm()
    engine.run(network, params, x_of(T=5))
    engine.run(network, params, x_of(T=7))                      # another T: another choice of the autotuner
    engine.run(network, params.astype(np.float64), x_of(T=7))   # equal values, another dtype
    assert len(on_fake_gpu) == 3


def test_at_most_keep_programs_are_kept_the_least_recent_going_first(on_fake_gpu):
    network, params = lstm()
    for T in (3, 4, 5):
        engine.run(network, params, x_of(T=T))
    assert len(kept.PROGRAMS) == kept.KEEP == 2
    engine.run(network, params, x_of(T=5))
    engine.run(network, params, x_of(T=3))                      # evicted by T = 5: prepared again
    assert len(on_fake_gpu) == 4


def test_a_run_that_fails_does_not_keep_its_program(on_fake_gpu):
    network, params = lstm()
    engine.run(network, params, x_of())
    on_fake_gpu[0].fail = True
    with pytest.raises(RuntimeError, match="the run failed"):
        engine.run(network, params, x_of())
    engine.run(network, params, x_of())
    assert len(on_fake_gpu) == 2


def test_parameters_over_the_size_limit_are_not_kept(on_fake_gpu, monkeypatch):
    monkeypatch.setattr(kept, "KEEP_BYTES", 64)
    network, params = lstm()
    engine.run(network, params, x_of())
    engine.run(network, params, x_of())
    assert len(on_fake_gpu) == 2 and len(kept.PROGRAMS) == 0


def test_a_program_in_use_is_not_handed_to_a_second_caller():
    programs = kept.KeptPrograms()
    network, params = lstm()
    entry = kept.Kept("program", kept.parameter_copy(params))
    programs.put(("k",), entry)
    taken = programs.take(("k",), params)
    assert taken is entry and programs.take(("k",), params) is None       # out while it runs
    programs.put(("k",), taken)
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(programs.take(("k",), params))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(s is entry for s in seen) == 1 and seen.count(None) == 3


def test_forget_drops_every_kept_program(on_fake_gpu):
    network, params = lstm()
    engine.run(network, params, x_of())
    assert len(kept.PROGRAMS) == 1
    kept.forget()
    assert len(kept.PROGRAMS) == 0
    engine.run(network, params, x_of())
    assert len(on_fake_gpu) == 2
