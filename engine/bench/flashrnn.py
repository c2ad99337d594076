"""FlashRNN (NX-AI; `pip install flashrnn`, optional like torch) as a baseline of the benchmark (issue #34, item 4):
its LSTM, GRU and sLSTM in fp32, fp16 and bf16, rows flashrnn-fp32, flashrnn-fp16 and flashrnn-bf16.

FlashRNN runs one layer a call on the input projection Wx (B, T, gates, heads, head size), which it leaves to the
caller: each layer's projection is a torch matmul inside the timed forward, as a FlashRNN user runs it. A deeper
network stacks the calls. On the GPU the rows run its `cuda_fused` backend (FlashRNN itself switches the GRU to its
`cuda` kernels: its recurrent gates do not divide 8); its `vanilla` backend (PyTorch ops) runs in the CPU tests,
where the same weights give the engine reference's outputs.

The weights of each cell in FlashRNN's gate order are data (LAYOUTS): FlashRNN's LSTM keeps one bias a gate (the
sum of torch's two), and its GRU orders the recurrent gates (n, r, z), the input gates (r, z, n) and the biases
(the recurrent n's, r, z, the input n's).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from .implementation import (
    Case,
    CompileBudget,
    TorchImplementation,
    check_precision,
    short_reason,
    torch_device_reason,
    torch_or_reason,
)

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}    # the modes FlashRNN has (no tf32)


@dataclass(frozen=True)
class FlashLayout:
    function: str                       # FlashRNN's name of the cell
    input_gates: tuple[str, ...]        # the engine's input weights, in FlashRNN's order of Wx's gates
    recurrent_gates: tuple[str, ...]    # the engine's recurrent weights, in the order of R's gates
    biases: tuple[tuple[str, ...], ...]  # each of FlashRNN's biases: the sum of these engine biases


LAYOUTS = {
    "lstm": FlashLayout("lstm", ("W_ii", "W_if", "W_ig", "W_io"), ("W_hi", "W_hf", "W_hg", "W_ho"),
                        (("b_ii", "b_hi"), ("b_if", "b_hf"), ("b_ig", "b_hg"), ("b_io", "b_ho"))),
    "gru": FlashLayout("gru", ("W_ir", "W_iz", "W_in"), ("W_hn", "W_hr", "W_hz"),
                       (("b_hn",), ("b_ir", "b_hr"), ("b_iz", "b_hz"), ("b_in",))),
    "slstm": FlashLayout("slstm", ("W_i", "W_f", "W_z", "W_o"), ("R_i", "R_f", "R_z", "R_o"),
                         (("b_i",), ("b_f",), ("b_z",), ("b_o",))),
}


def flashrnn_or_reason():
    """(FlashRNN's flashrnn function, None) or (None, why not). $FLASHRNN_PATH: a folder it was installed into with
    pip --target (benchmarks/flashrnn_setup.sh)."""
    if os.environ.get("FLASHRNN_PATH") and os.environ["FLASHRNN_PATH"] not in sys.path:
        sys.path.insert(0, os.environ["FLASHRNN_PATH"])
    try:
        from flashrnn import flashrnn  # deferred: FlashRNN is an optional baseline
    except Exception as e:
        return None, f"FlashRNN is not importable ({short_reason(e)}); hint: pip install flashrnn==1.0.8"
    return flashrnn, None


def layer_weights(layout: FlashLayout, layer: dict, hidden_size: int, heads: int) -> tuple:
    """One layer's engine parameters as FlashRNN's: W (gates x H, I) for the input projection, R (gates, heads,
    D, D) with D = H / heads, b (gates, heads, D); float64 NumPy."""
    D = hidden_size // heads
    W = np.concatenate([layer[name] for name in layout.input_gates])
    R = np.stack([np.asarray(layer[name]).reshape(heads, D, D) for name in layout.recurrent_gates])
    b = np.stack([sum(np.asarray(layer[name]) for name in names).reshape(heads, D) for names in layout.biases])
    return W, R, b


class FlashRNN(TorchImplementation):
    family = "flashrnn"

    def __init__(self, precision: str, backend: str = "cuda_fused", timer: str = "torch",
                 budget: CompileBudget | None = None):
        super().__init__()
        self.precision, self.backend, self.timer = check_precision(precision), backend, timer
        self.name = f"flashrnn-{precision}"
        self.budget = budget        # its first call builds its kernels (about a minute a size and dtype on an H200)

    def unavailable_reason(self, case: Case) -> str | None:
        torch, reason = torch_or_reason()
        if reason:
            return reason
        if case.preset is None or case.name not in LAYOUTS:
            return f"FlashRNN has no '{case.name}' (it has {', '.join(LAYOUTS)})"
        if self.precision not in DTYPES:
            return f"FlashRNN has no {self.precision} mode (it has {', '.join(DTYPES)})"
        reason = torch_device_reason(torch, case)
        if reason:
            return reason
        if case.device == "cpu" and self.backend != "vanilla":
            return f"FlashRNN's '{self.backend}' kernels need a GPU (its 'vanilla' backend runs on the CPU)"
        if self.budget is not None and self.backend != "vanilla" and (spent := self.budget.spent_reason()):
            return spent
        return flashrnn_or_reason()[1]

    def after_first_call(self, seconds: float) -> None:
        if self.budget is None or self.backend == "vanilla":
            return
        self.detail["first_call_s"] = seconds
        self.budget.charge(seconds, "building FlashRNN's kernels")

    def setup(self, case: Case) -> None:
        import torch  # deferred: torch is optional (the cuDNN, torch and FlashRNN baselines)
        self.flashrnn = flashrnn_or_reason()[0]
        self.layout = LAYOUTS[case.name]
        network = case.network
        weight = network.cell[self.layout.recurrent_gates[0]]
        self.heads = int(weight.attr("heads", 1) or 1)
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.precision]
        device = dict(device=case.device, dtype=dtype)
        self.layers = []
        for layer in range(network.num_layers):
            W, R, b = layer_weights(self.layout, case.params[layer], network.hidden_size, self.heads)
            self.layers.append(tuple(torch.tensor(a, **device) for a in (W, R, b)))
        self.inputs = [x.to(dtype) for x in case.torch_inputs()]
        self.hidden_size = network.hidden_size
        self.detail.update({"function": self.layout.function, "backend": self.backend, "dtype": DTYPES[self.precision],
                            "input_projection": "torch matmul, timed"})

    def forward(self, k: int, poison: bool = False):
        import torch  # deferred: torch is optional (the cuDNN, torch and FlashRNN baselines)
        x = self.inputs[k].transpose(0, 1)                                  # (B, T, I): FlashRNN is batch first
        B, T = x.shape[:2]
        D = self.hidden_size // self.heads
        with torch.no_grad():
            for W, R, b in self.layers:
                wx = (x @ W.T).reshape(B, T, len(self.layout.input_gates), self.heads, D)
                states, _ = self.flashrnn(wx, R, b, states=None, function=self.layout.function,
                                          backend=self.backend, dtype=DTYPES[self.precision])
                x = states[0].reshape(B, T, self.hidden_size)               # state 0 is h
        return x.transpose(0, 1)                                            # (T, B, H)

    def teardown(self) -> None:
        self.layers = self.inputs = self.flashrnn = None
