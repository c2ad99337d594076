"""benchmarks/phase_profile.py on the CPU: its marks find the persistent kernel's steps, stages and end in the
generated source. A kernel whose start or end the instrumentation misses runs with no clock marks and the profile
reads NaN, as happened when the kernel's carried registers were first declared between its block barrier and its
step loop. Checked on the LayerNorm LSTM at blogB (three stages, reductions, carried values) and the LSTM."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import engine
from engine.codegen.wavefront import render_wavefront
from engine.compiler import make_plan
from engine.dense import wavefront_network
from engine.schedules.tiling import H100, TileConfig, make_tiling

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "phase_profile.py"


def script():
    spec = importlib.util.spec_from_file_location("phase_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("phase_profile", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, phases", [
    ("ln_lstm", ["s1 cell math", "s1 partials", "s2 reduction sums", "s2 cell math", "s2 partials",
                 "s3 reduction sums", "s3 cell math", "grid.sync"]),
    ("lstm", ["s1 cell math", "grid.sync"]),
])
def test_the_marks_cover_the_steps_the_stages_and_the_end_of_the_blogb_kernel(name, phases):
    network = wavefront_network(engine.Network(engine.preset(name).cell, 64, 256, 3))
    program = make_plan(network, 10, 64, layout="interleaved").program
    tiling = make_tiling(program, network, 64, TileConfig(), H100, persistent=True)
    source = render_wavefront(program, network, tiling)
    text, found = script().instrument(source)
    assert [p for p in found if not p.startswith("s1 rnn_")] == phases
    assert any(p.startswith("s1 rnn_tile_gemms") for p in found)
    assert text.count("const long long rnn_prof_c0 = clock64();") == 1      # the steps' start
    assert text.count("row[RNN_PROF_PHASES] = clock64() - rnn_prof_c0;") == 1    # the table, at the kernel's end
    start = text.index("rnn_prof_c0 = clock64()")
    assert start < text.index("for (int k", start) and start > text.index("_persistent(")
