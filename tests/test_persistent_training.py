"""The training step's persistent forward (engine/autodiff/persistent.py) on the CPU: which layers qualify and why the
others do not, a block's share of the units and of shared memory, and the generated source of every qualifying preset
and unusual cell compiled by nvcc, at one row (the warp GEMV) and 64 (kernels/persistent_gemm.cuh).
tests/gpu/test_persistent_training_gpu.py runs it against the float64 reference."""
from __future__ import annotations

import pytest

import engine
from engine.autodiff import persistent
from engine.autodiff.fused_plan import training_plan
from engine.autodiff.stage_fusion import fused_stages
from test_autodiff import UNUSUAL
from test_fused_training_plan import PRESETS, _nvcc


def forward_stages(plan):
    return {k: s for k, s in fused_stages(plan).items() if s.forward and s.lag == 0}


def layout(name, B, H, I=None, sms=132):
    plan = training_plan(engine.preset(name).cell)
    sizes = {"I": I or H, "H": H, "P": H}
    stages = forward_stages(plan)
    return plan, stages, sizes, persistent.make_plan(plan, stages, sizes, B, sms)


def test_a_block_owns_a_few_units_of_each_stage_and_their_weight_rows():
    plan, stages, sizes, lay = layout("lstm", B=64, H=256, I=64)
    assert persistent.refusal(plan, stages, sizes, 64, 132) is None
    (item,) = lay.items
    assert lay.grid == 132 and item.units == 2 and item.members == 4 and item.k == 256
    assert item.columns == 8 and item.rows == 8
    assert lay.dots == 8 * persistent.row_stride(256)                  # the resident rows come first
    assert lay.shared_floats == lay.dots + 64 * 8                      # then B x the widest item's columns
    # lstm_proj: two stages a step, each its own resident rows, H's then P's
    plan, stages, sizes, lay = layout("lstm_proj", B=1, H=512)
    assert [(it.units, it.members, it.k) for it in lay.items] == [(4, 4, 512), (4, 1, 512)]
    assert lay.items[1].offset == lay.items[0].rows * persistent.row_stride(512)
    assert lay.shared_floats == lay.dots + 4 * 4                       # B = 1 row of the widest item's columns
    # fewer units than SMs: a block a unit
    assert layout("gru", B=2, H=40)[3].grid == 40


def test_refusals_say_why():
    plan, stages, sizes, _ = layout("lstm_fgr", B=64, H=1024)
    why = persistent.refusal(plan, stages, sizes, 64, 132)            # 4H = 4096 columns of K, 8 units a block
    assert why is not None and "bytes of shared memory" in why
    plan, stages, sizes, _ = layout("lstm", B=1, H=510)
    why = persistent.refusal(plan, {}, sizes, 1, 132)                 # nothing fused: a GEMM alone
    assert "does not fuse" in why
    assert "not a multiple of 4" in persistent.refusal(plan, stages, {"I": 510, "H": 510, "P": 510}, 1, 132)


def test_it_is_off_by_default_and_numpy_never_runs_it():
    from engine.autodiff.fused_numpy import NumpyRunner
    assert persistent.PERSISTENT is False
    runner = NumpyRunner(training_plan(engine.preset("lstm").cell))
    assert persistent.persistent_forward(runner, {"I": 8, "H": 8}, 2, 132) is None


@pytest.mark.nvcc
@pytest.mark.parametrize("B,H", [(1, 512), (64, 256)], ids=["gemv", "rows-gemm"])
def test_every_qualifying_preset_and_unusual_cell_compiles_with_nvcc(B, H, tmp_path):
    cells = {**{n: engine.preset(n).cell for n in PRESETS}, **UNUSUAL}
    sources, refused = {}, {}
    for name, cell in cells.items():
        plan = training_plan(cell)
        stages = forward_stages(plan)
        sizes = {"I": H, "H": H, "P": H}
        why = persistent.refusal(plan, stages, sizes, B, 132)
        if why is None:
            sources[name] = persistent.render(plan, persistent.make_plan(plan, stages, sizes, B, 132))
        else:
            refused[name] = why
    assert {"lstm", "gru", "gru_cho", "lstm_proj", "lstm_fgr", "peephole_lstm"} <= set(sources), refused
    _nvcc(sources, tmp_path)
