"""Reductions over the hidden units on the wavefront schedules (engine/codegen/reductions.py) against the float64
reference, beyond the presets (tests/gpu/test_schedules.py runs ln_lstm, ln_gru and slstm): a reduction of a state
(every block sums whole rows), a LayerNorm of two gates and of the cell (partials, staged or read from L2, and
the variance merged from the blocks' partials), a mean of squares about another value's mean (two reductions, not
rewritten), each at a warp-GEMV batch and a tiled one, with a last block of fewer units; and reruns bit-identical."""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import assert_matches, make_case
from test_wavefront_reductions import ln_small, off_centre, state_sum

from engine.backends import reference
from engine.schedules import schedule_class

pytestmark = pytest.mark.gpu

CELLS = {"state_sum": state_sum, "ln_small": ln_small, "off_centre": off_centre}
SIZES = {"input_size": 21, "hidden_size": 75, "steps": 13}


@pytest.mark.parametrize("batch", [3, 40])
@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("schedule", ["graph", "persistent"])
def test_reductions_match_the_reference(cupy, schedule, name, batch):
    network, params, x, states = make_case(CELLS[name], 2, seed=batch, sizes=dict(SIZES, batch=batch))
    ref = reference.run(network, params, x, states, dtype=np.float64)
    result = schedule_class(schedule)(network, params).run(x, states, poison=True)
    assert_matches(result, ref, f"{schedule} {name} B={batch}")


def test_reruns_are_bit_identical(cupy):
    network, params, x, states = make_case(ln_small, 3, seed=5, sizes=dict(SIZES, batch=40))
    schedule = schedule_class("persistent")(network, params)
    first = schedule.run(x, states, poison=True).outputs
    for _ in range(5):
        assert np.array_equal(schedule.run(x, states, poison=True).outputs, first)


@pytest.mark.parametrize("schedule", ["graph", "persistent"])
def test_more_blocks_than_one_chunk_of_partials(cupy, schedule):
    """One layer of H = 600 spreads over more than 32 blocks (a unit or a few each), so the consumer adds its
    partials in several chunks of 32 (engine/codegen/reductions.py _chunks), the variance merged chunk by chunk."""
    network, params, x, states = make_case(ln_small, 1, seed=7, sizes=dict(SIZES, hidden_size=600, batch=5))
    program = schedule_class(schedule)(network, params)
    blocks = program.tiling.blocks_per_layer if hasattr(program, "tiling") else None
    ref = reference.run(network, params, x, states, dtype=np.float64)
    assert_matches(program.run(x, states, poison=True), ref, f"{schedule} H=600 ({blocks} blocks a layer)")
    if blocks is not None:
        assert blocks > 32, f"{blocks} blocks a layer: one chunk only, the test does not test the chunks"
