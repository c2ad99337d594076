"""Heads in the tiling (engine/schedules/heads.py gemm_heads): where every block's hidden units lie in one head, the
persistent schedule's GEMM of a heads weight reads only that head's K / k columns of h and keeps only those columns
of its weight rows in shared memory (the dense form's other columns are zeros). Which GEMMs and tilings take it,
what the generated source reads, that nvcc compiles it, and that the dense form's `diagonal` mark cannot come from
a file. The numbers against the reference: tests/gpu/test_heads_gpu.py."""
from __future__ import annotations

import shutil

import pytest
from nvcc_check import compile_sources
from test_schedules_cpu import render

import engine
from engine.compiler import make_plan
from engine.dense import dense_form, wavefront_network
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.errors import CellGraphError, CompileError
from engine.schedules.heads import gemm_heads
from engine.schedules.tiling import H100, TileConfig, make_tiling


@cell
def mixed(x, h):
    """One head-structured and one dense weight on the same operand: one GEMM, which multiplies the zeros."""
    i = sigmoid(W("W_i") @ x + W("R_i", heads=2) @ h + b("b_i"))
    g = tanh(W("W_g") @ x + W("R_g") @ h + b("b_g"))
    return {"h": i * g}


def program_of(c, hidden=256, batch=16, precision="bfloat16", layers=1):
    network = wavefront_network(engine.Network(c, input_size=64, hidden_size=hidden, num_layers=layers))
    return network, make_plan(network, 9, batch, layout="interleaved", precision=precision).program


def recurrent(program):
    return next(g for g in program.gemms if not g.hoisted and g.name not in program.reductions)


def test_which_gemms_read_one_head():
    _, program = program_of(engine.preset("slstm").cell)
    assert gemm_heads(program, recurrent(program)) == 4
    assert all(gemm_heads(program, g) == 1 for g in program.gemms if g.hoisted)       # W x: dense weights
    _, program = program_of(engine.preset("lstm").cell)
    assert gemm_heads(program, recurrent(program)) == 1
    _, program = program_of(mixed)
    assert gemm_heads(program, recurrent(program)) == 1


@pytest.mark.parametrize("hidden,batch,precision,heads,k", [
    (512, 16, "bfloat16", 4, 128),        # the bulk tensor-core pipeline, weights resident
    (768, 16, "bfloat16", 4, 192),        # 6 units a block, 32 blocks a head; chunks of 64 columns
    (256, 3, "float32", 4, 64),           # the warp GEMV
    (256, 16, "float32", 1, 256),         # the fp32 register tiles stage X with its row stride K: dense
])
def test_tilings_that_take_heads(hidden, batch, precision, heads, k):
    network, program = program_of(engine.preset("slstm").cell, hidden, batch, precision)
    tiling = make_tiling(program, network, batch, TileConfig(), H100)
    tile = next(t for t in tiling.gemms if t.name == recurrent(program).name)
    assert (tile.heads, tile.k_max) == (heads, k)
    dense = make_tiling(program, network, batch, TileConfig(), H100, heads=False)
    assert next(t for t in dense.gemms if t.name == tile.name).heads == 1
    if heads > 1:
        assert f"reads one head's {k} of {hidden} columns" in tiling.describe()
        assert tiling.k_chunk == (k if not tiling.bulk else 192 if k == 192 else 128)   # a head: one chunk
        assert tile.resident_floats < next(t for t in dense.gemms if t.name == tile.name).resident_floats


def test_no_heads_where_a_block_straddles_two_or_on_the_graph_schedule():
    network, program = program_of(engine.preset("slstm").cell, 256, 3, "float32")
    straddles = make_tiling(program, network, 3, TileConfig(units_per_block=3), H100)     # 64 units a head
    assert all(t.heads == 1 for t in straddles.gemms)
    graph = make_tiling(program, network, 3, TileConfig(), H100, persistent=False)
    assert all(t.heads == 1 for t in graph.gemms)


def test_the_source_reads_the_blocks_head():
    _, source, tiling = render("slstm", 64, 256, 2, 16, TileConfig(), True, "bfloat16")
    assert any(t.heads == 4 for t in tiling.gemms)
    assert "(u0 / (H / 4)) * (K_h_gemm / 4) * B" in source          # X: the head's chunks of the 16-bit copy
    assert "(long)(u0 / (H / 4)) * (K / 4), K, K / 4," in source     # resident rows: the head's columns only
    _, source, _ = render("slstm", 64, 256, 1, 3, TileConfig(), True, "float32")
    assert "(long)(u0 / (H / 4)) * (K_h_gemm / 4), K_h_gemm, (K_h_gemm / 4)," in source    # GEMV: ldx, then K


