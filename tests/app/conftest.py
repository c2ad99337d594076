"""AppTest fixtures: the whole app (app/main.py, its st.navigation) run headless in this process."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"


@pytest.fixture
def app(tmp_path, monkeypatch) -> AppTest:
    """A fresh session of the app after its first run (the Designer, the default page).

    The designs folder (autosave) is a temporary one: every test starts from the LSTM preset and
    none touches the user's designs/.
    """
    monkeypatch.setenv("RNN_DESIGNS_DIR", str(tmp_path / "designs"))
    at = AppTest.from_file(str(MAIN), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture
def open_page(app):
    """open_page("schedule") switches the session to app/views/schedule.py and runs it."""
    def go(name: str) -> AppTest:
        app.switch_page(f"views/{name}.py").run()
        assert not app.exception, [e.value for e in app.exception]
        return app
    return go


def synthetic_results(rng, steps: int = 12) -> dict:
    """A results document in engine.bench's schema with random timings and error curves: the pages
    must draw exactly these numbers."""
    from engine.bench.results import new_results
    results = new_results({"device": "Test GPU"}, {"sgemm_fp32_tflops": 50.0, "launch_us": 3.0},
                          {"reps": 20, "warmup": 3, "buffers": 3, "seed": 0})
    for preset, config in (("lstm", "lat"), ("gru", "mid")):
        entries = []
        for name, family, precision in (("cudnn-fp32", "cudnn", "fp32"), ("naive", "engine", "fp32"),
                                        ("fused", "engine", "fp32"), ("graph", "engine", "fp32"),
                                        ("persistent", "engine", "fp32"), ("auto", "engine", "fp32"),
                                        ("torch-eager", "torch", "fp32"), ("cudnn-fp16", "cudnn", "fp16"),
                                        ("flashrnn-bf16", "flashrnn", "bf16")):
            entries.append({
                "name": name, "family": family, "precision": precision, "status": "ok", "reason": None,
                "median_ms": float(rng.uniform(0.1, 10.0)), "min_ms": None, "max_ms": None,
                "speedup": {}, "error": {"max_abs": float(rng.uniform(1e-7, 1e-5))},
                "detail": {"schedule": "persistent"} if name == "auto" else {},
                "divergence": {"vs_reference": {"max": rng.uniform(1e-8, 1e-5, steps).tolist(),
                                                "mean": rng.uniform(1e-9, 1e-6, steps).tolist()},
                               "vs_cudnn_fp32": {"max": rng.uniform(1e-8, 1e-5, steps).tolist(),
                                                 "mean": rng.uniform(1e-9, 1e-6, steps).tolist()}}})
        entries.append({"name": "torch.compile", "family": "torch", "precision": "fp32", "status": "unavailable",
                        "reason": "triton is not installed"})
        results["cells"].append({"preset": preset, "status": "ok", "reason": None, "implementations": entries,
                                 "config": {"name": config, "input_size": 8, "hidden_size": 16, "num_layers": 2,
                                            "steps": steps, "batch": 4}})
    results["status"] = "complete"
    return results


@pytest.fixture
def saved_results(tmp_path, monkeypatch):
    """One synthetic results file in a temporary benchmarks/results/, which list_results() then reads."""
    import numpy as np
    results_module = pytest.importorskip("engine.bench.results")
    results = synthetic_results(np.random.default_rng())
    path = tmp_path / "bench-test.json"
    results_module.save_results(results, path)
    monkeypatch.setattr(results_module, "RESULTS_DIR", tmp_path)
    return results
