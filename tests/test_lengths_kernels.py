"""Variable-length batches (issue #35, item 1) on the generated kernels, without a GPU: the forward Program whose
stores hold the rows past their end (engine/passes/lengths.py) run by the plan interpreter, and the training plan
that does the same both ways (engine/autodiff/fused_lengths.py) run by NumPy, against the float64 reference with
lengths, for every preset; structural claims on the CUDA (a select on `within`, never a branch around a barrier, and
nothing changed without lengths); nvcc compiles the sources; the autotuner leaves out what refuses lengths. The GPU
side: tests/gpu/test_lengths_gpu.py."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from multiprocessing.pool import ThreadPool

import numpy as np
import pytest
from gradient_errors import gradient_errors
from hypothesis import HealthCheck, given, settings
from nvcc_check import CHECK_ONLY
from test_autodiff import UNUSUAL
from test_fused_training_plan import _nvcc
from test_fuzz_cells import cell_designs
from test_schedules_cpu import nvcc_command

import engine
from engine.autodiff import bptt, fused_tape
from engine.autodiff.errors import AutodiffError
from engine.autodiff.fused_codegen import render_module as render_training
from engine.autodiff.fused_numpy import NumpyRunner
from engine.autodiff.fused_planner import training_plan
from engine.backends import plan_numpy
from engine.codegen.wavefront import render_wavefront
from engine.compiler import compile_cell, compile_program, make_plan
from engine.dense import wavefront_network
from engine.errors import BackendError, CompileError
from engine.schedules.autotune import cache_key, candidates
from engine.schedules.tiling import H100, TileConfig, make_tiling

PRESETS = sorted(engine.presets())
WAVEFRONT_PRESETS = [n for n in PRESETS if not engine.preset(n).cell.uses_projection]
# Refused by name on the fused training step: their gradients read a state's adjoint (fused_lengths.py)
ADJOINT_READERS = {"every_op", "projection_only", "linear_states"}


def padded(cell, lengths, layers=2, I=3, H=5, P=None, seed=0):
    """A network, its parameters, a padded batch (T = max(lengths)) whose padding is large noise, initial states,
    and the loss's gradients (large past the ends too: they must be ignored)."""
    H = cell.fit_size(H)
    I = H if cell.input_is_hidden else I
    network = engine.Network(cell, I, H, layers, proj_size=P)
    rng = np.random.default_rng(seed)
    T, B = max(lengths), len(lengths)
    x = rng.standard_normal((T, B, I))
    d_out = rng.standard_normal((T, B, network.output_size))
    for b, n in enumerate(lengths):
        x[n:, b] *= 10
        d_out[n:, b] *= 100
    initial = {s: rng.uniform(-0.8, 0.8, (layers, B, network.state_size(s))) for s in cell.state_names}
    d_final = {s: rng.standard_normal((layers, B, network.state_size(s))) for s in cell.state_names}
    return network, engine.init_params(network, seed=seed), x, initial, d_out, d_final


LENGTHS = [6, 1, 4, 6, 2]              # unsorted, the longest and a single step among them


# ---- the forward: engine/passes/lengths.py, run by the plan interpreter ---------------------------------------

@pytest.mark.parametrize("layout", ["blocked", "interleaved"])
@pytest.mark.parametrize("name", PRESETS)
def test_the_held_program_run_by_the_plan_interpreter_equals_the_reference(name, layout):
    cell = engine.preset(name).cell
    network, params, x, initial, _, _ = padded(cell, LENGTHS, P=2 if cell.uses_projection else None, seed=len(name))
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64, lengths=LENGTHS)
    got = plan_numpy.run(network, params, x, initial, layout=layout, lengths=LENGTHS)    # buffers poisoned
    np.testing.assert_allclose(got.outputs, want.outputs, rtol=1e-11, atol=1e-12)
    for b, n in enumerate(LENGTHS):
        assert not got.outputs[n:, b].any()
    for s in cell.state_names:
        np.testing.assert_allclose(got.final_states[s], want.final_states[s], rtol=1e-11, atol=1e-12, err_msg=s)


@pytest.mark.parametrize("name", ["lstm", "gru_cho", "indrnn", "ln_gru", "slstm"])
def test_one_kernel_per_op_holds_the_rows_too(name):
    cell = engine.preset(name).cell
    network, params, x, initial, _, _ = padded(cell, LENGTHS, seed=3)
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64, lengths=LENGTHS)
    got = plan_numpy.run(network, params, x, initial, lengths=LENGTHS,
                         passes={"fuse_elementwise": False, "group_gemms": False})
    np.testing.assert_allclose(got.outputs, want.outputs, rtol=1e-11, atol=1e-12)


