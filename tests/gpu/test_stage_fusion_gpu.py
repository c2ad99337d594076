"""Fused stages of the training step on the GPU (engine/autodiff/stage_fusion.py, kernels/fused_stage.cuh): a step
GEMM and the kernel after it as one launch, against the float64 reference on fresh random inputs with the work buffers
poisoned: the warp GEMV (B <= 2) and the tiled GEMM (B > 2), every variant width, unit counts that leave a last block
short, every preset, both wavefront modes; the same gradients with fusion off; and sizes that do not fuse."""
from __future__ import annotations

import numpy as np
import pytest
from test_fused_training_gpu import assert_equal_reference, case
from test_stacks import CASES as STACK_CASES

import engine
from engine.autodiff import bptt, fused_tape, stage_fusion

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("release_gpu_memory")]


def run(cupy, network, params, x, initial, d_out, d_final, wavefront=None):
    tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32),
                        {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()}, poison=True,
                        wavefront=wavefront)
    program = tape.program
    got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32),
                        {s: cupy.asarray(v, dtype=cupy.float32) for s, v in d_final.items()})
    return got, program


@pytest.mark.parametrize("width", stage_fusion.WIDTHS)
@pytest.mark.parametrize("B", [1, 2, 3, 64])
@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_every_preset_fused_equals_the_reference(cupy, name, B, width, monkeypatch):
    monkeypatch.setattr(stage_fusion, "WIDTH", width)
    monkeypatch.setattr(stage_fusion, "FUSE_MAX_ROWS", 64)     # the tiled form too (off by default)
    cell = engine.preset(name).cell
    H = 12 if B < 3 else 20                # short last blocks in every width
    network, params, x, initial, d_out, d_final = case(cell, seed=B + len(name), layers=2, I=6, H=H, T=6, B=B,
                                                       P=4 if cell.uses_projection else None)
    want = bptt(network, params, x, initial, d_out, d_final)
    got, program = run(cupy, network, params, x, initial, d_out, d_final)
    runner = program.runner
    if runner.stages:
        assert program.fused, name
        layer = program.layers[0]
        kinds = [item[0] for item in runner.launches(runner.plan.forward, range(3), True, layer)
                 + runner.launches(runner.plan.backward, range(3), False, layer)]
        assert "fused" in kinds, name
    assert_equal_reference(got, want, network)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "in-place"])
@pytest.mark.parametrize("width", stage_fusion.WIDTHS)
@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_every_preset_fused_in_the_default_module_equals_the_reference(cupy, name, B, width, interleaved,
                                                                       monkeypatch):
    """The default module (no tiled form), the GEMV on the interleaved copy of the weights or on the stacked (forward)
    and transposed (backward) weights in place, row m * D + unit (stage_fusion.INTERLEAVED)."""
    monkeypatch.setattr(stage_fusion, "WIDTH", width)
    monkeypatch.setattr(stage_fusion, "INTERLEAVED", interleaved)
    cell = engine.preset(name).cell
    network, params, x, initial, d_out, d_final = case(cell, seed=B + 2 * len(name), layers=2, I=6, H=12, T=6, B=B,
                                                       P=4 if cell.uses_projection else None)
    want = bptt(network, params, x, initial, d_out, d_final)
    got, program = run(cupy, network, params, x, initial, d_out, d_final)
    assert not program.runner.tiled and program.runner.interleaved == interleaved
    if program.runner.stages:
        assert program.fused, name
        if not interleaved:
            assert all(layout[1] != "interleaved" for layer in program.layers for layout in layer.stage_weights)
    assert_equal_reference(got, want, network)


