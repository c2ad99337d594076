"""The training step's head-local launches (engine/autodiff/persistent.py head_local): a cell whose step GEMMs are all
block-diagonal by heads (the sLSTM) runs each direction as one launch of blocks that own a head and a few batch rows,
with no grid barrier. Against the float64 reference in fp32 (work buffers poisoned with NaN first), at 1, 2 and 4 rows
a block, a head on one block and on a cluster of 2 or 4 (persistent_heads.MIN_SPLIT raised: the cluster barrier between
items), in wavefront chunks and layer by layer, under PERSISTENT = "auto" (the default takes them) and True; and in
tf32, float16 and bfloat16 against the plan run by NumPy in the mode (tests/gpu/test_fused_training_precision_gpu.py's
yardstick), where these launches are the only persistent ones a mode may take."""
from __future__ import annotations

import pytest
from test_fused_training_gpu import assert_equal_reference, case
from test_fused_training_precision_gpu import case as mode_case
from test_fused_training_precision_gpu import check_against_the_emulation

import engine
from engine.autodiff import bptt, fused_tape, persistent, persistent_heads

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("release_gpu_memory")]


def head_local(tape) -> list:
    """Each layer's (forward, backward) launches' heads (0: not head-local, None: no persistent launch)."""
    pairs = tape.program.persistent or []
    return [tuple(None if launch is None else launch.layout.heads for launch in pair) if pair else (None, None)
            for pair in pairs]


def check_fp32(cupy, seed, wavefront=None, **sizes):
    network, params, x, initial, d_out, d_final = case(engine.preset("slstm").cell, seed, **sizes)
    want = bptt(network, params, x, initial, d_out, d_final)
    tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32),
                             {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()}, poison=True,
                             wavefront=wavefront)
    assert head_local(tape) == [(4, 4)] * network.num_layers, head_local(tape)
    got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32),
                        {s: cupy.asarray(v, dtype=cupy.float32) for s, v in d_final.items()})
    assert_equal_reference(got, want, network)
    return tape


@pytest.mark.parametrize("split", [1, 2, 4], ids=["a-block-a-head", "cluster-2", "cluster-4"])
@pytest.mark.parametrize("setting", ["auto", True])
@pytest.mark.parametrize("B,rows", [(3, 1), (32, 2), (200, 4)], ids=["1-row", "2-rows", "4-rows-two-waves"])
def test_fp32_equals_the_reference(cupy, monkeypatch, setting, B, rows, split):
    """H = 32 x split: 4 heads of 8 units a block. Two layers in the wavefront, each on its share of the SMs (66 of an H100's or
    H200's 132): B = 32 is 4 x 16 blocks of 2 rows, B = 200 4 x 50 blocks of 4 rows, more than the share (no grid
    barrier needs them resident)."""
    monkeypatch.setattr(persistent, "PERSISTENT", setting)
    monkeypatch.setattr(persistent_heads, "MIN_SPLIT", split)
    tape = check_fp32(cupy, seed=B + split, layers=2, I=8, H=32 * split, T=6, B=B)
    layouts = [launch.layout for pair in tape.program.persistent for launch in pair]
    if split > 1:                         # a cluster a head: more blocks, so fewer row groups fit the share
        rows = persistent.head_rows(B, 4 * split, tape.program.runner.sms // 2)
    assert {(lay.split, lay.rows) for lay in layouts} == {(split, rows)}, [(lay.split, lay.rows) for lay in layouts]


@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront-chunks", "layers"])
@pytest.mark.parametrize("split", [1, 2], ids=["a-block-a-head", "cluster-2"])
def test_a_long_sequence_in_chunks_and_layer_by_layer(cupy, monkeypatch, wavefront, split):
    """T = 70: launches of WAVEFRONT_CHUNK steps, a chunk's first backward step reading the GEMM the chunk after it
    ran (lag 1); three layers."""
    monkeypatch.setattr(persistent_heads, "MIN_SPLIT", split)
    check_fp32(cupy, seed=5, wavefront=wavefront, layers=3, I=16, H=64, T=70, B=5)


@pytest.mark.parametrize("split,H", [(1, 256), (2, 256), (1, 48)], ids=["a-block-a-head", "cluster-2", "ffma-head"])
@pytest.mark.parametrize("mode", ["tf32", "float16", "bfloat16"])
def test_each_mode_matches_its_emulation(cupy, monkeypatch, mode, split, H):
    """I = 64, H = 256 (4 heads of 64 units), 2 layers, B = 16, T = 40: the head-local launches both ways in the
    mode (operands rounded as they enter the products, weights rounded once a load, fp32 sums: fp16 and bf16 on
    tensor cores, rnn_head_mma), checked as every mode's step is: near the NumPy plan in the mode, and the mode's own
    distance from float64. H = 48 (12 columns a head, not whole k steps of 16) takes the FFMA product in every
    mode."""
    monkeypatch.setattr(persistent_heads, "MIN_SPLIT", split)
    network, params, x, initial, d_out = mode_case(engine.preset("slstm").cell, seed=9, layers=2, I=64, H=H, T=40,
                                                   B=16)
    tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32),
                             {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()}, poison=True,
                             precision=mode)
    assert head_local(tape) == [(4, 4)] * 2, head_local(tape)
    got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32))
    check_against_the_emulation(got, network, params, x, initial, d_out, mode, f"slstm {mode} head-local")


def test_off_runs_the_fused_launches_and_agrees(cupy, monkeypatch):
    """PERSISTENT = False: the same bf16 step through cuBLAS on rounded operands, a launch a step; the head-local
    launches' gradients are as near to it as two summation orders of one mode allow."""
    from gradient_errors import gradient_errors
    network, params, x, initial, d_out = mode_case(engine.preset("slstm").cell, seed=4, layers=1, I=64, H=256, T=30,
                                                   B=16)
    runs = {}
    for setting in ("auto", False):
        monkeypatch.setattr(persistent, "PERSISTENT", setting)
        tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32),
                                 {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()},
                                 precision="bfloat16")
        assert head_local(tape) == ([(4, 4)] if setting else []), (setting, head_local(tape))
        runs[setting] = tape.backward(cupy.asarray(d_out, dtype=cupy.float32))
    differences = gradient_errors(runs["auto"], runs[False], network.cell.state_names, 1, floor=1e-2)
    assert 0 < max(differences.values()) < 5e-2, differences
