"""A training step (forward and backward) of a cell against cuDNN's, each checked before it is timed (issue #13).

    results = bench_training(["lstm", "gru"], ["blogB", "mid"])        # on the GPU; python -m engine bench --train
    print(training_table(results))

Per cell and configuration every implementation gets the same seeded parameters, the same random inputs (rotated
among a few buffers) and the same loss, sum(outputs * w) with a fixed random w, so its gradients are those of
sum(outputs * w): d_outputs = w. Before timing, each one's gradients of x and of every parameter are compared with
a float64 reference (engine.bptt in float64; through CuPy on the GPU): the norm-relative error of each, the largest
reported, and a row whose error is over TOLERANCE is marked "wrong" and not timed. Then the median of CUDA-event
timed steps after warm-up. Rows:
- cudnn-fp32: torch.nn.LSTM / GRU / RNN with TF32 off, its autograd (cuDNN's backward on the GPU);
- engine-fused: the generated training step (bptt backend "fused", engine/autodiff/fused_tape.py): cuBLAS GEMMs and
  generated kernels a step, the weight gradients as one GEMM over every step, fp32;
- engine-naive: engine.autodiff.record + Tape.backward through CuPy (bptt backend "naive"), fp32;
- engine-reference (CPU tests of the harness only): the same on the NumPy reference.
Reduced precision (engine/codegen/precision.py), a pair of rows a mode:
- cudnn-tf32: the same fp32 module with torch's TF32 switches on; cudnn-bf16, cudnn-fp16: the module, its inputs and
  the loss's w in that dtype (no autocast: cuDNN's own bf16 / fp16 RNN);
- engine-fused-tf32, -bf16, -fp16: the fused step with precision=<mode> (fp32 buffers and master weights, the GEMMs'
  operands rounded to the mode on tensor cores, fp32 accumulation).
Their gradient error against float64 is reported as the fp32 rows' is, with no tolerance (the mode's error is the
measurement): such a row is "wrong" and not timed only where a gradient is NaN or Inf. speedup_vs_cudnn_same_mode
compares it with the cuDNN row of its mode.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .. import backends
from ..autodiff import bptt, record
from ..errors import BackendError
from ..gallery import Preset
from ..gallery import get as get_preset
from ..network import Network
from ..params import Params, init_params
from ..torch_layout import from_torch_state_dict, to_torch_state_dict
from .configs import BenchConfig, parse_configs
from .implementation import tf32_flags
from .results import read_document, readable_documents, results_filename, save_results
from .runner import environment
from .timing import TIMERS, time_runs

SCHEMA = "cellforge/train-bench"
TOLERANCE = 1e-3                 # norm-relative error of a gradient against float64; fp32 runs land near 1e-6
REDUCED = ("tf32", "bf16", "fp16")   # the reduced modes' short names (engine/codegen/precision.py), a row pair each


@dataclass
class TrainCase:
    name: str
    preset: Preset | None
    config: BenchConfig
    network: Network
    params: Params                 # float64 NumPy, seeded
    inputs: list                   # (T, B, I) arrays of the case's array module, float32, random normal
    weights: object                # w: (T, B, output size), float32, random normal
    xp: object
    device: str                    # "cuda", or "cpu" in CPU tests


def _grad_list(network: Network, layers) -> list:
    """A gradient per parameter, in the cell's parameter order, layer by layer."""
    return [layers[l][p.name] for l in range(network.num_layers) for p in network.cell.params]


class EngineTrain:
    """The engine's record + backward, fp32: "fused" or "naive" (the GPU), or "reference" (NumPy, CPU tests); the
    fused step in a reduced mode too (precision: a short name of REDUCED)."""

    def __init__(self, backend: str = "naive", precision: str = "fp32"):
        self.backend, self.precision = backend, precision
        self.name = f"engine-{backend}" + ("" if precision == "fp32" else f"-{precision}")
        self.tolerance = TOLERANCE if precision == "fp32" else None
        self.gpu = backend != "reference"
        self.timer = "cupy" if self.gpu else "wall"

    def context(self):
        return contextlib.nullcontext()

    def unavailable_reason(self, case: TrainCase) -> str | None:
        if (case.device == "cuda") != self.gpu:
            return f"{self.name} runs on {'the GPU' if self.gpu else 'the CPU'} only"
        return None

    def setup(self, case: TrainCase) -> None:
        self.case = case
        self.params = Params([{k: case.xp.asarray(v, dtype=case.xp.float32) for k, v in layer.items()}
                              for layer in case.params.layers])

    def step(self, k: int):
        """One training step on input buffer k: (d x, the parameters' gradients in the cell's order)."""
        case = self.case
        grads = record(case.network, self.params, case.inputs[k], dtype=np.float32, backend=self.backend,
                       precision=self.precision).backward(case.weights)
        return grads.x, _grad_list(case.network, grads.params)

    def teardown(self) -> None:
        self.case = self.params = None