@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront", "layers"])
@pytest.mark.parametrize("B", [1, 8])
@pytest.mark.parametrize("name", ["lstm", "gru_cho", "mgu"])
def test_fused_and_unfused_steps_agree_at_anchor_like_sizes(cupy, name, B, wavefront, monkeypatch):
    """Wider layers (H = 96: 12 blocks, K = 96 and 4H = 384 in the backward) over 3 layers and 12 steps: with fused
    stages and without them, both against the reference."""
    monkeypatch.setattr(stage_fusion, "FUSE_MAX_ROWS", 64)
    network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, seed=7, layers=3, I=40, H=96,
                                                       T=12, B=B)
    want = bptt(network, params, x, initial, d_out, d_final)
    results = {}
    for on in (True, False):
        monkeypatch.setattr(stage_fusion, "FUSE", on)
        got, program = run(cupy, network, params, x, initial, d_out, d_final, wavefront=wavefront)
        assert program.fused == on
        assert_equal_reference(got, want, network)
        results[on] = got
    np.testing.assert_allclose(results[True].x.get(), results[False].x.get(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("B, H", [(stage_fusion.FUSE_MAX_ROWS + 1, 8), (1, 13)], ids=["batch", "K"])
def test_sizes_that_do_not_fuse_keep_cublas(cupy, B, H):
    """A batch above FUSE_MAX_ROWS, and a K that is not a multiple of 4 (no 16-byte loads): every GEMM is cuBLAS's."""
    cell = engine.preset("gru_cho").cell
    network, params, x, initial, d_out, d_final = case(cell, seed=4, layers=2, I=8, H=H, T=3, B=B)
    want = bptt(network, params, x, initial, d_out, d_final)
    got, program = run(cupy, network, params, x, initial, d_out, d_final)
    assert not program.fused
    runner = program.runner
    assert all(item[0] != "fused" for item in runner.launches(runner.plan.forward, range(2), True, program.layers[0]))
    assert_equal_reference(got, want, network)


@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho", "mgu"])
def test_split_gemms_summed_in_their_kernels_equal_the_reference(cupy, name, monkeypatch):
    """B = 64 (not fused by default) and H = 256: the step GEMMs whose K is 256 or more split (engine/autodiff/cublas.py
    split_k), and their kernels sum the parts (FusedStage.summed); against the reference, and with SPLIT_SUMS off."""
    network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, seed=9, layers=2, I=32, H=256,
                                                       T=6, B=64)
    want = bptt(network, params, x, initial, d_out, d_final)
    for on in (True, False):
        monkeypatch.setattr(stage_fusion, "SPLIT_SUMS", on)
        got, program = run(cupy, network, params, x, initial, d_out, d_final)
        runner, layer = program.runner, program.layers[1]
        kinds = [item[0] for item in runner.launches(runner.plan.backward, range(3), False, layer)]
        assert not program.fused and ("split" in kinds) == on, kinds
        assert_equal_reference(got, want, network)


@pytest.mark.parametrize("B", [1, 2, 3, 64])
@pytest.mark.parametrize("name", sorted(STACK_CASES))
def test_stacked_cells_equal_the_reference(cupy, name, B):
    """Stacks (engine/autodiff/fused_plan.py Stack): the states' matmuls as one GEMM each way, its grid's zero blocks,
    the output stored again for the layer above; fused at B <= 2, cuBLAS (split-K sums) above, 3 layers."""
    cell = STACK_CASES[name]
    network, params, x, initial, d_out, d_final = case(cell, seed=B + 3, layers=3, I=6, H=12, T=6, B=B)
    want = bptt(network, params, x, initial, d_out, d_final)
    got, program = run(cupy, network, params, x, initial, d_out, d_final)
    assert program.fused == (B <= stage_fusion.FUSE_MAX_ROWS)
    assert_equal_reference(got, want, network)


@pytest.mark.parametrize("B", [1, 8])
def test_lstm_fgr_fused_and_unfused_agree_at_anchor_like_sizes(cupy, B, monkeypatch):
    """K = 4H = 384 in both directions' stacked GEMM, 3 layers, 12 steps."""
    monkeypatch.setattr(stage_fusion, "FUSE_MAX_ROWS", 64)
    network, params, x, initial, d_out, d_final = case(engine.preset("lstm_fgr").cell, seed=11, layers=3, I=40,
                                                       H=96, T=12, B=B)
    want = bptt(network, params, x, initial, d_out, d_final)
    for on in (True, False):
        monkeypatch.setattr(stage_fusion, "FUSE", on)
        got, program = run(cupy, network, params, x, initial, d_out, d_final)
        assert program.fused == on
        assert_equal_reference(got, want, network)
