"""benchmarks/issue34_targets.py on the CPU: each target reads the harness's rows it names (bench and --train result
files), the smallest ratio decides, a bounded error must hold too, and a row missing or failed leaves the target
"not measured", never met; the parts name implementations and configurations the harness takes."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from engine.bench.configs import parse_configs

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "issue34_targets.py"


def script():
    spec = importlib.util.spec_from_file_location("issue34_targets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("issue34_targets", module)            # (its dataclass looks its module up by name)
    spec.loader.exec_module(module)
    return module


def entry(name, ms, status="ok", error_ratio=None):
    found = {"name": name, "status": status, "reason": None if status == "ok" else "boom", "median_ms": ms}
    if error_ratio is not None:
        found["error_vs_cudnn_bound"] = {"ratio": error_ratio}
    return found


def write(path, cells, device="NVIDIA H100 80GB HBM3"):
    path.write_text(json.dumps({"environment": {"device": device, "cudnn": 91900, "torch": "2.11"},
                                "cells": cells}))
    return path


def test_targets_are_met_not_met_or_not_measured(tmp_path):
    t = script()
    bench = write(tmp_path / "bench-1.json", [
        {"preset": cell, "config": {"name": config}, "implementations": [
            entry("cudnn-bf16", 13.0), entry("auto-bf16", 10.0 if config == "large" else 9.0),      # 1.3x, 1.44x
            entry("cudnn-fp32", 30.0), entry("auto-fp32x3", 14.0, error_ratio=2.5 if cell == "gru" else 1.0)]}
        for cell in ("lstm", "gru") for config in ("large", "blogA")])
    train = write(tmp_path / "train-1.json", [
        {"preset": cell, "config": "mid", "implementations": [entry("cudnn-bf16", 20.0),
                                                              entry("engine-fused-bf16", 8.0, status="failed")]}
        for cell in ("lstm", "gru")])
    rows = t.rows_of([bench, train])
    by_text = {v["target"]: v for v in (t.verdict(target, rows) for target in t.TARGETS)}
    big = by_text["bf16: at least 1.3x cuDNN bf16 at large and blogA"]
    assert big["state"] == "met" and abs(big["smallest"] - 1.3) < 1e-12 and len(big["ratios"]) == 4
    every = by_text["bf16: no anchor below 1.0x cuDNN bf16"]
    assert every["state"] == "not measured" and any("lstm lat: auto-bf16 not run" in m for m in every["missing"])
    x3 = by_text["float32x3: at least 2x cuDNN fp32 (TF32 off) at large and blogA, error within 2x cuDNN's"]
    assert x3["smallest"] > 2 and x3["state"] == "not met" and x3["errors"]["gru large"] == 2.5    # the error fails
    trained = by_text["training step in bf16 at mid: at least 1.5x cuDNN bf16"]
    assert trained["state"] == "not measured" and "failed: boom" in trained["missing"][0]
    text = t.table(list(by_text.values()), t.device_of([bench]))
    assert text.startswith("Issue #34's targets on NVIDIA H100 80GB HBM3 (cuDNN 91900, torch 2.11)")
    assert "| bf16: at least 1.3x cuDNN bf16 at large and blogA | 1.30x |" in text and "**met**" in text
    assert "(err 2.50x)" in text and "**not met**" in text


def test_slower_than_the_threshold_is_not_met(tmp_path):
    t = script()
    bench = write(tmp_path / "bench-2.json", [
        {"preset": "lstm", "config": {"name": t.FLASHRNN_CONFIG}, "implementations": [
            entry("flashrnn-bf16", 4.2), entry("auto-bf16", 3.6), entry("flashrnn-fp32", 5.3), entry("auto", 6.7)]}])
    rows = t.rows_of([bench])
    bf16, fp32 = (t.verdict(target, rows) for target in t.TARGETS if target.configs == (t.FLASHRNN_CONFIG,))
    assert bf16["state"] == "not met" and abs(bf16["smallest"] - 4.2 / 3.6) < 1e-12
    assert fp32["state"] == "not met" and fp32["smallest"] < 1


def test_the_parts_name_what_the_harness_takes():
    t = script()
    flashrnn = t.PARTS["flashrnn"]
    (config,) = parse_configs([flashrnn[flashrnn.index("-c") + 1]])
    assert config.name == t.FLASHRNN_CONFIG and (config.input_size, config.hidden_size, config.num_layers,
                                                 config.steps, config.batch) == (512, 512, 1, 1024, 16)
    named = {row for part in t.PARTS.values() for flag, row in zip(part, part[1:]) if flag == "--impl"}
    needed = {target.engine for target in t.TARGETS if target.kind == "bench"} | {
        target.baseline for target in t.TARGETS if target.kind == "bench"}
    assert needed <= named, needed - named
    assert "fused-bf16" in t.PARTS["train"] and "--train" in t.PARTS["train"]      # engine-fused-bf16's name there
    assert set(parse_configs([c for part in t.PARTS.values() for f, c in zip(part, part[1:])
                              if f == "-c" and not c.endswith(".json")])) >= set(parse_configs(list(t.ANCHORS)))
