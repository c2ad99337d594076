"""The persistent schedule's cluster mode without a GPU (TileConfig(sync="cluster"), engine/schedules/cluster.py):
which cells and sizes take it, the tiling (blocks a cluster, the local copies of X), what the source does (no grid
barrier, stores into every block of the cluster, the GEMMs reading shared memory), refusals that name the reason,
the autotuner's candidates, and nvcc compiles. The numbers against the reference: tests/gpu/test_cluster_gpu.py."""
from __future__ import annotations

import shutil

import pytest
from nvcc_check import compile_sources
from test_schedules_cpu import render

import engine
from engine.codegen.cluster import exchange
from engine.errors import CompileError
from engine.schedules import cluster
from engine.schedules.autotune import candidates
from engine.schedules.report import staging_text
from engine.schedules.tiling import H100, TileConfig


@pytest.mark.parametrize("hidden,units,blocks,per_cluster", [(256, None, 32, 8), (256, 4, 64, 16), (768, None, 32, 8),
                                                             (768, 12, 64, 16)])
def test_a_cluster_is_a_head(hidden, units, blocks, per_cluster):
    _, source, tiling = render("slstm", 64, hidden, 1, 16, TileConfig(units_per_block=units, sync="cluster",
                                                                      wgmma=False), True, "bfloat16")
    assert (tiling.blocks, tiling.cluster) == (blocks, per_cluster)
    assert tiling.bulk is False and all(t.resident and t.heads == 4 for t in tiling.gemms)
    (x,) = tiling.local_x
    assert (x.buffer, x.versions, x.cols) == (tiling.gemms[0].name + "_in", 2, hidden // 4)
    assert x.stride == hidden // 4 + 8 and x.floats == 16 * x.stride * 2 // 4
    assert f"clusters of {per_cluster} blocks (a head each)" in tiling.describe()
    assert "grid.sync()" not in source and "cooperative_groups::this_grid" not in source
    assert "__cluster_dims__(CLUSTER, 1, 1)" in source and f"constexpr int CLUSTER = {per_cluster};" in source
    assert "rnn_mma_gemms_local<RNN_BF16, WM, WN>(jobs, B, smem + SCRATCH + X_LOCAL);" in source
    assert source.count("rnn_cluster_sync();") == 1                  # after the local copies' load
    assert source.count("rnn_cluster_arrive();") == source.count("rnn_cluster_wait();") == 1     # a stage: its halves
    stage_end = source.split("rnn_cluster_arrive();")[1].split("(void)I;")[0]
    assert "h_seq[row * H + j] = h_next;" in stage_end and "c_state_next[" in stage_end   # global stores after it
    stage = source.split("_persistent(")[0].split("// Stage 1")[-1]
    assert "_h16[" not in stage                                      # the cell code writes no global 16-bit copy
    width = {8: "uint4", 4: "uint2", 2: "unsigned", 1: "unsigned short"}[next(w for w in (8, 4, 2, 1)
                                                                              if tiling.units_per_block % w == 0)]
    assert f"rnn_cluster_share<CLUSTER, {width}>(" in stage       # its slice into the others, as wide as it aligns


def test_the_default_takes_16_blocks_where_8_do_not_fit():
    _, _, tiling = render("lstm", 512, 512, 1, 16, TileConfig(sync="cluster"), True, "bfloat16")
    assert (tiling.cluster, tiling.units_per_block) == (16, 32) and tiling.smem_bytes <= H100.smem_per_block
    with pytest.raises(CompileError, match="keeps every step weight in shared memory"):
        render("lstm", 512, 512, 1, 16, TileConfig(64, sync="cluster"), True, "bfloat16")


def test_without_heads_a_cluster_is_the_layer():
    _, source, tiling = render("lstm", 64, 256, 3, 16, TileConfig(sync="cluster"), True, "bfloat16")
    assert (tiling.blocks_per_layer, tiling.cluster, tiling.num_layers, tiling.launches) == (8, 8, 1, 3)
    assert "a layer each" in tiling.describe()
    _, source, tiling = render("gru_cho", 64, 256, 1, 40, TileConfig(units_per_block=16, sync="cluster"), True,
                               "float16")
    assert tiling.cluster == 16 and source.count("rnn_cluster_wait();") == 2     # two stages a step
    assert {x.versions for x in tiling.local_x} >= {1}


@pytest.mark.parametrize("name,hidden,batch,precision,config,why", [
    ("ln_lstm", 256, 16, "bfloat16", TileConfig(sync="cluster"), "reduction"),
    ("slstm", 256, 16, "float32", TileConfig(sync="cluster"), "tensor cores"),
    ("slstm", 256, 3, "bfloat16", TileConfig(sync="cluster"), "tensor cores"),         # B <= 4: the warp GEMV
    ("lstm", 512, 16, "bfloat16", TileConfig(units_per_block=16, sync="cluster"), "exceed a cluster's 16"),
    ("slstm", 256, 16, "bfloat16", TileConfig(units_per_block=5, sync="cluster"), "do not divide"),
    ("lstm", 256, 16, "bfloat16", TileConfig(layers_per_launch=2, sync="cluster"), "one layer a launch"),
])
def test_refusals_name_the_reason(name, hidden, batch, precision, config, why):
    with pytest.raises(CompileError, match="sync='cluster'") as info:
        render(name, 64, hidden, 2, batch, config, True, precision)
    assert why in str(info.value) and "hint" in str(info.value)
    with pytest.raises(CompileError, match="persistent schedule only"):
        render("slstm", 64, 256, 1, 16, TileConfig(sync="cluster"), False, "bfloat16")


def test_cluster_units():
    assert cluster.cluster_units(768, 4, None) == (24, None)
    assert cluster.cluster_units(256, 1, None) == (32, None)
    assert cluster.cluster_units(96, 4, None) == (3, None)                  # 24 units a head over 8 blocks
    assert cluster.cluster_units(256, 1, 8)[1].startswith("32 blocks a layer exceed")


def test_the_autotuner_times_clusters_of_8_and_16():
    configs = [c.config for c in candidates(engine.Network(engine.preset("slstm").cell, 64, 768, 1), 16, H100,
                                            "bfloat16") if c.schedule == "persistent" and c.config.sync == "cluster"]
    assert [c.units_per_block for c in configs] == [None, 12]
    assert not [c for c in candidates(engine.Network(engine.preset("lstm").cell, 64, 1024, 1), 16, H100, "bfloat16")
                if c.config is not None and c.config.sync == "cluster"]           # 1024 units: 64 a block at 16


def test_the_wgmma_path_holds_the_weights_in_registers():
    """On sm_90 with 16-bit operands the step GEMMs run on wgmma from registers (kernels/wgmma_gemm.cuh): the LSTM at
    H = 512 in 16 blocks of 32 units has 128 weight rows a block, 2 tiles of 64, K = 512 in 2 parts over 4
    warpgroups (64 registers of weights a thread); h's local copies in wgmma's B layout, each block writing its own
    units and, h being a double buffer, pushing them into the others' by 16-byte st.async (no cluster barrier a
    step): the GEMM waits on the block's barrier of the version it reads."""
    _, source, tiling = render("lstm", 512, 512, 1, 16, TileConfig(sync="cluster"), True, "bfloat16")
    assert tiling.wgmma == (2, 2, 16) and tiling.config.threads == 512
    assert "wgmma (bfloat16) with the weights in registers: 2 tiles of 64 weight rows, K in 2 parts" in tiling.describe()
    (x,) = tiling.local_x
    assert x.swizzled and x.stride == 512 and x.floats == 16 * 512 // 2
    assert tiling.x_local_floats >= 2 * x.floats + 256                 # room to start on a 1024-byte boundary
    assert "constexpr int NB = 16, TILES = 2, PARTS = 2, KSP = 16;" in source
    assert "rnn_wgmma_gemms_rs<RNN_BF16, NB, KSP, PARTS, TILES>(jobs, wreg, 0, B, smem + SCRATCH + X_LOCAL);" in source
    assert "rnn_mma_gemms_local" not in source.split("// ---- end of kernels/wgmma_gemm.cuh ----")[1]
    assert "rnn_wgmma_rs_load<KSP>(wreg," in source and "unsigned wreg[KSP][4];" in source
    assert "lstm_stage_1(L, layer, t, u0, tu, smem, wreg, T);" in source
    assert "[rnn_swz_index<NB>((int)b, j - (u0 / GROUP) * GROUP)] = rnn_bits16<RNN_BF16>(h_next);" in source
    assert exchange(tiling) == "push" and "pushing its units into the others' with st.async" in tiling.describe()
    stage = source.split("void lstm_stage_1(")[1].split("\n}\n")[0]
    receive, gemm = stage.index("rnn_cluster_receive("), stage.index("rnn_wgmma_gemms_rs<")
    push = stage.index("rnn_cluster_push_swz<CLUSTER, NB, uint4>(")
    assert receive < gemm < stage.index("rnn_bits16<RNN_BF16>(h_next)") < push    # wait, multiply, h, send
    assert "((t + 1) & 1) * 4096), (unsigned)__cvta_generic_to_shared(rnn_xchg_bar + 0 + ((t + 1) & 1))" in stage
    assert "if (t + 1 < T)" in stage and "(t & 1)), ((t - 1) >> 1) & 1);" in stage
    assert "rnn_cluster_share" not in stage and "rnn_cluster_arrive" not in stage and "rnn_cluster_pull" not in stage
    assert "st.async onto transaction barriers, no cluster barrier a step" in source
    loop = source.split("for (int t = 0; t < T; ++t)")[1]
    assert "rnn_cluster_wait" not in loop and "rnn_bar_expect(" in loop          # re-armed, never a cluster barrier
    assert source.index("rnn_cluster_receive_init(") < source.index("rnn_cluster_sync();   // every block's copies")
    # a cell of two stages: each stage's GEMM is its own tiles (GRU-Cho at 16 units a block: 32 + 16 columns)
    _, source, tiling = render("gru_cho", 64, 256, 1, 40, TileConfig(units_per_block=16, sync="cluster"), True,
                               "float16")
    assert tiling.wgmma[0] == 0                                       # 40 rows pad to 48: not one of wgmma's N here
    _, source, tiling = render("gru_cho", 64, 256, 1, 32, TileConfig(units_per_block=16, sync="cluster"), True,
                               "float16")
    assert tiling.wgmma[:2] == (2, tiling.config.threads // 256)
    assert source.count("rnn_wgmma_gemms_rs<RNN_FP16, NB, KSP, PARTS, TILES>(jobs, wreg, ") == 2
    assert "(jobs, wreg, 0, B," in source and "(jobs, wreg, 1, B," in source
    # r * h is written and read within a step (one version): pulled after a cluster barrier a stage instead
    assert exchange(tiling) == "pull" and "then each block pulls the others' units" in tiling.describe()
    assert source.count("rnn_cluster_pull_swz<") == 2 and "rnn_cluster_push_swz<CLUSTER" not in source
    assert "meet at a cluster barrier after every stage" in source           # the kernel's header says which
    assert "after the cluster barrier the block reads the other" in staging_text(tiling)
    assert source.count("rnn_cluster_wait();") == 2


@pytest.mark.parametrize("kwargs,why", [
    (dict(batch=40), "48 batch rows (padded) are not one of wgmma's N"),
    (dict(limits="sm_100"), "wgmma is Hopper's (sm_90), and this is sm_100"),
])
def test_the_wgmma_path_falls_back_or_says_why(kwargs, why):
    from dataclasses import replace

    from engine.compiler import make_plan
    from engine.schedules.tiling import make_tiling
    network = engine.Network(engine.preset("lstm").cell, 64, 256, 1)
    limits = replace(H100, arch=kwargs.get("limits", "sm_90"))
    batch = kwargs.get("batch", 16)
    program = make_plan(network, 17, batch, layout="interleaved", precision="bfloat16").program
    tiling = make_tiling(program, network, batch, TileConfig(sync="cluster"), limits)
    assert tiling.wgmma == (0, 0, 0) and not any(x.swizzled for x in tiling.local_x)    # the mma.sync path
    with pytest.raises(CompileError, match="TileConfig.wgmma=True cannot run") as info:
        make_tiling(program, network, batch, TileConfig(sync="cluster", wgmma=True), limits)
    assert why in str(info.value) and "hint" in str(info.value)


@pytest.mark.parametrize("config", [TileConfig(wgmma=True), TileConfig(sync="grid", wgmma=False),
                                    TileConfig(sync="cluster", wgmma="yes")])
def test_the_wgmma_flag_outside_cluster_mode_is_refused_by_name(config):
    with pytest.raises(CompileError, match=r"TileConfig.wgmma=.* applies to sync='cluster' only.*hint"):
        render("lstm", 64, 256, 1, 16, config, True, "bfloat16")


@pytest.mark.nvcc
def test_ptxas_keeps_the_wgmma_pipelined(tmp_path):
    """wgmma issued in a divergent path is serialized by ptxas (advisory C7520: each MMA waits for the one before),
    which cost the cluster LSTM ~1 us a step; rnn_wgmma_gemms_rs issues its MMAs outside any branch. Compiled as
    NVRTC builds it (optimized), one- and two-stage cells."""
    import subprocess
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    for label, args in {"lstm": ("lstm", 64, 512, 1, 16, TileConfig(sync="cluster"), True, "bfloat16"),
                        "gru_cho": ("gru_cho", 64, 256, 1, 32, TileConfig(units_per_block=16, sync="cluster"), True,
                                    "float16")}.items():
        _, source, tiling = render(*args)
        assert tiling.wgmma[0] > 0
        path = tmp_path / f"{label}.cu"
        path.write_text(source)
        done = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-o", str(tmp_path / f"{label}.cubin"), "-Xptxas",
                               "-v", str(path)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "C7520" not in done.stderr and "serialized" not in done.stderr, done.stderr[-3000:]
        assert " 0 bytes spill stores" in done.stderr


@pytest.mark.nvcc
def test_cluster_sources_compile_with_nvcc(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    sources = {}
    for label, args in {"slstm": (64, 768, 1, 16, TileConfig(sync="cluster"), True, "bfloat16"),
                        "slstm_mma": (64, 768, 1, 16, TileConfig(sync="cluster", wgmma=False), True, "bfloat16"),
                        "lstm": (64, 512, 1, 16, TileConfig(sync="cluster"), True, "bfloat16"),
                        "lstm16": (64, 256, 2, 16, TileConfig(units_per_block=16, sync="cluster"), True, "bfloat16"),
                        "gru_cho": (64, 256, 1, 40, TileConfig(units_per_block=16, sync="cluster"), True, "float16")
                        }.items():
        _, source, _ = render(label.split("_mma")[0].rstrip("16"), *args)
        sources[label] = source
    compile_sources(sources, tmp_path)


def test_explain_describes_the_autotuners_cluster_choice(monkeypatch, tmp_path):
    """Where the autotuner chose clusters, explain (and the Schedule page, which draws it) says how the blocks
    synchronise and where h lives."""
    from engine import backends
    from engine.explain import explain_json
    from engine.schedules.autotune import Choice, cache_key, write_entry

    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no CUDA device (test)"))
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path / "cache"))
    network = engine.Network(engine.preset("slstm").cell, 64, 256, 1)
    key = cache_key(network, 9, 16, "Test GPU", "bfloat16")
    write_entry(key, Choice("persistent", TileConfig(sync="cluster"), "fastest (test)", key, []))
    entry = explain_json(network, steps=9, batch=16, precision="bfloat16")["schedules"]["persistent"]
    assert entry["tiling_from"] == "the autotuner's choice"
    assert "clusters of 8 blocks (a head each)" in entry["tiling"]["describe"]
    # on sm_90 (the nominal H100 explain uses without a GPU) the wgmma path, weights in registers; every copy of the
    # sLSTM's h is a double buffer, so its blocks push h onto transaction barriers (engine/codegen/cluster.exchange)
    assert entry["sync"].startswith("transaction barriers, no cluster barrier a step: the 8 blocks of a head")
    assert "thread-block clusters (one a head)" in entry["how"] and "no cluster barrier a step" in entry["how"]
    assert entry["tiling"]["staging"].startswith("no staging: every block keeps its cluster's 16-bit h")
    assert "weight rows in registers" in entry["tiling"]["staging"]
    assert "into the other 7 blocks' copies with st.async" in entry["tiling"]["staging"]
    assert "st.async" in entry["tiling"]["describe"]
    assert "cluster barrier" not in entry["tiling"]["staging"]


@pytest.mark.parametrize("name", ["mingru", "indrnn"])
def test_a_cell_with_no_recurrent_matmul_is_not_run_in_clusters(name):
    """No matmul reads a state: nothing to hold in the cluster, and the kernel's shared layout had no room for its
    exchange (compute-sanitizer caught minGRU's bf16 cluster kernel writing past it). Refused by name, and the
    autotuner leaves the mode out."""
    with pytest.raises(CompileError, match="no matmul reads a state"):
        render(name, 128, 128, 1, 8, TileConfig(sync="cluster"), True, "bfloat16")
    network = engine.Network(engine.preset(name).cell, 128, 128, 1)
    assert all(c.config is None or c.config.sync != "cluster" for c in candidates(network, 8, H100, "bfloat16"))
