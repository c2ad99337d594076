"""float32x3 (3xTF32) of the schedules on the GPU, against the reference that emulates it and against float64.

The emulation (engine.rounding.mode_matmul) multiplies exactly the TF32 parts the three MMAs multiply and sums in
float64, so a schedule in float32x3 differs from it by fp32 accumulation and cell math only; it must also stay at
fp32's level against float64, far below tf32's error on the same inputs (a lost lo part, or a weight stored rounded,
gives tf32's error and fails here). Paths: the warp GEMV of few rows (B = 3, strict fp32 in this mode), the MMA
path (B = 19, 33, 40: odd sizes, one and several 16-row tiles, split K), resident and streamed weights, layer 0
projected in the kernel (L = 2) or by the three cublasGemmEx calls (L = 1, layer by layer), one `large`-like size,
poisoned outputs, and auto's opt-in (its bit-identical reruns: tests/gpu/test_precision_gpu.py). The fused backend
in float32x3 (two TF32 GEMMs of the stacked parts, K chunks as a batch, then a fold: engine/schedules/split_products.py) is held
to the same checks: every preset, chunks with and without a rest, its CUDA-graph replay, a `large`-like size; in fp16
parts both on cublasLt and on the engine's own wgmma kernel (step_product, engine/schedules/wgmma_products.py: "auto" takes it
on sm_90, cublasLt elsewhere).
"""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import make_case, relative_error

import engine
from engine.backends import fused, reference
from engine.schedules import autotune, fused_modes, project, schedule_class, wgmma_products
from engine.schedules.cublaslt import LtProjection
from engine.schedules.split_products import X3_PARTS_DEFAULT
from engine.schedules.tiling import TileConfig

pytestmark = pytest.mark.gpu

PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)
SCHEDULES = ("graph", "persistent")
EMULATED_TOLERANCE = 2e-5       # norm-relative, against the float32x3 emulation
STRICT_TOLERANCE = 5e-5         # norm-relative, against float64
TF32_MARGIN = 10                # float32x3's error against float64 at least this many times below tf32's


def check_x3(result, network, params, x, states, what, tf32=None):
    assert not np.isnan(result.outputs).any(), f"{what}: NaN in the outputs (a value read before it was written)"
    assert result.info["precision"] == "float32x3", what
    emulated = reference.run(network, params, x, states, precision="float32x3")
    strict = reference.run(network, params, x, states)
    to_emulated = relative_error(result.outputs, emulated.outputs)
    to_strict = relative_error(result.outputs, strict.outputs)
    for name, value in emulated.final_states.items():
        to_emulated = max(to_emulated, relative_error(result.final_states[name], value))
    assert to_emulated <= EMULATED_TOLERANCE, f"{what}: {to_emulated:.3g} from the float32x3 emulation"
    assert to_strict <= STRICT_TOLERANCE, f"{what}: {to_strict:.3g} from float64"
    if tf32 is not None:
        tf32_error = relative_error(tf32.outputs, strict.outputs)
        assert to_strict * TF32_MARGIN <= tf32_error, (
            f"{what}: float32x3 is {to_strict:.3g} from float64, tf32 {tf32_error:.3g}: the lo parts are lost")
    return to_strict


def run(schedule, network, params, x, states, precision="float32x3", config=None):
    program = schedule_class(schedule)(network, params, config=config, precision=precision)
    return program.run(x, states, poison=True)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_matches_its_emulation(cupy, name):
    cases = [("persistent", 19)] + ([("persistent", 3), ("graph", 19)] if name in ("lstm", "gru_cho") else [])
    for schedule, batch in cases:
        size = {"input_size": 37, "hidden_size": 129, "batch": batch, "steps": 17}
        network, params, x, states = make_case(engine.preset(name).cell, 2, seed=batch, sizes=size)
        result = run(schedule, network, params, x, states)
        tf32 = run(schedule, network, params, x, states, "tf32") if batch > 4 else None   # B <= 4: strict fp32
        check_x3(result, network, params, x, states, f"{schedule} {name} float32x3 B={batch}", tf32)


