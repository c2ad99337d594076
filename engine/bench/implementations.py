"""The implementations a benchmark times side by side, each behind one small interface.

    unavailable_reason(case) -> str | None   checked first; a reason is reported, never raised
    context()                                the TF32 flags it runs under, set and restored
    setup(case)                              parameters onto the device (counted in its peak memory)
    forward(k, poison=False)                 one run on input buffer k; returns the output (T, B, H)
    output(value, xp)                        that output as an xp float64 array
    teardown()                               drop everything it allocated

Families: "engine" (the engine's GPU backends naive, fused, graph and persistent, through
backend.prepare(...).run(x) when the backend has prepare, else backend.run; and "auto", the
autotuner's choice, each its own row; the schedules and auto also in the reduced precisions, rows
graph-tf32, persistent-fp16, auto-bf16, ...), "cudnn" (torch.nn.LSTM/GRU/RNN in the same four modes),
"torch" (the cell graph in torch ops: eager, torch.compile, TorchScript), "flashrnn" (FlashRNN's LSTM, GRU and
sLSTM, engine/bench/flashrnn.py). torch is imported only when used.

Precision modes by their short names: fp32 (strict IEEE, TF32 off), tf32, fp16, bf16, fp32x3. An engine row in
mode m passes precision=SHORT_NAMES[m] ("float32", "tf32", "float16", "bfloat16", "float32x3") to the engine; a
cuDNN row runs torch.nn in that mode. Both round the matmul operands and accumulate in fp32. fp32x3 (3xTF32: fp32
accuracy on tensor cores) has no cuDNN mode: fused-fp32x3, graph-fp32x3 and persistent-fp32x3 run the engine in
it, auto-fp32x3 is engine.run's opt-in (precision float32, allow_tensor_core_fp32=True), and each is compared with
cudnn-fp32 (TF32 off), its error too (runner.add_derived: "error_vs_cudnn_bound", the issue's 2x bound).
"""
from __future__ import annotations

import importlib.util
import inspect
import os

import numpy as np

from .. import backends
from ..codegen.precision import SHORT_NAMES
from ..compiler import compile_program
from ..errors import BackendError
from ..passes.scan import analyse_scan
from ..schedules import autotune, fused_modes
from ..schedules.tiling import eligibility
from ..torch_layout import to_torch_state_dict
from .flashrnn import FlashRNN
from .implementation import (
    CUDNN_PRECISIONS,
    PRECISIONS,
    Case,
    CompileBudget,
    Implementation,
    TorchImplementation,
    check_precision,
    row_name,
    short_reason,
    torch_device_reason,
    torch_or_reason,
)
from .torch_cell import layer_function, run_network, torch_params

# ---- the engine's backends -----------------------------------------------------------------------

