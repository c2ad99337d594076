"""The training step's persistent launches (engine/autodiff/persistent.py) on the CPU: which layers qualify and why
the others do not, the items of a step each way, a block's share of the units and of shared memory, and the generated
source of every qualifying preset and unusual cell, both directions, compiled by nvcc at one row (the warp GEMV) and
64 (kernels/persistent_gemm.cuh). tests/gpu/test_persistent_training_gpu.py runs them against the float64 reference."""
from __future__ import annotations

import pytest
from test_autodiff import UNUSUAL
from test_fused_training_plan import PRESETS, _nvcc

import engine
from engine.autodiff import persistent
from engine.autodiff.fused_planner import training_plan
from engine.autodiff.stage_fusion import fused_stages


def stages_of(plan, forward):
    return {k: s for k, s in fused_stages(plan).items() if s.forward == forward}


def layout(name, B, H, I=None, blocks=132, forward=True):
    plan = training_plan(engine.preset(name).cell)
    sizes = {"I": I or H, "H": H, "P": H}
    stages = stages_of(plan, forward)
    try:
        return plan, stages, sizes, persistent.make_plan(plan, stages, sizes, B, blocks, forward)
    except persistent.Refused:
        return plan, stages, sizes, None


def test_a_block_owns_a_few_units_of_each_stage_and_their_weight_rows():
    plan, stages, sizes, lay = layout("lstm", B=64, H=256, I=64)
    (item,) = lay.items
    assert lay.grid == 132 and item.units == 2 and item.members == 4 and item.k == 256 and item.lag == 0
    assert item.columns == 8 and item.rows == 8 and lay.last is None
    assert lay.dots == 8 * persistent.row_stride(256)                  # the resident rows come first
    assert lay.shared_floats == lay.dots + 64 * 8                      # then B x the widest item's columns
    # lstm_proj: two stages a step, each its own resident rows, H's then P's
    plan, stages, sizes, lay = layout("lstm_proj", B=1, H=512)
    assert [(it.units, it.members, it.k) for it in lay.items] == [(4, 4, 512), (4, 1, 512)]
    assert lay.items[1].offset == lay.items[0].rows * persistent.row_stride(512)
    assert lay.shared_floats == lay.dots + 4 * 4                       # B = 1 row of the widest item's columns
    # fewer units than SMs: a block a unit
    assert layout("gru", B=2, H=40)[3].grid == 40


def test_the_backward_pairs_the_gemm_of_the_next_step_and_runs_the_last_gemm_after_the_loop():
    """stage_fusion.launch_sequence's order: per step the GEMM of step t + 1 with the kernel of step t; after the
    loop the GEMM of step t0 alone, on its twin item's resident rows."""
    plan, stages, sizes, lay = layout("lstm", B=64, H=256, I=64, forward=False)
    (item,) = lay.items
    assert item.lag == 1 and item.gemm.name == "lstm_bwd_h_s0" and item.kernel.name == "lstm_bwd_s0_H"
    assert item.members == 1 and item.k == 4 * 256                     # dh = dy (B x 4H) @ R (4H x H)
    assert lay.last is not None and lay.last.gemm_only and lay.last.gemm is item.gemm
    assert (lay.last.offset, lay.last.weight) == (item.offset, item.weight)
    source = persistent.render(plan, lay)
    assert "for (int t = t1 - 1; t >= t0; --t)" in source and "const bool here = t + 1 < t1;" in source
    # lstm_proj: the kernel of step t after the projection's GEMM of step t + 1, then the same step's pair
    plan, stages, sizes, lay = layout("lstm_proj", B=64, H=256, forward=False)
    assert [(it.kernel.name, it.gemm.name, it.lag) for it in lay.items] == [
        ("lstm_proj_bwd_s0_P", "lstm_proj_bwd_h_s1", 1), ("lstm_proj_bwd_s1_H", "lstm_proj_bwd_h_next_mul_s0", 0)]
    assert lay.last.gemm.name == "lstm_proj_bwd_h_s1"