def test_the_interpreter_catches_a_store_that_does_not_hold():
    """The comparison can fail: c's store told to write its new value past the end too."""
    import dataclasses
    network, params, x, initial, _, _ = padded(engine.preset("lstm").cell, LENGTHS)
    program = compile_cell(network.cell, lengths=True)
    (kernel,) = program.kernels
    wrong = tuple(dataclasses.replace(s, past_end=None) if s.access.param == "c_state_next" else s
                  for s in kernel.stores)
    from engine.backends.fused import Executor
    from engine.backends.plan_numpy import NumpyDevice
    from engine.plan import bind
    bad = dataclasses.replace(program, kernels=(dataclasses.replace(kernel, stores=wrong),))
    device = NumpyDevice(np.float64)
    outputs, final = Executor(bind(bad, network, 6, 5, None), device).run(params, x, initial, lengths=LENGTHS)
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64, lengths=LENGTHS)
    assert np.abs(final["c"] - want.final_states["c"]).max() > 1e-3


def test_the_lstms_stores_select_the_held_state_and_a_zero_output():
    program = compile_cell(engine.preset("lstm").cell, lengths=True)
    (kernel,) = program.kernels
    held = {s.access.param: s.past_end for s in kernel.stores}
    assert held == {"c_state_next": "c", "h_gemm_in_next": "h_held", "h_seq": "zero"}    # c is read already
    assert {p.name: p.version for p in kernel.params}["h_gemm_in_cur"] == "cur"
    assert program.lengths and program.key != compile_cell(engine.preset("lstm").cell).key


@pytest.mark.parametrize("name", PRESETS)
def test_without_lengths_nothing_changes(name):
    """The pass runs only for lengths: the Program is the one it always was (no past_end, no extra argument), and
    its CUDA (the golden LSTM's: tests/test_codegen.py) and the wavefront source say nothing of lengths."""
    cell = engine.preset(name).cell
    plain = compile_program(cell)
    assert not plain.lengths and compile_cell(cell, lengths=False) is compile_cell(cell)
    assert all(s.past_end is None for k in plain.kernels for s in k.stores)
    assert "within" not in plain.source and "lengths" not in plain.source
    held = compile_program(cell, lengths=True)
    assert [k.name for k in held.kernels] == [k.name for k in plain.kernels]
    assert [g for g in held.gemms] == [g for g in plain.gemms] and held.buffers == plain.buffers


def render(name, lengths, persistent=True, config=None, precision="float32", B=3, H=129, I=37, L=2):
    config = config or TileConfig()
    cell = engine.preset(name).cell
    network = wavefront_network(engine.Network(cell, I, cell.fit_size(H), L))
    program = make_plan(network, 17, B, layout="interleaved", precision=precision, lengths=lengths).program
    tiling = make_tiling(program, network, B, config, H100, persistent=persistent)
    return program, render_wavefront(program, network, tiling)


BARRIERS = ("grid.sync()", "__syncthreads()", "rnn_wait_for(", "rnn_arrive(", "rnn_cluster_arrive()",
            "rnn_cluster_wait()", "rnn_cluster_sync()", "rnn_cluster_share<")
STRUCTURE_CASES = [("lstm", True, TileConfig(), "float32", 3), ("gru", False, TileConfig(), "float32", 19),
                   ("gru_cho", True, TileConfig(sync="layer"), "float32", 19), ("ln_lstm", True, TileConfig(),
                                                                                "float32", 3),
                   ("slstm", True, TileConfig(sync="head"), "bfloat16", 16),
                   ("lstm", True, TileConfig(), "bfloat16", 19),
                   ("lstm", True, TileConfig(units_per_block=16, sync="cluster"), "bfloat16", 16)]


@pytest.mark.parametrize("name,persistent,config,precision,B", STRUCTURE_CASES,
                         ids=[f"{c[0]}-{'persistent' if c[1] else 'graph'}-{c[2].sync or 'grid'}-{c[3]}-B{c[4]}"
                              for c in STRUCTURE_CASES])