class EngineBackend(Implementation):
    family = "engine"

    def __init__(self, backend: str, timer: str = "cupy", precision: str = "fp32"):
        super().__init__()
        self.backend, self.timer = backend, timer
        self.precision = check_precision(precision)
        self.name = row_name(backend, precision)
        self.tf32 = precision == "tf32"

    def precision_options(self) -> dict:
        """The engine's precision argument. fp32 rows pass none, so they call every backend exactly as
        before the modes existed (naive computes in strict float32 only; fused's modes are fused_modes')."""
        return {} if self.precision == "fp32" else {"precision": SHORT_NAMES[self.precision]}

    def unavailable_reason(self, case: Case) -> str | None:
        if self.backend not in backends.BACKENDS:
            return f"backend '{self.backend}' is not registered in engine.backends.BACKENDS"
        try:
            self.module = backends.get(self.backend)
        except Exception as e:
            return f"backend '{self.backend}' does not import ({short_reason(e)})"
        if self.backend == "fused" and self.precision != "fp32":      # the fused backend's modes
            if SHORT_NAMES[self.precision] not in fused_modes.MODES:
                return f"backend 'fused' runs {', '.join(fused_modes.MODES)} beside float32, not {self.precision}"
            self.module = fused_modes
        if self.backend in ("graph", "persistent"):        # cells the wavefront tiling does not take (e.g. LSTMP)
            why = eligibility(compile_program(case.cell, layout="interleaved"))
            if why:
                return f"schedule '{self.backend}' cannot run cell '{case.cell.name}': {why}"
        if self.backend == "scan":
            found = analyse_scan(case.cell)
            if not found.qualifies:
                return f"schedule 'scan' cannot run cell '{case.cell.name}': {found.reason}"
        if self.backend == "naive" and case.cell.uses_projection:
            return (f"backend 'naive' keeps every state H wide and does not take cell '{case.cell.name}' (values of "
                    "size P); the fused backend does")
        return None

    def flags(self) -> dict:
        return {"CUPY_TF32": os.environ.get("CUPY_TF32", "0")}

    def setup(self, case: Case) -> None:
        self.inputs = case.inputs
        prepare = getattr(self.module, "prepare", None)
        options = self.precision_options()
        if options:
            self.detail["precision"] = options["precision"]
        if prepare is not None:
            self.program = prepare(case.network, case.params, dtype=np.float32, **options)
            run = self.program.run
            self.takes_poison = "poison" in inspect.signature(run).parameters
            self.detail["interface"] = "prepare(network, params).run(x): parameters uploaded once"
            self._run = run
        else:
            network, params, module = case.network, case.params, self.module
            self.takes_poison = "poison" in inspect.signature(module.run).parameters
            self.detail["interface"] = ("run(network, params, x): the backend has no prepare(), so every "
                                        "timed run includes its set-up (parameter upload, planning)")
            self._run = lambda x, **poison: module.run(network, params, x, dtype=np.float32, **options, **poison)
        self.detail["poisoned"] = self.takes_poison

    def forward(self, k: int, poison: bool = False):
        if poison and self.takes_poison:
            return self._run(self.inputs[k], poison=True).outputs
        return self._run(self.inputs[k]).outputs

    def teardown(self) -> None:
        replayed = getattr(self.program, "replayed", None)
        if isinstance(replayed, str):          # whether the timed runs were CUDA-graph replays, and why not
            self.detail["replayed"] = replayed
        product = getattr(self.program, "product", None)
        if callable(product):                  # the fused modes: whose step products ran (cuBLAS, the wgmma kernels)
            self.detail["step_product"] = product()
            if getattr(self.program, "precision", None) == "float32x3":
                self.detail["x3_parts"] = self.program.x3_parts        # after any fallback: the parts that ran
            if getattr(self.program, "precision", None) == "tf32":
                self.detail["tf32_storage"] = self.program.tf32_storage    # after any fallback: what ran
        self.program = self._run = self.inputs = None


class AutoSchedule(EngineBackend):
    """backend='auto': the autotuner's choice for this cell and sizes, as its own row. The choice is made in
    setup (tuned on this GPU, or read from the autotuner's cache), so it counts in the first call, not in
    the timed runs; the row's detail says which schedule and tiling it picked, and why."""

    def __init__(self, timer: str = "cupy", precision: str = "fp32"):
        super().__init__("auto", timer, precision)

    def unavailable_reason(self, case: Case) -> str | None:
        ok, why = backends.gpu_status()
        return None if ok else f"backend 'auto' tunes on a GPU: {why}"

    def setup(self, case: Case) -> None:
        self.inputs = case.inputs
        options = self.precision_options()
        # auto-fp32x3 is the opt-in of engine.run: precision float32 with float32x3 candidates allowed
        tuned = {"allow_tensor_core_fp32": True} if self.precision == "fp32x3" else options
        choice = autotune.tune(case.network, case.params, case.config.steps, case.config.batch, **tuned)
        self.detail.update(schedule=choice.schedule, why=choice.why, cached=choice.cached,
                           config=None if choice.config is None else choice.config.label(), **options)
        if self.precision == "fp32x3":
            self.detail["precision"] = choice.precision or "float32"      # the mode the choice runs in
        self.program = autotune.prepare(choice.candidate, case.network, case.params,
                                        **({} if self.precision == "fp32x3" else options))
        self._run = self.program.run
        self.takes_poison = "poison" in inspect.signature(self._run).parameters
        self.detail["interface"] = "autotune.tune(...), then prepare(network, params).run(x) of its choice"
        self.detail["poisoned"] = self.takes_poison


