"""The training step's persistent launches (engine/autodiff/persistent.py, PERSISTENT on), forward and backward,
against the float64 reference on fresh random inputs, work buffers poisoned with NaN first: every preset and the
unusual cells (some persistent one way only, the fused launches the other), at one row (the warp GEMV), two, and more
than four (kernels/persistent_gemm.cuh), with more units than blocks, fewer, and a short last block; in chunks of the
wavefront and layer by layer."""
from __future__ import annotations

import numpy as np
import pytest
from test_autodiff import UNUSUAL
from test_fused_training_gpu import TOL, assert_equal_reference, case, relative

import engine
from engine.autodiff import bptt, fused_program, fused_tape, persistent

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("release_gpu_memory")]


@pytest.fixture
def persistent_on(monkeypatch):
    monkeypatch.setattr(persistent, "PERSISTENT", True)


# Presets the persistent step refuses, with the refusal tests/test_persistent_training.py checks on the CPU.
NOT_PERSISTENT = {"ln_lstm": "does not fuse with a kernel", "ln_gru": "does not fuse with a kernel"}


def check(cupy, cell, seed, wavefront=None, both=True, **sizes):
    network, params, x, initial, d_out, d_final = case(cell, seed, **sizes)
    want = bptt(network, params, x, initial, d_out, d_final)
    tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32),
                        {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()}, poison=True,
                        wavefront=wavefront)
    pairs = tape.program.persistent
    if cell.name in NOT_PERSISTENT:           # refused by name; the fused launches run it and must still be right
        assert pairs is None or not any(pairs), f"{cell.name} ran persistent, which NOT_PERSISTENT says it cannot"
    else:
        assert pairs is not None and all(pairs), "no layer ran persistent"
    if both and cell.name not in NOT_PERSISTENT:
        assert all(f is not None and b is not None for f, b in pairs), "a direction did not run persistent"
    got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32),
                        {s: cupy.asarray(v, dtype=cupy.float32) for s, v in d_final.items()})
    assert_equal_reference(got, want, network)


@pytest.mark.usefixtures("persistent_on")
@pytest.mark.parametrize("B", [1, 2, 6], ids=["gemv-1", "gemv-2", "tiled-6"])
@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_every_preset_equals_the_reference(cupy, name, B):
    cell = engine.preset(name).cell
    check(cupy, cell, seed=len(name) + B, layers=2, I=8, H=12, T=6, B=B, P=8 if cell.uses_projection else None)


@pytest.mark.usefixtures("persistent_on")
@pytest.mark.parametrize("name", sorted(n for n in UNUSUAL if n not in ("shared_weight", "disjoint_operands")))
def test_unusual_cells_equal_the_reference(cupy, name):
    check(cupy, UNUSUAL[name], seed=4, both=False, I=4, H=8, T=5, B=3)


@pytest.mark.usefixtures("persistent_on")
@pytest.mark.parametrize("name", ["lstm", "lstm_fgr", "lstm_proj", "gru_cho"])
def test_more_units_than_blocks_with_a_short_last_block(cupy, name):
    """H = 300 on 132 blocks: 3 units a block, the last blocks short or idle; B = 33 rows through the tiled GEMM."""
    cell = engine.preset(name).cell
    check(cupy, cell, seed=8, layers=2, I=20, H=300, T=5, B=33, P=300 if cell.uses_projection else None)


@pytest.mark.usefixtures("persistent_on")
@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront-chunks", "layers"])
@pytest.mark.parametrize("name", ["lstm", "lstm_proj", "gru_cho"])
def test_a_long_sequence_in_chunks_and_layer_by_layer(cupy, name, wavefront):
    """T = 70: the wavefront's forward is a persistent launch a layer and chunk of WAVEFRONT_CHUNK steps (t0, t1),
    three layers at once on their share of the SMs; layer by layer, one launch a layer on all of them."""
    assert 70 > fused_program.WAVEFRONT_CHUNK
    cell = engine.preset(name).cell
    check(cupy, cell, seed=6, wavefront=wavefront, layers=3, I=16, H=64, T=70, B=5,
          P=32 if cell.uses_projection else None)


def test_the_refused_cells_keep_the_fused_forward(cupy, monkeypatch):
    monkeypatch.setattr(persistent, "PERSISTENT", True)
    network, params, x, initial, d_out, d_final = case(UNUSUAL["shared_weight"], 2)
    tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32), None, poison=True)
    assert tape.program.persistent is None
    got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32))
    want = bptt(network, params, x, None, d_out)
    assert relative(got.x.get(), want.x) < TOL
    assert np.isfinite(got.outputs.get()).all()


def test_auto_runs_persistent_only_for_two_stages_where_a_block_reads_little_x(cupy, monkeypatch):
    """PERSISTENT = "auto" (the default): at H = 256 and B = 64 in the wavefront of 2 layers (66 blocks a layer, 16
    columns of K = 256 forward) GRU-Cho's two-stage step runs persistent both ways; the LSTM's one-stage step and
    lstm_fgr's (K = 1024 both ways) do not; all equal float64."""
    monkeypatch.setattr(persistent, "PERSISTENT", "auto")
    check(cupy, engine.preset("gru_cho").cell, seed=12, layers=2, I=16, H=256, T=4, B=64)
    for name in ("lstm", "lstm_fgr"):
        network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, 12, layers=2, I=16, H=256,
                                                           T=4, B=64)
        tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32), None, poison=True)
        assert tape.program.persistent is None, name
        got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32))
        assert relative(got.x.get(), bptt(network, params, x, None, d_out).x) < TOL, name