def test_the_held_stores_are_selects_and_every_barrier_stays(name, persistent, config, precision, B):
    """Every thread takes part in every barrier: the lengths source has the plain one's barriers, launches and
    loops; a held store is a select on `within` (never an `if` around work), and the 16-bit copies of h the GEMMs
    read (on the tensor-core path, in cluster mode the block's own copy) store the held value too."""
    kwargs = dict(persistent=persistent, config=config, precision=precision, B=B,
                  H=256 if config.sync in ("cluster", "head") else 129, I=64 if precision == "bfloat16" else 37)
    program, source = render(name, True, **kwargs)
    _, plain = render(name, False, **kwargs)
    for barrier in BARRIERS:
        assert source.count(barrier) == plain.count(barrier), barrier
    assert source.count("for (") == plain.count("for (") and source.count("if (") == plain.count("if (")
    assert not re.search(r"if \([^)]*(within|lengths)", source)
    assert "const int* lengths;" in source and source.count("const bool within = t < L.lengths[b];") >= 1
    for kernel in program.kernels:
        for store in kernel.stores:
            if store.past_end is not None:
                assert re.search(rf"\b{store.access.param}\[[^\]]+\] = within \? {store.var} : {store.past_end};",
                                 source), (kernel.name, store)
    copies = re.findall(r"= rnn_bits16<RNN_BF16>\(([^;]*)\);", source)
    assert all(c.startswith("within ? ") for c in copies), copies


def test_pools_and_lengths_are_refused_by_name():
    from engine.nets.data import Pool
    cell = engine.preset("gru").cell
    network = wavefront_network(engine.Network(cell, 8, 16, 2))
    program = make_plan(network, 8, 3, layout="interleaved", lengths=True).program
    tiling = make_tiling(program, network, 3, TileConfig(), H100, persistent=True)
    with pytest.raises(CompileError, match="lengths= without pools.*hint"):
        render_wavefront(program, network, tiling, pools={0: Pool("max", 2, 2)})


# ---- the autotuner --------------------------------------------------------------------------------------------

def test_the_autotuner_times_only_what_takes_lengths_and_keeps_its_choice_apart():
    network = engine.Network(engine.preset("mingru").cell, 16, 32, 2)
    assert "scan" in {c.schedule for c in candidates(network, 8, H100)}
    with_lengths = candidates(network, 8, H100, lengths=True)
    assert "scan" not in {c.schedule for c in with_lengths}
    assert {c.schedule for c in with_lengths} == {"fused", "graph", "persistent"}
    assert cache_key(network, 10, 8, "GPU", lengths=True) == cache_key(network, 10, 8, "GPU") + "|lengths"


def test_the_schedules_that_refuse_lengths_say_so(monkeypatch):
    from engine import execute
    network, params, x, initial, _, _ = padded(engine.preset("mingru").cell, [4, 2], seed=1)
    monkeypatch.setattr(execute.backends, "select", lambda name: (name, "chosen"))     # as where a GPU is
    for backend, says in (("scan", "schedule 'scan' runs batches of one length.*hint: backend='auto'"),
                          ("naive", "lengths= runs on 'reference', 'fused', 'graph', 'persistent', not 'naive'")):
        with pytest.raises(BackendError, match=says):
            engine.run(network, params, x, backend=backend, lengths=[4, 2])


# ---- the training step: engine/autodiff/fused_lengths.py, run by NumPy ----------------------------------------

def train_on_numpy(cell, lengths=LENGTHS, wavefront=None, layers=2, I=4, H=5, P=None, seed=0, plan=None):
    """Relative errors of the fused plan with lengths run by NumPy (buffers poisoned) against float64 bptt."""
    network, params, x, initial, d_out, d_final = padded(cell, lengths, layers, I, H, P, seed)
    want = bptt(network, params, x, initial, d_out, d_final, lengths=lengths)
    tape = fused_tape.record(network, params, x.astype(np.float32), initial, poison=True, wavefront=wavefront,
                             runner=NumpyRunner(plan or training_plan(cell, lengths=True)), lengths=np.array(lengths))
    got = tape.backward(d_out.astype(np.float32), d_final)
    for b, n in enumerate(lengths):
        assert not got.outputs[n:, b].any() and not got.x[n:, b].any()
    errors = gradient_errors(got, want, cell.state_names, layers, finals=True)
    return {k: v for k, v in errors.items() if not v < 2e-4}


@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront", "layers"])
@pytest.mark.parametrize("name", PRESETS)
def test_every_presets_training_plan_with_lengths_equals_the_reference(name, wavefront):
    cell = engine.preset(name).cell
    assert not train_on_numpy(cell, wavefront=wavefront, P=3 if cell.uses_projection else None, seed=len(name))