CASES = [
    ("one layer: three cublasGemmEx projections", 1, 40, TileConfig()),
    ("streamed weights", 2, 33, TileConfig(resident=False)),
    ("layer by layer", 3, 19, TileConfig(layers_per_launch=1)),
    ("gemv, streamed", 2, 4, TileConfig(resident=False)),
]


@pytest.mark.parametrize("label,layers,batch,config", CASES, ids=[c[0] for c in CASES])
def test_paths(cupy, label, layers, batch, config):
    size = {"input_size": 48, "hidden_size": 96, "batch": batch, "steps": 13}
    schedules = ("persistent",) if config.layers_per_launch or not config.resident else SCHEDULES
    for cell in ("lstm", "gru_cho"):
        network, params, x, states = make_case(engine.preset(cell).cell, layers, seed=3, sizes=size)
        for schedule in schedules:
            result = run(schedule, network, params, x, states, config=config)
            tf32 = run(schedule, network, params, x, states, "tf32", config) if batch > 4 else None
            check_x3(result, network, params, x, states, f"{schedule} {cell} float32x3 {label}", tf32)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_large_like_size_stays_at_fp32_level(cupy, schedule):
    """`large` (1024, 1024, 2, 100, 128) with T cut to 30 for the float64 reference's sake: float32x3 within the
    emulation, and its error against float64 at most 2x strict fp32's (the schedule in float32) plus an ulp."""
    size = {"input_size": 1024, "hidden_size": 1024, "batch": 128, "steps": 30}
    network, params, x, states = make_case(engine.preset("lstm").cell, 2, seed=7, sizes=size)
    result = run(schedule, network, params, x, states)
    tf32 = run(schedule, network, params, x, states, "tf32")
    error = check_x3(result, network, params, x, states, f"{schedule} lstm large-like float32x3", tf32)
    fp32 = run(schedule, network, params, x, states, "float32")
    fp32_error = relative_error(fp32.outputs, reference.run(network, params, x, states).outputs)
    assert error <= 2 * fp32_error + 2.0 ** -24, f"float32x3 {error:.3g} against strict fp32's {fp32_error:.3g}"