class CudnnTrain:
    """torch.nn.LSTM / GRU / RNN in fp32 with TF32 off, forward and autograd backward; or in a reduced mode
    (precision: "tf32", the TF32 switches on; "bf16" / "fp16", the module, inputs and w in that dtype)."""

    timer = "torch"

    def __init__(self, precision: str = "fp32"):
        self.precision, self.name = precision, f"cudnn-{precision}"
        self.tolerance = TOLERANCE if precision == "fp32" else None

    def unavailable_reason(self, case: TrainCase) -> str | None:
        if case.device != "cuda":
            return "cuDNN runs on a CUDA GPU"
        if case.preset is None or not case.preset.cudnn or case.preset.torch is None:
            return f"cell '{case.name}' has no cuDNN equivalent"
        try:
            import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        except ImportError as e:
            return f"torch is not importable ({e})"
        if not torch.cuda.is_available() or not torch.backends.cudnn.is_available():
            return "torch sees no CUDA device or was built without cuDNN"
        return None

    def context(self):
        return tf32_flags(self.precision == "tf32")

    def torch_dtype(self):
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision, torch.float32)

    def setup(self, case: TrainCase) -> None:
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        layout, network = case.preset.torch, case.network
        kwargs = {"nonlinearity": layout.nonlinearity} if layout.module == "RNN" else {}
        module = getattr(torch.nn, layout.module)(network.input_size, network.hidden_size, network.num_layers,
                                                  **kwargs)
        state = to_torch_state_dict(network, case.params, layout)
        module.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in state.items()})
        dtype = self.torch_dtype()
        self.module = module.cuda().to(dtype)
        self.module.flatten_parameters()
        self.inputs = [torch.from_dlpack(x).to(dtype) for x in case.inputs]
        self.weights = torch.from_dlpack(case.weights).to(dtype)
        self.case, self.layout, self.to_engine = case, layout, from_torch_state_dict

    def step(self, k: int):
        self.module.zero_grad(set_to_none=True)
        x = self.inputs[k].detach().requires_grad_()
        out, _ = self.module(x)
        (out * self.weights).sum().backward()
        return x.grad, self.module

    def gradients(self, value):
        """(d x, the parameters' gradients in the cell's order) from step()'s value, as float64 NumPy."""
        dx, module = value
        grads = {name: p.grad.detach().double().cpu().numpy() for name, p in module.named_parameters()}
        layers = self.to_engine(self.case.network, grads, self.layout)
        return dx.detach().double().cpu().numpy(), _grad_list(self.case.network, layers.layers)

    def teardown(self) -> None:
        self.module = self.inputs = self.weights = None


def _host64(value) -> np.ndarray:
    return np.asarray(value.get() if hasattr(value, "get") else value, dtype=np.float64)


def relative(got, want) -> float:
    got, want = _host64(got), _host64(want)
    return float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30))