@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho", "lstm_fgr", "qrnn_f"])
def test_fused_stages_with_lengths_equal_the_reference(name):
    """H = 8, B = 2: the adjacent GEMM and kernel pairs run as fused launches (in NumPy, in their order)."""
    assert not train_on_numpy(engine.preset(name).cell, lengths=[3, 5], I=8, H=8, seed=4)


@pytest.mark.parametrize("name", sorted(UNUSUAL))
def test_unusual_cells_train_with_lengths_or_are_refused_by_name(name):
    if name in ADJOINT_READERS:
        with pytest.raises(BackendError, match=rf"cell '{name}': the fused training step's gradients read .* "
                                               r"from a state's adjoint.*hint: bptt\(backend='naive'\)"):
            training_plan(UNUSUAL[name], lengths=True)
        return
    assert not train_on_numpy(UNUSUAL[name], layers=3, seed=2)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(design=cell_designs())
def test_random_cells_train_with_lengths_or_are_refused_by_name(design):
    cell = engine.from_dict(design)
    try:
        training_plan(cell, lengths=True)
    except AutodiffError:
        return                      # refused without lengths too (tests/test_fused_training_plan.py)
    except BackendError as e:
        assert "from a state's adjoint" in str(e) and "hint:" in str(e)
        return
    assert not train_on_numpy(cell, lengths=[4, 1, 3], I=2, H=3, seed=5, P=3 if cell.uses_projection else None)


def test_the_lstm_adds_its_state_gemm_to_the_held_adjoint():
    """d_h = W^T dy alone would overwrite the adjoint passed through a padded step: with lengths the GEMM adds to it
    (beta = 1) and the kernel writes 0 there first, held past the end; the plan without lengths is untouched."""
    plain, held = training_plan(engine.preset("lstm").cell), training_plan(engine.preset("lstm").cell, lengths=True)
    (_, kernel), (_, gemm) = held.backward.order
    assert gemm.accumulate and not plain.backward.order[1][1].accumulate
    stores = dict(zip(kernel.stores, kernel.past_end))
    assert stores[("held_zero", gemm.out)] == "d_h_carry"                  # 0 within, the adjoint passed past
    assert stores[("d_c", held.adjoint_places["c"])] == "d_c_carry"
    assert {held for (value, place), held in stores.items() if place.buffer.startswith("dy_")} == {"held_zero"}
    (_, forward), = [item for item in held.forward.order if item[0] == "kernel"]
    assert dict(zip((v for v, _ in forward.stores), forward.past_end)) == {
        "i": None, "f": None, "g": None, "o": None, "h_next_tanh": None, "c_next": "c", "h_next": "h_next_held"}
    assert plain.backward.order[0][1].past_end == () and not plain.lengths


@pytest.mark.parametrize("name", PRESETS)
def test_lengths_add_no_launch_and_keep_every_fused_stage(name):
    """The zeros a state adjoint's GEMM now adds to go into a kernel the step has (lstm_proj: the P-sized kernel of
    stage 0, before its stage-1 GEMM), so a step launches what it did and fuses the same pairs."""
    from engine.autodiff.stage_fusion import fused_stages
    plain, held = training_plan(engine.preset(name).cell), training_plan(engine.preset(name).cell, lengths=True)
    assert held.launches_per_step == plain.launches_per_step
    assert sorted(fused_stages(held)) == sorted(fused_stages(plain))


def test_a_state_the_step_never_reads_still_passes_its_adjoint_through():
    """qrnn_f's h: no step reads it, so no step writes its adjoint (0 within a sequence); with lengths a kernel writes
    that 0, held past the end, so d_final reaches the sequence's last step."""
    plan = training_plan(engine.preset("qrnn_f").cell, lengths=True)
    kernel = next(item for kind, item in plan.backward.order if kind == "kernel")
    assert ("held_zero", plan.adjoint_places["h"]) in kernel.stores
    assert not train_on_numpy(engine.preset("qrnn_f").cell)


# ---- nvcc -----------------------------------------------------------------------------------------------------

