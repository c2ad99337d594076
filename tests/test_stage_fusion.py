"""Fused stages of the training step on the CPU (engine/autodiff/stage_fusion.py): which GEMM and kernel pairs fuse and
why others do not, the launch order across steps, the weight layouts the launches read, the sizes that fuse, and the
plan run by NumPy with its launches fused (the same results as float64: a wrong lag or order shows; random cells:
test_fused_training_plan.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_autodiff import UNUSUAL
from test_fused_training_plan import PRESETS, assert_close, run_plan_on_numpy

import engine
from engine.autodiff import fused_program, stage_fusion
from engine.autodiff.fused_numpy import NumpyRunner
from engine.autodiff.fused_plan import Place
from engine.autodiff.fused_planner import training_plan
from engine.autodiff.stage_fusion import fused_stages, fusible, launch_sequence, lay_out


def stages_of(name: str) -> dict:
    return {(s.forward, s.lag): s for s in fused_stages(training_plan(engine.preset(name).cell)).values()}


def test_the_lstm_fuses_its_forward_step_and_its_backward_across_steps():
    stages = stages_of("lstm")
    assert set(stages) == {(True, 0), (False, 1)}
    forward, backward = stages[(True, 0)], stages[(False, 1)]
    assert forward.members == 4 and forward.weight_layout(True)[1] == "interleaved"
    assert forward.weight_layout(False)[1] == "stacked"             # in place: the GEMV reads the stacked rows
    assert backward.members == 1 and backward.weight_layout(True)[1] == backward.weight_layout(False)[1] == "transposed"
    assert [forward.units(w) for w in stage_fusion.WIDTHS] == [2, 4, 8]


def test_a_two_stage_cell_fuses_all_four_pairs():
    stages = stages_of("gru_cho")
    assert sorted(stages) == [(False, 0), (False, 1), (True, 0)] and len(fused_stages(
        training_plan(engine.preset("gru_cho").cell))) == 4


def test_the_backward_launches_run_the_gemm_of_the_step_before_with_the_kernel():
    plan = training_plan(engine.preset("lstm").cell)
    launches = launch_sequence(plan.backward, range(3), False, fused_stages(plan))
    assert [(kind, *t) for kind, _, *t in launches] == [("kernel", 2), ("fused", 2, 1), ("fused", 1, 0), ("gemm", 0)]
    plain = launch_sequence(plan.backward, range(3), False, {})
    assert [(kind, t) for kind, _, t in plain] == [("kernel", 2), ("gemm", 2), ("kernel", 1), ("gemm", 1),
                                                   ("kernel", 0), ("gemm", 0)]
    forward = launch_sequence(plan.forward, range(2), True, fused_stages(plan))
    assert [(kind, *t) for kind, _, *t in forward] == [("fused", 0, 0), ("fused", 1, 1)]


def test_pairs_that_would_race_are_refused_with_the_reason():
    plan = training_plan(engine.preset("lstm").cell)
    (_, gemm), (_, kernel) = plan.forward.order
    assert fusible(plan, gemm, kernel, 0, True) is None
    # the kernel writing the rows the GEMM reads (another block may still be reading them)
    into_operand = dataclasses.replace(kernel, stores=kernel.stores + (("h_next", Place("row", gemm.operand.buffer)),))
    assert "writes h_next into the rows the GEMM reads" in fusible(plan, gemm, into_operand, 0, True)
    # the kernel reading a GEMM value of another unit than its own
    value, place = next((v, p) for v, p in kernel.loads if p.buffer == gemm.out.buffer)
    shifted = dataclasses.replace(place, offset=place.offset + engine.plan.Lin(c=1))
    elsewhere = dataclasses.replace(kernel, loads=tuple((v, shifted if v == value else p) for v, p in kernel.loads))
    assert "at another element than its own" in fusible(plan, gemm, elsewhere, 0, True)
    # a hoisted GEMM, and members wider than the kernel
    assert "hoisted" in fusible(plan, plan.forward.hoisted[0], kernel, 0, True)
    back_kernel, back_gemm = plan.backward.order[0][1], plan.backward.order[1][1]
    wider = back_gemm.n + back_gemm.n
    assert "not H columns each" in fusible(plan, dataclasses.replace(back_gemm, n=wider, out_blocks=(wider,)),
                                           back_kernel, 1, False)
    assert "do not make up its" in fusible(plan, dataclasses.replace(back_gemm, n=wider), back_kernel, 1, False)
    # the backward pair within one step: the kernel writes the dy rows the GEMM reads
    assert "into the rows the GEMM reads" in fusible(plan, back_gemm, back_kernel, 0, False)


def test_the_weight_layouts_put_a_units_members_side_by_side():
    rng = np.random.default_rng(0)
    members, D, K = 3, 4, 5
    stacked = rng.standard_normal((members * D, K))
    interleaved = lay_out(np, stacked, "interleaved", members)
    for m in range(members):
        for j in range(D):
            np.testing.assert_array_equal(interleaved[j * members + m], stacked[m * D + j])
    np.testing.assert_array_equal(lay_out(np, stacked, "transposed", 1), stacked.T)


def test_which_sizes_fuse(monkeypatch):
    monkeypatch.setattr(stage_fusion, "FUSE_MAX_ROWS", 64)
    plan = training_plan(engine.preset("gru_cho").cell)
    stages = fused_stages(plan)
    sizes = [{"I": 16, "H": 16, "P": 16}]
    assert stage_fusion.fuses(stages, 1, sizes) and stage_fusion.fuses(stages, 64, sizes)
    assert not stage_fusion.fuses(stages, stage_fusion.FUSE_MAX_ROWS + 1, sizes)
    assert not stage_fusion.fuses(stages, 1, [{"I": 16, "H": 13, "P": 13}])       # K % 4: no 16-byte loads
    assert not stage_fusion.fuses({}, 1, sizes)
    # the tiled GEMM's staging starts 16-byte aligned after the GEMM columns, whatever B
    stage = next(iter(stages.values()))
    for B in (1, 3, 5, 64):
        assert stage_fusion.widths(stage, B)
        for width in stage_fusion.WIDTHS:
            assert (B * stage.columns(width) + 3) // 4 * 4 <= stage_fusion.shared_floats(stage, B, width)
    assert stage_fusion.widths(stage, 1) == list(stage_fusion.WIDTHS)
    for B in (1, 3, 64):
        assert stage_fusion.widths(stage, B) == [w for w in stage_fusion.WIDTHS if 4 * stage_fusion.shared_floats(
            stage, B, w) <= stage_fusion.MAX_SHARED_BYTES]
    monkeypatch.setattr(stage_fusion, "MAX_SHARED_BYTES", 4 * stage_fusion.shared_floats(stage, 64, 16))
    assert stage_fusion.widths(stage, 64) == [8, 16] and stage_fusion.fuses(stages, 64, sizes)
    monkeypatch.setattr(stage_fusion, "MAX_SHARED_BYTES", 4 * stage_fusion.shared_floats(stage, 64, 8) - 4)
    assert not stage_fusion.fuses(stages, 64, sizes)          # no variant fits


def test_choose_width_fills_half_the_gpu_per_layer(monkeypatch):
    stages = stages_of("lstm")
    forward, backward = stages[(True, 0)], stages[(False, 1)]
    assert stage_fusion.choose_width(forward, 512, 1, 132) == 32      # 64 blocks of 8 units
    assert stage_fusion.choose_width(backward, 512, 1, 132) == 8      # 64 blocks of 8 units
    assert stage_fusion.choose_width(forward, 8, 1, 132) == 8         # too few units for any: the narrowest
    monkeypatch.setattr(stage_fusion, "MAX_SHARED_BYTES", 4 * stage_fusion.shared_floats(forward, 64, 16))
    assert stage_fusion.choose_width(forward, 512, 64, 132) == 16     # 32 columns of 64 rows do not fit
    monkeypatch.setattr(stage_fusion, "WIDTH", 8)
    assert stage_fusion.choose_width(forward, 512, 64, 132) == 8      # forced


@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront", "layers"])
@pytest.mark.parametrize("name", PRESETS)
def test_every_presets_fused_launches_run_by_numpy_equal_the_reference(name, wavefront, monkeypatch):
    """H = 8 and B = 3: the sizes fuse, so the NumPy runner issues the fused launches (GEMM of step t + lag, then
    the kernel of step t), chunk by chunk, in their order."""
    monkeypatch.setattr(stage_fusion, "FUSE_MAX_ROWS", 64)
    cell = engine.preset(name).cell
    monkeypatch.setattr(fused_program, "WAVEFRONT_CHUNK", 2)
    programs = []
    real = fused_program.Program.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        programs.append(self)
    monkeypatch.setattr(fused_program.Program, "__init__", spy)
    assert_close(run_plan_on_numpy(cell, seed=len(name), H=8, I=4, T=5, P=4 if cell.uses_projection else None,
                                   wavefront=wavefront))
    assert programs and programs[-1].fused == bool(fused_stages(training_plan(cell)))


@pytest.mark.parametrize("name", sorted(UNUSUAL))
def test_unusual_cells_fused_launches_run_by_numpy_equal_the_reference(name):
    assert_close(run_plan_on_numpy(UNUSUAL[name], seed=2, layers=3, H=8, I=8, B=2))


@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho", "mgu", "peephole_lstm"])
def test_split_gemms_summed_in_their_kernels_run_by_numpy_equal_the_reference(name, monkeypatch):
    """Where a stage is not fused (here FUSE off) and its GEMM splits K, the launches are the split GEMM and the kernel
    that sums the parts ("split"), across steps in the backward as the fused ones are."""
    from engine.autodiff import fused_numpy
    monkeypatch.setattr(stage_fusion, "FUSE", False)
    monkeypatch.setattr(fused_numpy, "SPLIT", True)
    cell = engine.preset(name).cell
    plan = training_plan(cell)
    layer = type("L", (), {"fused": False, "sizes": {"I": 8, "H": 8, "P": 8}, "B": 3})()
    kinds = [item[0] for item in NumpyRunner(plan).launches(plan.backward, range(3), False, layer)]
    assert "split" in kinds and "fused" not in kinds
    assert_close(run_plan_on_numpy(cell, seed=4, H=8, I=8, T=5))
    monkeypatch.setattr(stage_fusion, "SPLIT_SUMS", False)
    assert "split" not in [item[0] for item in NumpyRunner(plan).launches(plan.backward, range(3), False, layer)]