def test_head_sync_counts_each_heads_blocks():
    """TileConfig(sync="head"): a counter per (layer, head); a block waits for its own head's blocks, and for every
    head of the layer below before its first stage."""
    _, source, tiling = render("slstm", 64, 256, 2, 16, TileConfig(sync="head"), True, "bfloat16")
    assert (tiling.sync_heads, tiling.blocks_per_head) == (4, tiling.blocks_per_layer // 4)
    assert "constexpr int HEADS = 4, BLOCKS_PER_HEAD = BLOCKS_PER_LAYER / HEADS;" in source
    assert "unsigned* const own = arrivals + layer * HEADS + (blockIdx.x % BLOCKS_PER_LAYER) / BLOCKS_PER_HEAD;" in source
    assert "rnn_wait_for(own, BLOCKS_PER_HEAD * ((unsigned)t * S + 0u));" in source
    assert "rnn_wait_for(arrivals + (layer - 1) * HEADS + hd, BLOCKS_PER_HEAD * ((unsigned)t + 1u) * S);" in source
    assert "grid.sync()" not in source and "heads synchronised by per-head arrival counters" in tiling.describe()
    _, layer_source, layer = render("slstm", 64, 256, 2, 16, TileConfig(sync="layer"), True, "bfloat16")
    assert layer.sync_heads == 1 and "constexpr int HEADS = 1," in layer_source      # one counter a layer, as before


@pytest.mark.parametrize("name,hidden,batch,precision,config,why", [
    ("lstm", 256, 16, "bfloat16", TileConfig(sync="head"), "read all of h"),
    ("ln_lstm", 256, 16, "bfloat16", TileConfig(sync="head"), "reduction"),
    ("slstm", 256, 16, "float32", TileConfig(sync="head"), "read all of h"),      # fp32 register tiles: dense
    ("slstm", 256, 3, "float32", TileConfig(units_per_block=3, sync="head"), "read all of h"),   # straddles heads
])
def test_head_sync_is_refused_where_a_step_reads_other_heads(name, hidden, batch, precision, config, why):
    with pytest.raises(CompileError, match="sync='head'") as info:
        render(name, 64, hidden, 1, batch, config, True, precision)
    assert why in str(info.value) and "hint" in str(info.value)
    with pytest.raises(CompileError, match="persistent schedule only"):
        render("slstm", 64, 256, 1, 16, TileConfig(sync="head"), False, "bfloat16")


def test_the_autotuner_times_head_sync_where_it_applies():
    from engine.schedules.autotune import candidates
    syncs = [c.config.sync for c in candidates(engine.Network(engine.preset("slstm").cell, 64, 256, 1), 16, H100,
                                               "bfloat16") if c.schedule == "persistent"]
    assert syncs.count("head") == 1
    syncs = [c.config.sync for c in candidates(engine.Network(engine.preset("lstm").cell, 64, 256, 1), 16, H100,
                                               "bfloat16") if c.schedule == "persistent"]
    assert "head" not in syncs


@pytest.mark.nvcc
def test_heads_sources_compile_with_nvcc(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    sources = {}
    for label, args in {"bulk": (64, 256, 2, 16, TileConfig(), True, "bfloat16"),
                        "bulk_192": (64, 768, 1, 16, TileConfig(), True, "bfloat16"),      # K chunks of 192
                        "gemv": (64, 256, 1, 3, TileConfig(), True, "float32"),
                        "gemv_bf16": (64, 256, 2, 3, TileConfig(), True, "bfloat16"),
                        "head_sync": (64, 256, 2, 16, TileConfig(sync="head"), True, "bfloat16"),
                        "head_sync_gemv": (64, 256, 1, 3, TileConfig(sync="head"), True, "float32")}.items():
        _, source, tiling = render("slstm", *args)
        assert any(t.heads == 4 for t in tiling.gemms), label
        sources[label] = source
    compile_sources(sources, tmp_path)


def test_the_diagonal_mark_is_the_engines_own():
    data = engine.to_dict(engine.preset("lstm").cell)
    weight = next(n for n in data["nodes"] if n["op"] == "weight")
    weight.setdefault("attrs", {})["diagonal"] = 4
    with pytest.raises(CellGraphError, match="diagonal") as info:
        engine.from_dict(data)
    assert weight["name"] in str(info.value)
    dense = dense_form(engine.preset("slstm").cell).cell
    marked = [n.name for n in dense.nodes if n.op == "weight" and n.attr("diagonal", 1) == 4]
    assert sorted(marked) == ["R_f", "R_i", "R_o", "R_z"]            # the dense form marks its heads weights
    for value in (0, 2.5, True):
        bad = [n if n.name != "R_i" else type(n)(n.name, n.op, n.args, tuple(sorted({**n.attr_dict,
                                                                                       "diagonal": value}.items())))
               for n in dense.nodes]
        with pytest.raises(CellGraphError, match="attrs.diagonal"):
            type(dense)(dense.name, tuple(bad), dense.states, dense.output, dense.doc, dense.input_is_hidden)
