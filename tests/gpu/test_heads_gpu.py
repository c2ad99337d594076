"""Heads in the tiling on the GPU (engine/schedules/heads.py gemm_heads): the sLSTM's recurrent GEMM reading only a
block's head, on the warp GEMV (B = 3, float32 and bfloat16) and the bulk tensor-core pipeline (B = 16 in bfloat16,
B = 40 in float16), one and two layers, against the float64 reference (float32) or the reference that emulates the
mode, and against the same schedule multiplying the whole block-diagonal matrix."""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import assert_matches, make_case, relative_error
from test_precision_gpu import check_mode

import engine
from engine.backends import reference
from engine.schedules import base, schedule_class
from engine.schedules.tiling import TileConfig

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("batch,precision", [(3, "float32"), (3, "bfloat16"), (16, "bfloat16"), (40, "float16")])
def test_slstm_reads_one_head_and_matches(cupy, monkeypatch, batch, precision, layers):
    size = {"input_size": 64, "hidden_size": 256, "batch": batch, "steps": 21}
    network, params, x, states = make_case(engine.preset("slstm").cell, layers, seed=batch + layers, sizes=size)
    result = schedule_class("persistent")(network, params, precision=precision).run(x, states, poison=True)
    assert "reads one head's 64 of 256 columns" in result.info["tiling"], result.info["tiling"]
    if precision == "float32":
        assert_matches(result, reference.run(network, params, x, states, dtype=np.float64), f"B={batch} L={layers}")
    else:
        check_mode(result, network, params, x, states, precision, f"slstm {precision} B={batch} L={layers}")
    make = base.make_tiling                   # the same schedule, multiplying the zeros
    monkeypatch.setattr(base, "make_tiling", lambda *a, **k: make(*a, **dict(k, heads=False)))
    other = schedule_class("persistent")(network, params, precision=precision).run(x, states, poison=True)
    assert "reads one head" not in other.info["tiling"], other.info["tiling"]
    assert relative_error(result.outputs, other.outputs) <= (1e-5 if precision == "float32" else 2e-3)


def test_a_head_of_192_columns_in_one_chunk(cupy):
    """H = 768, 4 heads: each block's head is 192 columns, staged as one bulk chunk of 192 (tiling.make_tiling)."""
    size = {"input_size": 64, "hidden_size": 768, "batch": 16, "steps": 9}
    network, params, x, states = make_case(engine.preset("slstm").cell, 1, seed=5, sizes=size)
    result = schedule_class("persistent")(network, params, precision="bfloat16").run(x, states, poison=True)
    assert "K chunk 192" in result.info["tiling"] and "reads one head's 192" in result.info["tiling"], \
        result.info["tiling"]
    check_mode(result, network, params, x, states, "bfloat16", "slstm bfloat16 H=768 B=16")


@pytest.mark.parametrize("hidden,batch,precision,layers", [
    (256, 3, "float32", 1), (256, 3, "bfloat16", 2), (256, 16, "bfloat16", 1), (256, 16, "bfloat16", 2),
    (768, 16, "bfloat16", 1), (256, 40, "float16", 2)])
def test_head_sync_computes_what_grid_sync_computes(cupy, hidden, batch, precision, layers):
    """TileConfig(sync="head"): a block waits for its own head's blocks only (and for every head of the layer below).
    Only the waiting changes, so the outputs are bit-identical to the grid barrier's, and they match the reference."""
    size = {"input_size": 64, "hidden_size": hidden, "batch": batch, "steps": 33}
    network, params, x, states = make_case(engine.preset("slstm").cell, layers, seed=hidden + batch, sizes=size)
    runs = {}
    for sync in ("grid", "head"):
        schedule = schedule_class("persistent")(network, params, precision=precision, config=TileConfig(sync=sync))
        runs[sync] = schedule.run(x, states, poison=True)
    assert "per-head arrival counters" in runs["head"].info["tiling"], runs["head"].info["tiling"]
    for name in runs["grid"].final_states:
        assert np.array_equal(cupy.asnumpy(runs["head"].final_states[name]),
                              cupy.asnumpy(runs["grid"].final_states[name])), name
    assert np.array_equal(cupy.asnumpy(runs["head"].outputs), cupy.asnumpy(runs["grid"].outputs))
    if precision == "float32":
        assert_matches(runs["head"], reference.run(network, params, x, states, dtype=np.float64), "sync=head")
    else:
        check_mode(runs["head"], network, params, x, states, precision, f"slstm {precision} sync=head")


def test_layer_sync_on_one_layer(cupy):
    """TileConfig(sync="layer") with one layer a launch: the counters alone order the steps (no layer below)."""
    size = {"input_size": 48, "hidden_size": 200, "batch": 5, "steps": 29}
    network, params, x, states = make_case(engine.preset("lstm").cell, 1, seed=3, sizes=size)
    result = schedule_class("persistent")(network, params, config=TileConfig(sync="layer")).run(x, states, poison=True)
    assert "per-layer arrival counters" in result.info["tiling"], result.info["tiling"]
    assert_matches(result, reference.run(network, params, x, states, dtype=np.float64), "sync=layer, one layer")