def measure(impl, case: TrainCase, reference: tuple, *, reps: int, warmup: int) -> dict:
    """Check impl's gradients against the reference (d x, parameter gradients), then time its steps."""
    entry = {"name": impl.name, "status": "ok", "reason": None}
    reason = impl.unavailable_reason(case)
    if reason:
        return {**entry, "status": "unavailable", "reason": reason}
    try:
        with impl.context():
            return _check_and_time(impl, case, reference, entry, reps=reps, warmup=warmup)
    except Exception as e:  # noqa: BLE001 - one implementation's failure is reported, the others still run
        return {**entry, "status": "failed", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    finally:
        impl.teardown()


def _check_and_time(impl, case: TrainCase, reference: tuple, entry: dict, *, reps: int, warmup: int) -> dict:
    impl.setup(case)
    value = impl.step(0)
    dx, params = impl.gradients(value) if hasattr(impl, "gradients") else value
    errors = [relative(dx, reference[0])] + [relative(g, r) for g, r in zip(params, reference[1])]
    tolerance = getattr(impl, "tolerance", TOLERANCE)      # None: a reduced mode's row, whose error is reported
    entry["error"] = {"x": errors[0], "params_max": max(errors[1:], default=0.0), "tolerance": tolerance}
    if not all(np.isfinite(errors)):
        return {**entry, "status": "wrong", "reason": "a gradient is NaN or Inf"}
    if tolerance is not None and max(errors) > tolerance:
        return {**entry, "status": "wrong",
                "reason": f"gradients differ from the float64 reference by {max(errors):.3g} (> {tolerance})"}
    timing = time_runs(lambda k: impl.step(k), TIMERS[impl.timer], buffers=len(case.inputs), warmup=warmup, reps=reps)
    return {**entry, **timing.to_dict()}


def make_case(name: str, preset: Preset | None, cell, config: BenchConfig, *, xp, device: str, seed: int = 0,
              buffers: int = 3) -> TrainCase:
    network = Network(cell, config.input_size, config.hidden_size, config.num_layers)
    rng = np.random.default_rng(seed)
    T, B = config.steps, config.batch
    inputs = [xp.asarray(rng.standard_normal((T, B, config.input_size)), dtype=xp.float32) for _ in range(buffers)]
    weights = xp.asarray(rng.standard_normal((T, B, network.output_size)), dtype=xp.float32)
    return TrainCase(name, preset, config, network, init_params(network, seed=seed), inputs, weights, xp, device)


def reference_gradients(case: TrainCase) -> tuple:
    """float64 gradients of sum(outputs * w) on input buffer 0: (d x, parameter gradients in the cell's order)."""
    backend = "naive" if case.device == "cuda" else "reference"
    xp = case.xp
    grads = bptt(case.network, case.params, xp.asarray(case.inputs[0], dtype=xp.float64),
                 d_outputs=xp.asarray(case.weights, dtype=xp.float64), backend=backend)
    return grads.x, _grad_list(case.network, grads.params)


TRAIN_IMPLS = {"cudnn-fp32": CudnnTrain, "engine-fused": lambda: EngineTrain("fused"),
               "engine-naive": lambda: EngineTrain("naive"), "engine-reference": lambda: EngineTrain("reference")}
for _mode in REDUCED:
    TRAIN_IMPLS[f"cudnn-{_mode}"] = lambda mode=_mode: CudnnTrain(mode)
    TRAIN_IMPLS[f"engine-fused-{_mode}"] = lambda mode=_mode: EngineTrain("fused", mode)


def _mode_of(name: str) -> str:
    """The precision mode a row's name ends in (fp32 where none)."""
    tail = name.rsplit("-", 1)[-1]
    return tail if tail in REDUCED else "fp32"


def training_implementations(chosen, device: str) -> list:
    """The rows: `chosen` implementations or their names (e.g. "cudnn-fp32", "fused"), else every one the device
    runs. BackendError naming an unknown one."""
    if not chosen:
        if device != "cuda":
            return [EngineTrain("reference")]
        return [CudnnTrain(), EngineTrain("fused"), EngineTrain("naive")] + [
            impl for mode in REDUCED for impl in (CudnnTrain(mode), EngineTrain("fused", mode))]
    return [item if not isinstance(item, str) else TRAIN_IMPLS[training_key(item)]() for item in chosen]


def training_key(item: str) -> str:
    """The TRAIN_IMPLS key of an --impl name ("cudnn", "fused-bf16", "engine-fused", ...); BackendError naming an
    unknown one (no GPU needed: `python -m engine bench --train` checks its names first)."""
    key = item if item in TRAIN_IMPLS else {"cudnn": "cudnn-fp32"}.get(item, f"engine-{item}")
    if key not in TRAIN_IMPLS:
        raise BackendError(f"--impl {item}: not a training-step implementation; hint: one of " + ", ".join(TRAIN_IMPLS))
    return key


def bench_training(presets=("lstm",), configs=None, *, implementations=None, reps: int = 5, warmup: int = 1,
                   seed: int = 0, device: str | None = None, out_dir: str | Path | None = None) -> dict:
    """Every implementation's training step for every cell x configuration; the results document (saved as
    train-<date>-<device>.json in out_dir when given)."""
    configs = parse_configs(configs or ["blogB"])
    if device is None:
        ok, why = backends.gpu_status()
        if not ok:
            raise BackendError(f"the training benchmark needs a CUDA GPU: {why}; hint: run it on a GPU machine")
        device = "cuda"
    if device == "cuda":
        import cupy as xp  # deferred: CuPy is optional (no GPU in CI)
        env = environment()
    else:
        xp, env = np, {"device": "cpu"}
    impls = training_implementations(implementations, device)
    results = {"schema": SCHEMA, "created": datetime.now(timezone.utc).isoformat(), "environment": env,
               "settings": {"reps": reps, "warmup": warmup, "seed": seed, "loss": "sum(outputs * w), w random normal",
                            "precision": "fp32, TF32 off", "tolerance": TOLERANCE,
                            "reduced_precision": "rows -tf32, -bf16, -fp16: cuDNN in that mode (TF32 switches on; "
                                                 "module and inputs in bf16 / fp16), the fused step with precision="
                                                 "<mode>; error reported, not held to the tolerance"}, "cells": []}
    for value in presets:
        preset = get_preset(value) if isinstance(value, str) else (value if isinstance(value, Preset) else None)
        cell = preset.cell if preset is not None else value
        for config in configs:
            started = time.perf_counter()
            case = make_case(cell.name, preset, cell, config, xp=xp, device=device, seed=seed)
            reference = reference_gradients(case)
            rows = [measure(impl, case, reference, reps=reps, warmup=warmup) for impl in impls]
            base = next((r.get("median_ms") for r in rows if r["name"] == "cudnn-fp32" and r["status"] == "ok"), None)
            for r in rows:
                if base and r.get("median_ms"):
                    r["speedup_vs_cudnn_fp32"] = base / r["median_ms"]
                same = next((c.get("median_ms") for c in rows if c["name"] == f"cudnn-{_mode_of(r['name'])}"
                             and c["status"] == "ok"), None) if _mode_of(r["name"]) in REDUCED else None
                if same and r.get("median_ms"):
                    r["speedup_vs_cudnn_same_mode"] = same / r["median_ms"]
            results["cells"].append({"preset": cell.name, "config": config.name,
                                     "sizes": [config.input_size, config.hidden_size, config.num_layers,
                                               config.steps, config.batch],
                                     "implementations": rows, "seconds": time.perf_counter() - started})
    if out_dir is not None:
        path = Path(out_dir) / results_filename(results, kind="train")
        results["saved_to"] = [str(save_results(results, path))]
    return results


def training_table(results: dict) -> str:
    """Markdown: one row per cell x configuration, a column per implementation (median ms, speedup over cuDNN)."""
    names = list(dict.fromkeys(r["name"] for c in results["cells"] for r in c["implementations"]))
    lines = ["| cell | config | I,H,L,T,B | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for c in results["cells"]:
        cells = []
        for name in names:
            r = next((r for r in c["implementations"] if r["name"] == name), None)
            if r is None or r["status"] != "ok":
                cells.append(r["status"] if r else "-")
            else:
                ratio, same = r.get("speedup_vs_cudnn_fp32"), r.get("speedup_vs_cudnn_same_mode")
                cells.append(f"{r['median_ms']:.3g}" + (f" ({ratio:.3f}x)" if ratio else "")
                             + (f" [{same:.3f}x]" if same else ""))
        lines.append(f"| {c['preset']} | {c['config']} | {','.join(map(str, c['sizes']))} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\nMedian ms of a training step (forward + backward of sum(outputs * w)), fp32, TF32 "
                               "off; (Nx) = cuDNN fp32's time / this one. Rows -tf32, -bf16, -fp16: that mode; "
                               "[Nx] = cuDNN's time in the same mode / this one.")


# ---- saved results (the app's Benchmarks page reads them) --------------------------------------------------------

def load_training_results(path: str | Path) -> dict:
    """A training-step results document (train-*.json), checked for its schema; BackendError naming the file."""
    return read_document(path, SCHEMA, "training results file", "a training-step result")


def list_training_results(directory: str | Path | None = None) -> list[dict]:
    """Every readable train-*.json in `directory` (default benchmarks/results/), newest first: [{"path",
    "created", "device"}]; unreadable ones are skipped."""
    found = [{"path": str(path), "created": data.get("created", ""),
              "device": data.get("environment", {}).get("device")}
             for path, data in readable_documents("train-*.json", load_training_results, directory)]
    return sorted(found, key=lambda r: r["created"], reverse=True)


def training_rows(results: dict) -> list[dict]:
    """One row per cell x configuration x implementation: the table of the Benchmarks page."""
    rows = []
    for c in results.get("cells", []):
        for r in c.get("implementations", []):
            error = r.get("error") or {}
            rows.append({"cell": c.get("preset"), "config": c.get("config"),
                         "I,H,L,T,B": ",".join(map(str, c.get("sizes", []))), "implementation": r.get("name"),
                         "status": r.get("status"), "median ms": r.get("median_ms"),
                         "speedup vs cuDNN fp32": r.get("speedup_vs_cudnn_fp32"),
                         "speedup vs cuDNN same mode": r.get("speedup_vs_cudnn_same_mode"),
                         "max gradient error": max([v for k, v in error.items() if k != "tolerance"
                                                    and isinstance(v, (int, float))], default=None),
                         "reason": r.get("reason")})
    return rows
