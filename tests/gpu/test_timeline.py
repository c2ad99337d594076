"""The measured timeline (engine.bench.timeline) on the GPU: every stage of every layer-step is there,
each lane's stages are in stream order, and each layer's first step runs after the layer below produced its input."""
import pytest

import engine
from engine.bench import timeline
from engine.explain import build_plan

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name, layers", [("lstm", 3), ("gru_cho", 2)])
def test_timeline_has_every_stage_in_stream_order(cupy, name, layers):
    steps, batch = 12, 4
    events = timeline(name, input_size=32, hidden_size=64, num_layers=layers, steps=steps, batch=batch)
    plan = build_plan(engine.preset(name).cell, input_size=32, hidden_size=64, num_layers=layers,
                      steps=steps, batch=batch)
    per_step = [item.name for kind, item in plan.program.step_order()]
    for layer in range(layers):
        mine = [e for e in events if e["layer"] == layer]
        stepped = [e for e in mine if e["name"] in per_step]
        assert len(stepped) == steps * len(per_step), f"layer {layer}: {len(stepped)} stage events"
        for a, b in zip(mine, mine[1:]):
            assert b["start_ms"] >= a["end_ms"] - 1e-3, f"layer {layer}: {a} overlaps {b} on one stream"
        assert all(e["end_ms"] >= e["start_ms"] >= 0 for e in mine)
    for layer in range(1, layers):      # the wavefront's dependency: layer l step 0 after layer l-1 step 0
        below = max(e["end_ms"] for e in events if e["layer"] == layer - 1 and e["t"] == 0 and e["name"] in per_step)
        above = min(e["start_ms"] for e in events if e["layer"] == layer and e["t"] == 0 and e["name"] in per_step)
        assert above >= below - 1e-3, f"layer {layer} step 0 started before layer {layer - 1} step 0 ended"

def test_timeline_refuses_absurd_sizes_before_running(cupy):
    with pytest.raises(engine.BackendError, match="steps"):
        timeline("lstm", input_size=8, hidden_size=8, num_layers=64, steps=1000, batch=1)