def test_refusals_say_why():
    plan, stages, sizes, _ = layout("lstm_fgr", B=64, H=1024)
    why = persistent.refusal(plan, stages, sizes, 64, 132)            # 4H = 4096 columns of K, 8 units a block
    assert why is not None and "bytes of shared memory" in why
    plan, stages, sizes, _ = layout("lstm", B=1, H=510)
    assert "does not fuse" in persistent.refusal(plan, {}, sizes, 1, 132)          # nothing fused: a GEMM alone
    assert "not a multiple of 4" in persistent.refusal(plan, stages, {"I": 510, "H": 510, "P": 510}, 1, 132)
    shared = training_plan(UNUSUAL["shared_weight"])
    assert "does not fuse" in persistent.refusal(shared, stages_of(shared, True), {"I": 8, "H": 8, "P": 8}, 4, 132)


def test_it_is_auto_by_default_and_numpy_never_runs_it():
    from engine.autodiff.fused_numpy import NumpyRunner
    assert persistent.PERSISTENT == "auto"
    runner = NumpyRunner(training_plan(engine.preset("lstm").cell))
    assert persistent.persistent_launch(runner, {"I": 8, "H": 8}, 2, 132, True) is None


@pytest.mark.nvcc
@pytest.mark.parametrize("B,H", [(1, 512), (64, 256)], ids=["gemv", "rows-gemm"])
def test_every_qualifying_preset_and_unusual_cell_compiles_with_nvcc(B, H, tmp_path):
    cells = {**{n: engine.preset(n).cell for n in PRESETS}, **UNUSUAL}
    sources, refused = {}, {}
    for name, cell in cells.items():
        plan = training_plan(cell)
        sizes = {"I": H, "H": H, "P": H}
        for forward in (True, False):
            stages = stages_of(plan, forward)
            key = (name, forward)
            why = persistent.refusal(plan, stages, sizes, B, 132, forward)
            if why is None:
                sources[key] = persistent.render(plan, persistent.make_plan(plan, stages, sizes, B, 132, forward))
            else:
                refused[key] = why
    wanted = {"lstm", "gru", "gru_cho", "lstm_proj", "lstm_fgr", "peephole_lstm"}
    assert {(n, f) for n in wanted for f in (True, False)} <= set(sources), refused
    _nvcc({f"{n}-{f}": s for (n, f), s in sources.items()}, tmp_path)


def test_auto_takes_a_launch_where_a_step_has_two_stages_and_a_block_reads_little_x():
    """PERSISTENT = "auto": a launch only for a step of at least AUTO_MIN_STAGES GEMM stages (a barrier replaces a
    launch between them) where a block reads at most AUTO_MAX_X_BYTES of X from L2 a step (the rows GEMM reads it once
    every CG columns): GRU-Cho's, MGU's and lstm_proj's wavefront launches at `blogB` (44 blocks a layer) and `lat`,
    not the LSTM's (one stage) nor at `mid` (33 blocks of 64 columns, K = 512) nor lstm_fgr's at `blogB` (24 columns,
    K = 1024; one stage as well)."""
    def x_kib(name, B, H, I, blocks, forward):
        lay = layout(name, B=B, H=H, I=I, blocks=blocks, forward=forward)[3]
        return persistent.x_bytes(lay) // 1024, persistent.worthwhile(lay)
    assert x_kib("lstm", 64, 256, 64, 44, True) == (192, False)          # 3 passes of 64 x 256 floats; one stage
    assert x_kib("lstm", 64, 256, 64, 44, False) == (256, False)         # 1 pass of 64 x 1024
    assert x_kib("lstm", 1, 512, 512, 66, True) == (2, False)            # the GEMV reads X once
    assert x_kib("gru_cho", 64, 256, 64, 44, True) == (128, True)        # two stages
    assert x_kib("lstm_proj", 64, 256, 64, 44, False) == (256, True)
    assert x_kib("mgu", 1, 512, 512, 66, False) == (2, True)
    assert x_kib("gru_cho", 64, 512, 512, 33, True)[1] is False          # `mid`: X re-read every CG columns
    assert x_kib("lstm", 64, 512, 512, 33, True) == (1024, False)
    assert x_kib("lstm_fgr", 64, 256, 64, 44, True) == (768, False)


def test_the_layer_norm_presets_are_refused_by_name():
    """ln_lstm and ln_gru train on the fused launches: their reductions' GEMMs (engine/dense.py) read values no kernel
    of the step fuses with. tests/gpu/test_persistent_training_gpu.py holds them to the reference that way."""
    for name in ("ln_lstm", "ln_gru"):
        plan = training_plan(engine.preset(name).cell)
        for forward in (True, False):
            why = persistent.refusal(plan, stages_of(plan, forward), {"I": 8, "H": 12, "P": 12}, 1, 132, forward)
            assert why is not None and "does not fuse with a kernel" in why, (name, forward, why)