def test_auto_takes_float32x3_only_when_allowed(cupy, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    size = {"input_size": 64, "hidden_size": 128, "batch": 40, "steps": 8}
    network, params, x, states = make_case(engine.preset("gru").cell, 2, seed=2, sizes=size)
    strict = engine.run(network, params, x, states, backend="auto")
    assert strict.info["precision"] == "float32"
    allowed = engine.run(network, params, x, states, backend="auto", allow_tensor_core_fp32=True)
    assert allowed.info["precision"] in ("float32", "float32x3")
    choice = autotune.tune(network, params, 8, 40, allow_tensor_core_fp32=True)
    assert "+3xtf32" in choice.key and "float32x3 allowed" in choice.why
    assert any("[float32x3]" in t["candidate"] for t in choice.timings), choice.timings
    assert choice.precision in (None, "float32x3")
    reference_out = reference.run(network, params, x, states).outputs
    assert relative_error(allowed.outputs, reference_out) <= STRICT_TOLERANCE
    explicit = engine.run(network, params, x, states, backend="persistent", precision="float32x3")
    check_x3(explicit, network, params, x, states, "engine.run persistent float32x3")


def test_the_tuner_times_only_float32x3_candidates_within_twice_strict_fp32s_error(cupy, tmp_path, monkeypatch):
    """allow_tensor_core_fp32: the fused float32x3 candidate is tried, and every float32x3 candidate the tuner timed
    is within 2x the strict first candidate's error against float64 on the tuning input (autotune.X3Gate), checked
    here on that input with the NumPy reference; one forced past the bound is refused with the figures."""
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    network, params, _, _ = make_case(engine.preset("lstm").cell, 1, seed=4,
                                      sizes={"input_size": 96, "hidden_size": 256, "batch": 16, "steps": 12})
    choice = autotune.tune(network, params, 12, 16, repeats=2, allow_tensor_core_fp32=True, use_cache=False)
    x3 = [t for t in choice.timings if "[float32x3]" in t["candidate"]]
    assert any(t["candidate"].startswith("fused") for t in x3), choice.timings
    x = cupy.asarray(np.random.default_rng(0).standard_normal((12, 16, 96)), dtype=cupy.float32)   # tune()'s input
    exact = reference.run(network, params, cupy.asnumpy(x).astype(np.float64)).outputs
    strict = fused.run(network, params, x).outputs
    strict_error = relative_error(cupy.asnumpy(strict), exact)
    timed = [t for t in x3 if "ms" in t]
    assert timed, choice.timings
    for entry in x3:
        assert "ms" in entry or "against float64 is over 2x strict fp32's" in entry["error"], entry
    if choice.precision == "float32x3":
        program = autotune.prepare(choice.candidate, network, params)
        error = relative_error(cupy.asnumpy(program.run(x).outputs), exact)
        assert error <= 2 * max(strict_error, 2.0 ** -24), (error, strict_error)
    with_lengths = autotune.tune(network, params, 12, 16, repeats=2, allow_tensor_core_fp32=True, use_cache=False,
                                 lengths=True)             # no float64 gate with lengths (the naive backend has none)
    assert not any("against float64" in str(t.get("error")) for t in with_lengths.timings), with_lengths.timings
    assert any("[float32x3]" in t["candidate"] and "ms" in t for t in with_lengths.timings), with_lengths.timings
    only_x3 = [c for c in autotune.candidates(network, 16, autotune.DeviceLimits.current(),
                                              tensor_core_fp32=True) if c.precision == "float32x3"]
    monkeypatch.setattr(autotune, "candidates", lambda *args: only_x3)
    with pytest.raises(engine.BackendError, match="no strict fp32 candidate ran: nothing to hold its error"):
        autotune.tune(network, params, 12, 16, repeats=2, allow_tensor_core_fp32=True, use_cache=False)
    gate = autotune.X3Gate(cupy, network, params, x)
    assert gate.refuses(strict, strict) is None
    worse = strict + 3 * max(strict_error, 2.0 ** -24) * float(cupy.abs(strict).max())
    assert "against float64 is over 2x strict fp32's" in gate.refuses(worse, strict)


@pytest.mark.parametrize("schedule", ["persistent", "graph"])
def test_the_schedules_float32x3_runs_are_replayed(cupy, schedule, monkeypatch):
    """Their input projection's three TF32 products go through cublasLt (project.split_products_lt), which a capture
    holds (CuPy's cuBLAS was refused, so `large` and blogA went unreplayed, H200 2026-11-28): one layer of `large`'s
    sizes (one layer a launch projects before the kernel; with more, layer 0 projects in it) replays on the third
    run, bit-identical to a poisoned direct run."""
    size = {"input_size": 1024, "hidden_size": 1024, "batch": 128, "steps": 6}
    network, params, x, states = make_case(engine.preset("lstm").cell, 1, seed=8, sizes=size)
    made, through_lt = [], project.split_products_lt
    monkeypatch.setattr(project, "split_products_lt", lambda *args: made.append(1) or through_lt(*args))
    program = schedule_class(schedule)(network, params, precision="float32x3")
    direct = program.run(x, states, poison=True)
    assert made, "the projection did not go through split_products_lt at this size"
    check_x3(direct, network, params, x, states, f"{schedule} lstm float32x3, its projection on cublasLt")
    for _ in range(3):
        again = program.run(x, states)
    assert again.info["replayed"].startswith("replayed from CUDA graphs"), again.info["replayed"]
    np.testing.assert_array_equal(again.outputs, direct.outputs)


# ---- the fused backend in float32x3 (engine/schedules/split_products.py) ----------------------------------------

FUSED_PRESETS = sorted(engine.presets())        # projected states too: the fused backend takes them
PARTS = ("tf32", "fp16")                         # x3_parts: how the step products' parts are held
# (x3_parts, step_product): TF32 parts on cublasLt, fp16 parts on cublasLt and on the wgmma kernel where the GPU has it
PRODUCTS = (("tf32", "cublaslt"), ("fp16", "cublaslt"), ("fp16", "auto"))


def expected_product(cupy, product: str) -> str:
    """The step product step_product asks for on this GPU."""
    return "cublaslt" if product == "cublaslt" or not wgmma_products.wgmma_capable(cupy) else "wgmma"


@pytest.mark.parametrize("parts, product", PRODUCTS)
@pytest.mark.parametrize("name", FUSED_PRESETS)
def test_fused_every_preset_matches_its_emulation(cupy, name, parts, product):
    """In TF32 parts and in fp16 parts (the same 11-bit parts on fp16 tensor cores, on cublasLt and on the wgmma
    kernel): the emulation's value. H = 129, B = 19: the wgmma kernel's tiles padded in every dimension."""
    size = {"input_size": 37, "hidden_size": 129, "batch": 19, "steps": 17}
    network, params, x, states = make_case(engine.preset(name).cell, 2, seed=19, sizes=size)
    result = fused_modes.prepare(network, params, precision="float32x3", x3_parts=parts,
                                 step_product=product).run(x, states, poison=True)
    assert result.info["x3_parts"] == parts and result.info["step_product"] == expected_product(cupy, product), result.info
    tf32 = fused_modes.prepare(network, params, precision="tf32").run(x, states, poison=True)
    check_x3(result, network, params, x, states, f"fused {name} float32x3 in {parts} parts", tf32)


@pytest.mark.parametrize("parts, product", PRODUCTS)
@pytest.mark.parametrize("chunk", [None, 32, 48, 100, "auto"])
def test_fused_chunks_and_the_replay(cupy, chunk, parts, product):
    """The step's K = H = 98 in chunks of about 32 (three of 28, a batch, and a rest of 14), 48 (two of 36 and 26),
    "auto" (64: one of 52 and a rest of 46), 100 and None (one); the projection's K = I = 50 in 28 and 22, or one;
    on the wgmma kernel, a promoted accumulator every 64 or 128 columns. The CUDA-graph replay bit-identical to a
    poisoned direct run, on new inputs too."""
    size = {"input_size": 50, "hidden_size": 98, "batch": 16, "steps": 11}
    for name, layers in (("lstm", 2), ("gru_cho", 1)):
        network, params, x, states = make_case(engine.preset(name).cell, layers, seed=5, sizes=size)
        program = fused_modes.prepare(network, params, precision="float32x3", x3_chunk=chunk, x3_parts=parts,
                                      step_product=product)
        direct = program.run(x, states, poison=True)
        check_x3(direct, network, params, x, states, f"fused {name} float32x3 chunk {chunk} {parts} parts")
        for _ in range(3):
            again = program.run(x, states)
        assert again.info["replayed"].startswith("replayed from CUDA graphs"), again.info["replayed"]
        np.testing.assert_array_equal(again.outputs, direct.outputs)
        x2 = np.random.default_rng(6).standard_normal(x.shape)
        np.testing.assert_array_equal(program.run(x2, states).outputs, program.run(x2, states, poison=True).outputs)


@pytest.mark.parametrize("parts, product", PRODUCTS)
def test_fused_large_like_size_stays_at_fp32_level(cupy, parts, product):
    """`large` with T cut to 30: the fused backend's float32x3 ("auto": chunks of 256 at K = 1024 on cublasLt, a
    promoted accumulator every 128 columns on the wgmma kernel) at most 2x strict fp32's error against float64 (the
    fused backend in float32) plus an ulp, and engine.run routes backend='fused' to it."""
    size = {"input_size": 1024, "hidden_size": 1024, "batch": 128, "steps": 30}
    network, params, x, states = make_case(engine.preset("lstm").cell, 2, seed=7, sizes=size)
    result = fused_modes.run(network, params, x, states, precision="float32x3", x3_parts=parts, step_product=product)
    assert result.info["x3_parts"] == parts and result.info["step_product"] == expected_product(cupy, product), result.info
    if parts == X3_PARTS_DEFAULT and product == "auto":     # engine.run routes backend='fused' in float32x3 to it
        routed = engine.run(network, params, x, states, backend="fused", precision="float32x3")
        np.testing.assert_array_equal(routed.outputs, result.outputs)
    tf32 = engine.run(network, params, x, states, backend="fused", precision="tf32")
    error = check_x3(result, network, params, x, states, f"fused lstm large-like float32x3 {parts} parts", tf32)
    fp32 = engine.run(network, params, x, states, backend="fused")
    fp32_error = relative_error(fp32.outputs, reference.run(network, params, x, states).outputs)
    assert error <= 2 * fp32_error + 2.0 ** -24, f"float32x3 {error:.3g} against strict fp32's {fp32_error:.3g}"


@pytest.mark.parametrize("parts", PARTS)
def test_fused_fold_in_the_kernels_is_the_fold_launch(cupy, parts):
    """x3_fold="kernel" (the default): the cell kernels fold P as they read it (split_products.fold_read), in the fold
    kernel's order, so the outputs are x3_fold="launch"'s (a fold kernel) bit for bit; poisoned, replayed, in chunks
    with a rest."""
    size = {"input_size": 50, "hidden_size": 98, "batch": 16, "steps": 11}
    for name, layers in (("lstm", 2), ("gru_cho", 1)):
        network, params, x, states = make_case(engine.preset(name).cell, layers, seed=9, sizes=size)
        launch = fused_modes.prepare(network, params, precision="float32x3", x3_chunk=32, x3_fold="launch",
                                     x3_parts=parts, step_product="cublaslt")
        kernel = fused_modes.prepare(network, params, precision="float32x3", x3_chunk=32, x3_parts=parts,
                                     step_product="cublaslt")
        want = launch.run(x, states, poison=True)
        got = kernel.run(x, states, poison=True)
        check_x3(got, network, params, x, states, f"fused {name} float32x3 folded in the kernels")
        np.testing.assert_array_equal(got.outputs, want.outputs)
        for _ in range(3):
            again = kernel.run(x, states)
        assert again.info["replayed"].startswith("replayed from CUDA graphs"), again.info["replayed"]
        np.testing.assert_array_equal(again.outputs, want.outputs)


def test_fp16_parts_past_their_range_run_again_in_tf32_parts(cupy):
    """x3_parts="fp16" where a value has no fp16 part (|v| > 65504): an Elman relu net whose recurrent weight doubles
    h every step (an operand past the range mid-run: the copies' flag), initial states past it (the split kernel's
    flag), a weight past it (refused at upload), and an input past it (the projection's split flags it). Each time the program runs again in TF32 parts, says so, and
    gives that run's outputs bit for bit; later runs replay in TF32 parts."""
    size = {"input_size": 24, "hidden_size": 64, "batch": 8, "steps": 40}
    network, params, x, states = make_case(engine.preset("elman_relu").cell, 1, seed=3, sizes=size)
    growing = engine.Params([{**params[0], "W_hh": 2.0 * np.eye(64)}])
    big_states = {"h": np.full_like(states["h"], 7.0e4)}
    big_weight = engine.Params([{**params[0], "W_hh": params[0]["W_hh"] * 1e6}])
    big_x = x.copy()
    big_x[3, 2, 5] = 7.0e4
    for label, p, s0, xs in (("h doubling every step", growing, states, x),
                             ("initial states of 7e4", params, big_states, x),
                             ("a recurrent weight times 1e6", big_weight, states, x),
                             ("an input of 7e4 (the projection's split)", params, states, big_x)):
        tf32 = fused_modes.prepare(network, p, precision="float32x3", x3_parts="tf32").run(xs, s0, poison=True)
        program = fused_modes.prepare(network, p, precision="float32x3", x3_parts="fp16")
        first = program.run(xs, s0, poison=True)
        assert first.info["x3_parts"] == "tf32" and first.info["x3_parts_fallback"], (label, first.info)
        np.testing.assert_array_equal(first.outputs, tf32.outputs, err_msg=label)
        if p is growing:                     # the doubling h did pass the range (the copies' flag, mid-run)
            assert float(np.abs(tf32.outputs).max()) > 65504 and float(np.abs(tf32.outputs[0]).max()) < 65504
        for _ in range(3):
            again = program.run(xs, s0)
        assert again.info["replayed"].startswith("replayed from CUDA graphs"), (label, again.info)
        np.testing.assert_array_equal(again.outputs, tf32.outputs, err_msg=label)
    in_range = fused_modes.prepare(network, params, precision="float32x3", x3_parts="fp16").run(x, states, poison=True)
    assert in_range.info["x3_parts"] == "fp16" and "x3_parts_fallback" not in in_range.info, in_range.info
    assert in_range.info["step_product"] == expected_product(cupy, "auto"), in_range.info     # the flag of the tiles' copies


def test_fused_split_k_at_a_bloga_like_size(cupy, monkeypatch):
    """blogA's sizes (I = H = 2560, B = 64) with T cut to 6: "auto" takes the W_hi product's 5 K chunks as cublasLt's
    split-K in fp16 parts (a product with splits > 1 issued, nothing refused; TF32 parts keep the batch, cublasLt
    refused their split-K, H200 2026-11-28), at fp32's level against float64 like the batch of chunk planes, and its
    replays are a poisoned direct run's bits (the splits summed in the workspace in a fixed order)."""
    parts, split = "fp16", []
    product = LtProjection.product
    monkeypatch.setattr(LtProjection, "product", lambda self, shape, *args, **kw: (
        split.append(shape.splits) if shape.splits > 1 else None) or product(self, shape, *args, **kw))
    size = {"input_size": 2560, "hidden_size": 2560, "batch": 64, "steps": 6}
    network, params, x, states = make_case(engine.preset("gru").cell, 1, seed=12, sizes=size)
    program = fused_modes.prepare(network, params, precision="float32x3", x3_parts=parts, x3_splitk="auto")
    direct = program.run(x, states, poison=True)
    assert direct.info["x3_splitk"] == "auto" and "x3_splitk_fallback" not in direct.info, direct.info
    assert split and set(split) == {5}, split                  # K = 2560 in the 5 chunks of "auto"
    batch = fused_modes.prepare(network, params, precision="float32x3", x3_parts=parts, x3_splitk=False)
    tf32 = fused_modes.prepare(network, params, precision="tf32").run(x, states, poison=True)
    error = check_x3(direct, network, params, x, states, f"fused gru blogA-like split-K {parts} parts", tf32)
    batch_error = check_x3(batch.run(x, states, poison=True), network, params, x, states, "the batch of planes")
    assert error <= 1.5 * batch_error + 2.0 ** -24, (error, batch_error)
    for _ in range(3):
        again = program.run(x, states)
    assert again.info["replayed"].startswith("replayed from CUDA graphs"), again.info["replayed"]
    np.testing.assert_array_equal(again.outputs, direct.outputs)


def test_fused_split_k_forced_on_small_k_runs_or_falls_back(cupy):
    """x3_splitk=True where K = 98 (chunks of 32: 4 splits): cublasLt splits it, or refuses and the program runs
    again with the batch of planes and says so; the emulation's value either way."""
    size = {"input_size": 50, "hidden_size": 98, "batch": 16, "steps": 11}
    network, params, x, states = make_case(engine.preset("lstm").cell, 2, seed=13, sizes=size)
    program = fused_modes.prepare(network, params, precision="float32x3", x3_chunk=32, x3_splitk=True)
    result = program.run(x, states, poison=True)
    assert result.info["x3_splitk"] is True or (result.info["x3_splitk"] is False
                                                and result.info["x3_splitk_fallback"]), result.info
    check_x3(result, network, params, x, states, f"fused lstm split-K forced ({result.info['x3_splitk']})")
