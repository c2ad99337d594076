"""benchmarks/probe_x3_promote.py on the CPU: it loads, its shapes are the step products of `large` and blogA, and
its arguments parse (the kernel it times is tests/test_wgmma_products.py's; the GPU suite runs the probe)."""
from __future__ import annotations

from script_loader import load_script


def test_the_probe_loads_and_its_shapes_are_the_anchor_step_products():
    module = load_script("probe_x3_promote")
    for cell, config, R, K, N in module.SHAPES:
        gates = {"lstm": 4, "gru": 3}[cell]
        assert N == gates * K and R == {"large": 128, "blogA": 64}[config], (cell, config)