def test_a_cell_of_heads_gets_a_launch_whose_blocks_own_whole_heads():
    """The sLSTM's R_* are block-diagonal by 4 heads (engine/dense.py marks them `diagonal`): a block owns a head's
    H / 4 units and a few batch rows, every weight row of its head but only the head's columns (one run of H / 4
    forward, four backward: dy holds the gates' adjoints side by side), and no block reads another's values."""
    plan = training_plan(engine.preset("slstm").cell, precision="bfloat16")
    sizes = {"I": 512, "H": 512, "P": 512}
    for forward, runs in ((True, 1), (False, 4)):
        stages = stages_of(plan, forward)
        per_step, _ = persistent.step_items(plan, stages, forward)
        assert persistent.head_local(plan, per_step, sizes) == 4
        lay = persistent.make_plan(plan, stages, sizes, 16, 132, forward)
        assert (lay.heads, lay.rows, lay.grid, lay.mode) == (4, 1, 64, "bfloat16")
        it = next(it for it in lay.items if it.stage is not None)
        assert it.units == 128 and it.k // 512 == runs
        # the head's rows, bf16, rows of rnn_wstride<RNN_BF16>(128) = 136: 128 x 4 members forward, 128 backward
        assert lay.dots * 4 == 512 * 136 * 2
        assert lay.shared_bytes <= persistent.MAX_SHARED_BYTES
        source = persistent.render(plan, lay)
        assert "grid.sync" not in source and "cooperative_groups" not in source
        assert f"rnn_head_mma<RNN_BF16, 128, {runs}>" in source and "rnn_head_gemm<" not in source    # tensor cores
        assert "rnn_load_head_rows<RNN_BF16>" in source
    # a head too large for one SM's shared memory takes a cluster of blocks: at H = 768 a head's 192 units are 288 KiB
    # of bf16 rows, so 2 blocks of 96 units (150 KiB each), meeting at cluster barriers
    for forward in (True, False):
        lay = persistent.make_plan(plan, stages_of(plan, forward), {"I": 768, "H": 768, "P": 768}, 16, 132, forward)
        assert (lay.heads, lay.split, lay.rows, lay.grid, lay.items[0].units) == (4, 2, 1, 128, 96)
        source = persistent.render(plan, lay)
        assert "__cluster_dims__(2, 1, 1)" in source and "cooperative_groups::this_cluster().sync();" in source
        assert "grid.sync" not in source and "rnn_head_mma<RNN_BF16, 192, " in source
    fp32 = training_plan(engine.preset("slstm").cell)
    lay = persistent.make_plan(fp32, stages_of(fp32, True), {"I": 768, "H": 768, "P": 768}, 16, 132, True)
    assert (lay.split, lay.rows, lay.grid) == (4, 2, 128)          # fp32 rows twice the bytes: 4 blocks a head
    assert persistent.make_plan(fp32, stages_of(fp32, True), {"I": 64, "H": 256, "P": 256}, 16, 132, True).split == 1
    # past 8 blocks a head (the portable cluster): refused by name
    why = persistent.refusal(plan, stages_of(plan, True), {"I": 64, "H": 4096, "P": 4096}, 16, 132, True)
    assert "1/8 of a head needs" in why and "shared memory" in why


def test_the_16_bit_modes_multiply_a_head_on_tensor_cores_and_fp32_and_tf32_on_ffma():
    """rnn_head_mma (mma.sync m16n8k16) where the mode is fp16 or bf16 and a head's columns are whole k steps of 16;
    rnn_head_gemm (FFMA, operands rounded) otherwise: strict fp32 never on tensor cores."""
    for mode, H, product in (("bfloat16", 256, "rnn_head_mma<RNN_BF16, 64, 1>"),
                             ("float16", 256, "rnn_head_mma<RNN_FP16, 64, 1>"),
                             ("bfloat16", 48, "rnn_head_gemm<RNN_BF16, RB, 64, 12, 1>"),      # 12 columns a head
                             ("tf32", 256, "rnn_head_gemm<RNN_TF32, RB, 64, 64, 1>"),
                             ("float32", 256, "rnn_head_gemm<RNN_FP32, RB, 64, 64, 1>")):
        plan = training_plan(engine.preset("slstm").cell, precision=mode)
        lay = persistent.make_plan(plan, stages_of(plan, True), {"I": 16, "H": H, "P": H}, 16, 132, True)
        source = persistent.render(plan, lay)
        assert product in source, (mode, H)
        assert ("kernels/mma_gemm.cuh" in source) == ("rnn_head_mma" in product), (mode, H)


