"""The schedule page's toggle "allow tensor cores for fp32 (3xTF32)": shown for float32 only, and it shows the
autotuner's choices tuned with engine.run(..., allow_tensor_core_fp32=True), cached under a key of their own."""
from __future__ import annotations

import pytest
from test_pages import texts

import engine
from engine.schedules.tiling import TileConfig


@pytest.fixture
def two_choices(tmp_path, monkeypatch):
    """A strict float32 choice (graph) and an opt-in one (persistent in float32x3) for the page's default sizes."""
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path / "autotune"))
    from app.state import DEFAULT_SIZES
    from engine.schedules.autotune import Choice, cache_key, write_entry
    network = engine.Network(engine.preset("lstm").cell, DEFAULT_SIZES["input_size"], DEFAULT_SIZES["hidden_size"],
                             DEFAULT_SIZES["num_layers"])
    strict = cache_key(network, DEFAULT_SIZES["steps"], DEFAULT_SIZES["batch"], "Test GPU")
    opt_in = cache_key(network, DEFAULT_SIZES["steps"], DEFAULT_SIZES["batch"], "Test GPU", tensor_core_fp32=True)
    assert strict != opt_in
    write_entry(strict, Choice("graph", TileConfig(4), "strict (test)", strict, []))
    write_entry(opt_in, Choice("persistent", TileConfig(4), "3xTF32 (test)", opt_in, [], precision="float32x3"))


def expanders(at) -> list[str]:
    return [e.label for e in at.expander if e.label.startswith("Autotuned")]


def test_the_toggle_shows_the_choices_tuned_with_tensor_cores_allowed(open_page, two_choices):
    at = open_page("schedule")
    toggle = at.checkbox(key="schedule.tensor_core_fp32")
    assert toggle.label == "allow tensor cores for fp32 (3xTF32)" and toggle.value is False
    assert expanders(at) == [f"Autotuned on Test GPU: graph ({TileConfig(4).label()})"]
    toggle.check().run()
    assert expanders(at) == [f"Autotuned on Test GPU: persistent ({TileConfig(4).label()}) in float32x3"]
    assert at.radio(key="schedule.choice").value == "persistent"
    assert "3xTF32 (test)" in texts(at.caption)
    assert not at.exception and not at.error


def test_the_toggle_is_for_float32_only_and_float32x3_plans_tensor_core_tiles(open_page, two_choices):
    at = open_page("schedule")
    at.text_input(key="schedule.batch").set_value(str(32)).run()          # many rows: the tiled path
    at.radio(key="schedule.precision").set_value("float32x3").run()
    assert not [c for c in at.checkbox if c.key == "schedule.tensor_core_fp32"]
    assert "tensor-core MMA (float32x3)" in texts(at.caption)
    at.toggle(key="schedule.show_source").set_value(True).run()
    cuda = [c.value for c in at.code if c.language == "cpp" and "engine.codegen.wavefront" in c.value]
    assert len(cuda) == 1 and "rnn_mma_gemms<RNN_TF32X3" in cuda[0]
    assert not at.exception and not at.error