# ---- cuDNN through torch.nn ---------------------------------------------------------------------------


class Cudnn(TorchImplementation):
    family = "cudnn"

    def __init__(self, precision: str, timer: str = "torch"):
        super().__init__()
        if precision not in CUDNN_PRECISIONS:
            raise ValueError(f"cuDNN has no precision {precision!r}; hint: one of {', '.join(CUDNN_PRECISIONS)}")
        self.precision, self.name, self.timer = check_precision(precision), f"cudnn-{precision}", timer
        self.tf32 = precision == "tf32"

    def unavailable_reason(self, case: Case) -> str | None:
        torch, reason = torch_or_reason()
        if reason:
            return reason
        if case.preset is None or not case.preset.cudnn or case.preset.torch is None:
            return f"cell '{case.name}' has no cuDNN equivalent (only lstm, gru and the Elman RNNs have one)"
        reason = torch_device_reason(torch, case)
        if reason:
            return reason
        if case.device == "cuda" and not torch.backends.cudnn.is_available():
            return f"torch {torch.__version__} was built without cuDNN"
        if self.precision == "bf16" and case.device == "cuda" and not torch.cuda.is_bf16_supported():
            return "this GPU does not support bfloat16"
        return None

    def setup(self, case: Case) -> None:
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        layout, network = case.preset.torch, case.network
        kwargs = dict(input_size=network.input_size, hidden_size=network.hidden_size,
                      num_layers=network.num_layers, bias=True, batch_first=False)
        if layout.module == "RNN":
            kwargs["nonlinearity"] = layout.nonlinearity
        module = getattr(torch.nn, layout.module)(**kwargs)
        state = to_torch_state_dict(network, case.params, layout)
        module.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in state.items()},
                               strict=True)
        dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                 "bf16": torch.bfloat16}[self.precision]
        module = module.to(device=case.device, dtype=dtype).eval()
        module.requires_grad_(False)
        if hasattr(module, "flatten_parameters"):
            module.flatten_parameters()
        self.module = module
        inputs = case.torch_inputs()
        self.inputs = inputs if dtype == torch.float32 else [x.to(dtype) for x in inputs]
        self.detail.update({"module": f"torch.nn.{layout.module}", "dtype": str(dtype).replace("torch.", ""),
                            "cudnn_mode": case.preset.cudnn})

    def forward(self, k: int, poison: bool = False):
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        with torch.no_grad():
            out, _ = self.module(self.inputs[k])
        return out

    def teardown(self) -> None:
        self.module = self.inputs = None


# ---- the cell graph in torch ops --------------------------------------------------------------------

TORCH_MODES = {"eager": "torch-eager", "compile": "torch.compile", "script": "torchscript"}