NVCC_WAVEFRONT = [("lstm", True, TileConfig(), "float32", 3), ("gru", False, TileConfig(), "float32", 19),
                  ("gru_cho", True, TileConfig(sync="layer"), "float32", 19),
                  ("ln_lstm", False, TileConfig(), "float32", 3), ("slstm", True, TileConfig(sync="head"),
                                                                   "bfloat16", 16),
                  ("lstm", True, TileConfig(), "bfloat16", 19),
                  ("lstm", True, TileConfig(units_per_block=16, sync="cluster"), "bfloat16", 16),
                  ("peephole_lstm", True, TileConfig(layers_per_launch=1), "tf32", 8)]


@pytest.mark.nvcc
def test_the_sources_with_lengths_compile_with_nvcc(tmp_path):
    """The wavefront schedules' sources (grid, layer and head barriers, a layer a launch, clusters, the GEMV, tiles
    and tensor cores), the fused backend's module of every preset, and the training step's kernels, fused stages
    (the tiled GEMM compiled in) and persistent launches, with lengths."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    jobs = []
    for k, (name, persistent, config, precision, B) in enumerate(NVCC_WAVEFRONT):
        _, source = render(name, True, persistent=persistent, config=config, precision=precision, B=B,
                           H=256 if config.sync in ("cluster", "head") else 129,
                           I=64 if precision == "bfloat16" else 37)
        path = tmp_path / f"wave{k}_{name}.cu"
        path.write_text(source)
        jobs.append((path.name, nvcc_command(path, tmp_path / f"wave{k}.cubin")))
    modules = tmp_path / "fused.cu"
    modules.write_text("\n".join(compile_program(engine.preset(n).cell, lengths=True).source for n in PRESETS))
    jobs.append((modules.name, ["nvcc", "-arch=sm_90", *CHECK_ONLY, "--ptx", "-o", str(tmp_path / "fused.ptx"),
                                "-Werror", "all-warnings", str(modules)]))

    def compile_one(job):
        label, cmd = job
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        return label, done.returncode, done.stdout

    with ThreadPool(os.cpu_count() or 2) as pool:
        failed = [(label, out) for label, code, out in pool.map(compile_one, jobs) if code != 0]
    assert not failed, f"nvcc failed on {[label for label, _ in failed]}; the first:\n{failed[0][1][-4000:]}"


@pytest.mark.nvcc
def test_the_training_kernels_with_lengths_compile_with_nvcc(tmp_path):
    from engine.autodiff import persistent
    from engine.autodiff.stage_fusion import fused_stages
    sources = {n: render_training(training_plan(engine.preset(n).cell, lengths=True)) for n in PRESETS}
    # the fused stages' tiled GEMM, and the persistent launches at one row (the warp GEMV) and at six (the rows GEMM)
    rows = {"tiled": render_training(training_plan(engine.preset("lstm_fgr").cell, lengths=True), tiled=True)}
    for name in ("lstm", "gru_cho", "qrnn_f"):
        plan = training_plan(engine.preset(name).cell, lengths=True)
        for forward in (True, False):
            stages = {k: s for k, s in fused_stages(plan).items() if s.forward == forward}
            for B, into in ((1, sources), (6, rows)):
                layout = persistent.make_plan(plan, stages, {"I": 16, "H": 32, "P": 32}, B, 132, forward)
                into[f"{name}-{forward}"] = persistent.render(plan, layout)
    _nvcc(sources, tmp_path)
    (tmp_path / "rows").mkdir()
    _nvcc(rows, tmp_path / "rows")


def test_the_benchmark_draws_lengths_in_the_upper_half_and_times_only_what_is_right(monkeypatch):
    """benchmarks/lengths_bench.py (run on the GPU): lengths uniform in [T/2, T] with T among them; a row whose
    results are wrong against the float64 reference is reported and not timed."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "lengths_bench.py"
    spec = importlib.util.spec_from_file_location("lengths_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lengths = bench.draw_lengths(100, 64, seed=0)
    assert lengths.min() >= 50 and lengths.max() == 100 and len(set(lengths.tolist())) > 10
    monkeypatch.setattr(bench, "timed", lambda run, warmup, reps: {"median_ms": run()})
    fine = bench.pair("row", {"without": lambda: 2.0, "with": lambda: 2.05}, {"outputs": 1e-6, "x gradient": 5e-4},
                      1, 1)
    assert fine["ratio"] == pytest.approx(1.025) and fine["within_target"]
    wrong = bench.pair("row", {"without": lambda: 1.0, "with": lambda: 1.0}, {"outputs": 1e-2}, 1, 1)
    assert "not timed" in wrong["error"] and "ratio" not in wrong