def test_what_keeps_a_cell_from_owning_whole_heads():
    lstm = training_plan(engine.preset("lstm").cell)
    per_step, _ = persistent.step_items(lstm, stages_of(lstm, True), True)
    assert "not block-diagonal" in persistent.head_local(lstm, per_step, {"I": 64, "H": 64, "P": 64})
    slstm = training_plan(engine.preset("slstm").cell)
    per_step, _ = persistent.step_items(slstm, stages_of(slstm, True), True)
    assert "multiple of 4 units" in persistent.head_local(slstm, per_step, {"I": 12, "H": 12, "P": 12})
    # a reduced mode takes no other persistent launch: its GEMMs would multiply in fp32 under the mode's name
    bf16 = training_plan(engine.preset("lstm").cell, precision="bfloat16")
    why = persistent.refusal(bf16, stages_of(bf16, True), {"I": 64, "H": 64, "P": 64}, 16, 132, True)
    assert "strict fp32" in why and "bfloat16" in why


def test_head_rows_fill_the_sms_without_a_second_wave():
    assert persistent.head_rows(16, 4, 132) == 1          # 64 blocks
    assert persistent.head_rows(64, 4, 132) == 2          # 256 blocks of one row would be two waves: 128 of two
    assert persistent.head_rows(64, 4, 66) == 4           # a layer's share in the wavefront
    assert persistent.head_rows(200, 4, 132) == 4         # more than one wave even so
    assert persistent.head_rows(7, 4, 1) == 1             # only 1 divides 7


def test_persistent_on_refuses_a_reduced_mode_it_cannot_run_by_name():
    """PERSISTENT = True with a bf16 plan whose weights are not by heads: a BackendError naming the mode, not a launch
    that multiplies fp32 under bf16's name."""
    from types import SimpleNamespace

    from engine.autodiff.stage_fusion import fused_stages
    from engine.errors import BackendError
    plan = training_plan(engine.preset("lstm").cell, precision="bfloat16")
    runner = SimpleNamespace(plan=plan, stages=fused_stages(plan), sms=132)
    old = persistent.PERSISTENT
    try:
        persistent.PERSISTENT = True
        with pytest.raises(BackendError, match="precision='bfloat16'.*strict fp32"):
            persistent.persistent_launch(runner, {"I": 64, "H": 64, "P": 64}, 16, 132, True)
        persistent.PERSISTENT = "auto"
        assert persistent.persistent_launch(runner, {"I": 64, "H": 64, "P": 64}, 16, 132, True) is None
    finally:
        persistent.PERSISTENT = old


@pytest.mark.nvcc
def test_head_local_launches_compile_with_nvcc_in_every_mode(tmp_path):
    """Both directions of the sLSTM's head-local launch in each training mode, at 1, 2 and 4 rows a block."""
    sources = {}
    plan = training_plan(engine.preset("slstm").cell, precision="bfloat16")
    for forward in (True, False):       # a head in a cluster of 2 (H = 768)
        lay = persistent.make_plan(plan, stages_of(plan, forward), {"I": 768, "H": 768, "P": 768}, 16, 132, forward)
        sources[("split", forward)] = persistent.render(plan, lay).replace(lay.name, f"{lay.name}_split")
    for mode in ("float32", "tf32", "float16", "bfloat16"):
        plan = training_plan(engine.preset("slstm").cell, precision=mode)
        for B, blocks in ((16, 132), (64, 132), (64, 66)):
            for forward in (True, False):
                lay = persistent.make_plan(plan, stages_of(plan, forward), {"I": 64, "H": 256, "P": 256}, B, blocks,
                                           forward)
                assert lay.heads == 4
                sources[(mode, B, blocks, forward)] = persistent.render(plan, lay).replace(
                    lay.name, f"{lay.name}_{mode}_{B}_{blocks}")
    # one module: the helpers once (each source brings them: keep the first's, the kernels of the rest)
    first, *rest = sources.values()
    kernels = [s[s.index('extern "C"'):] for s in rest]
    _nvcc({"all": "\n".join([first, *kernels])}, tmp_path)