class TorchCell(TorchImplementation):
    family = "torch"

    def __init__(self, mode: str, budget: CompileBudget | None = None, timer: str = "torch",
                 compile_options: dict | None = None):
        super().__init__()
        self.mode, self.name, self.timer = mode, TORCH_MODES[mode], timer
        self.budget = budget
        self.compile_options = compile_options or {}
        if mode != "eager":
            self.group = "torch-compile"
            self.failure_status = "unavailable"

    def unavailable_reason(self, case: Case) -> str | None:
        torch, reason = torch_or_reason()
        if reason:
            return reason
        reason = torch_device_reason(torch, case)
        if reason:
            return reason
        if self.mode == "compile":
            if not hasattr(torch, "compile"):
                return f"torch {torch.__version__} has no torch.compile"
            backend = self.compile_options.get("backend", "inductor")
            if case.device == "cuda" and backend == "inductor" and importlib.util.find_spec("triton") is None:
                return "triton is not installed (torch.compile's inductor backend needs it on the GPU)"
        if self.mode == "script" and not hasattr(getattr(torch, "jit", None), "script"):
            return f"torch {torch.__version__} has no torch.jit.script"
        if self.budget is not None and self.mode != "eager":
            return self.budget.spent_reason()
        return None

    def setup(self, case: Case) -> None:
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        if self.mode == "compile":
            torch._dynamo.reset()           # a fresh cache: no recompile limits or memory from earlier cells
        self.layer_fn = layer_function(case.cell, self.mode, self.compile_options)
        self.network = case.network
        self.params = torch_params(case.network, case.params, case.device, torch.float32)
        self.inputs = case.torch_inputs()
        self.run_network = run_network
        if self.mode == "compile":
            self.detail["options"] = {"mode": "default", **self.compile_options}

    def forward(self, k: int, poison: bool = False):
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        with torch.no_grad():
            out, _ = self.run_network(self.layer_fn, self.network, self.params, self.inputs[k])
        return out

    def after_first_call(self, seconds: float) -> None:
        if self.mode == "eager" or self.budget is None:
            return
        self.detail["compile_s"] = seconds
        self.budget.charge(seconds, "compiling")

    def teardown(self) -> None:
        self.layer_fn = self.params = self.inputs = None
        if self.mode == "compile":
            import torch  # deferred: torch is optional (the cuDNN and torch baselines)
            torch._dynamo.reset()


def default_implementations(compile_budget_s: float) -> list[Implementation]:
    """In measuring order: cuDNN fp32 first (the others' divergence is also taken against it), the
    engine's fp32 rows, then per reduced precision cuDNN and the engine's schedules and auto in that
    mode (fused in every mode; naive is strict fp32 only). torch.compile and TorchScript each get the compile
    budget (TorchScript's is rarely touched). FlashRNN's rows last (engine/bench/flashrnn.py; reported unavailable
    where it is not installed or has no such cell)."""
    flash_budget = CompileBudget(compile_budget_s)       # FlashRNN builds its kernels at its first call
    gpu_backends = getattr(backends, "GPU_BACKENDS", tuple(b for b in backends.BACKENDS if b != "reference"))
    reduced = []
    for precision in PRECISIONS[1:]:
        schedules = [EngineBackend(name, precision=precision) for name in backends.PRECISION_BACKENDS]
        if SHORT_NAMES[precision] in fused_modes.MODES:
            schedules.insert(0, EngineBackend("fused", precision=precision))
        cudnn = [Cudnn(precision)] if precision in CUDNN_PRECISIONS else []
        reduced += [*cudnn, *schedules, AutoSchedule(precision=precision)]
    return [Cudnn("fp32"), *[EngineBackend(name) for name in gpu_backends], AutoSchedule(), *reduced,
            TorchCell("eager"), TorchCell("compile", CompileBudget(compile_budget_s)),
            TorchCell("script", CompileBudget(compile_budget_s)),
            *[FlashRNN(precision, budget=flash_budget) for precision in ("fp32", "bf16", "fp16")]]


def implementation_choices() -> list[str]:
    """Names accepted by run_bench(implementations=...)."""
    names = [i.name for i in default_implementations(0.0)]
    return names + ["torch-compile"]


def select(implementations: list[Implementation], names: list[str] | None) -> list[Implementation]:
    if not names:
        return implementations
    known = implementation_choices()
    for name in names:
        if name not in known:
            raise BackendError(f"unknown implementation '{name}'. hint: choose from {', '.join(known)}")
    return [i for i in implementations if i.name in names or (i.group is not None and i.group in names)]

