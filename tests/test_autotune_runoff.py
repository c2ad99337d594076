"""The autotuner's runoff (engine/schedules/autotune.py finalists(), runoff()), without a GPU: which candidates of
the first pass run again, in what order, and that a runoff after a warm-up picks the faster of two close candidates
where the first pass, timing each one right after its compile on a GPU whose clock is still ramping up, picks the
slower. tune() itself runs them on the GPU (tests/gpu/test_schedules.py)."""
from __future__ import annotations

import numpy as np

from engine.schedules.autotune import RUNOFF_FINALISTS, finalists, runoff


def test_the_finalists_are_the_best_and_those_within_ten_percent_of_it_three_at_most():
    timed = [(1.30, "d"), (1.00, "a"), (1.05, "b"), (1.09, "c"), (1.101, "e")]
    assert finalists(timed) == ["a", "b", "c"]
    assert len(finalists([(1.0 + i * 0.001, i) for i in range(10)])) == RUNOFF_FINALISTS
    assert finalists([(2.0, "only")]) == ["only"]
    assert finalists([(1.0, "a"), (1.2, "b")]) == ["a"]             # no runoff: one finalist
    assert finalists([]) == []


class RampingGPU:
    """A GPU whose clock drops while it idles and ramps back up with busy time: a run takes its true time times a
    factor that starts at 1 + 0.15 x (the idle spell in seconds, up to 1) and falls to 1 over `ramp_ms` of work."""

    def __init__(self, ramp_ms: float = 40.0):
        self.ramp_ms, self.cold, self.busy, self.calls = ramp_ms, 1.0, 0.0, []

    def idle(self, seconds: float):
        self.cold, self.busy = 1.0 + 0.15 * min(seconds, 1.0), 0.0

    def run(self, name: str, true_ms: float) -> float:
        factor = self.cold - (self.cold - 1.0) * min(self.busy / self.ramp_ms, 1.0)
        ms = true_ms * factor
        self.busy += ms
        self.calls.append(name)
        return ms


def test_a_runoff_picks_the_faster_of_two_close_candidates_that_the_first_pass_mistook():
    true = {"a": 1.00, "b": 1.03}
    compile_seconds = {"a": 3.0, "b": 0.1}   # b's kernels were in the compile cache
    gpu = RampingGPU()
    first = {}
    for name in ("a", "b"):                 # the first pass: a compile (the GPU idles), then 10 timed runs
        gpu.idle(compile_seconds[name])
        first[name] = float(np.median([gpu.run(name, true[name]) for _ in range(10)]))
    assert min(first, key=first.get) == "b"          # a ran on a colder clock

    entrants = finalists([(ms, name) for name, ms in first.items()])
    assert entrants == ["b", "a"]
    gpu.idle(0.5)                            # the runoff prepares its entrants again (compiles cached)
    medians = runoff(entrants, lambda name: gpu.run(name, true[name]), repeats=10)
    assert entrants[int(np.argmin(medians))] == "a"
    assert abs(medians[entrants.index("a")] - 1.00) < 0.005 and abs(medians[entrants.index("b")] - 1.03) < 0.005


def test_the_runoff_warms_up_on_the_first_entrant_then_takes_turns_round_by_round():
    calls = []

    def time_one(name):
        calls.append(name)
        return 2.0
    medians = runoff(["x", "y", "z"], time_one, repeats=2, rounds=3, warm_ms=10.0)
    assert medians == [2.0, 2.0, 2.0]
    assert calls[:5] == ["x"] * 5                                     # 10 ms of warm-up at 2 ms a run
    assert calls[5:] == ["x", "x", "y", "y", "z", "z"] * 3
