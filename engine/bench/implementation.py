"""What every implementation of the benchmark shares (engine/bench/implementations.py lists them): the interface,
the case they run, the precision modes' names, and the torch helpers (the TF32 switches, the reasons torch cannot
run). torch is imported only when used.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..gallery import Preset
from ..ir import CellGraph
from ..network import Network
from ..params import Params
from .configs import BenchConfig


class Unavailable(Exception):
    """An implementation cannot run here; the message says why."""


@dataclass
class Case:
    """One cell at one configuration, with what every implementation shares."""

    name: str                   # the preset's (or custom cell's) name
    cell: CellGraph
    preset: Preset | None       # None for a custom cell
    config: BenchConfig
    network: Network
    params: Params              # float64 NumPy, seeded
    inputs: list                # device arrays (T, B, I) float32, random normal, one per buffer
    xp: object                  # cupy (or numpy in CPU tests)
    device: str = "cuda"        # "cuda", or "cpu" in CPU tests of the harness
    _torch_inputs: list | None = field(default=None, repr=False)

    def torch_inputs(self) -> list:
        """The same input buffers as torch tensors, sharing memory (DLPack) on the GPU."""
        if self._torch_inputs is None:
            import torch  # deferred: torch is optional (the cuDNN and torch baselines)
            if self.device == "cpu":
                self._torch_inputs = [torch.from_numpy(np.asarray(x)) for x in self.inputs]
            else:
                self.xp.cuda.Device().synchronize()
                self._torch_inputs = [torch_view(torch, x) for x in self.inputs]
        return self._torch_inputs


def torch_view(torch, array):
    """A CuPy array as a torch tensor on the same memory: DLPack, else the CUDA array interface."""
    try:
        return torch.from_dlpack(array)
    except Exception:
        return torch.as_tensor(array, device="cuda")


def to_xp64(value, xp):
    """An output of any implementation (NumPy, CuPy or torch) as a float64 array of module xp."""
    if hasattr(value, "detach"):                         # a torch tensor
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        tensor = value.detach().to(torch.float64).contiguous()
        if tensor.is_cuda:
            torch.cuda.synchronize()
            if xp.__name__ == "numpy":
                return tensor.cpu().numpy()
            try:
                view = xp.from_dlpack(tensor)
            except Exception:
                view = xp.asarray(tensor)           # the CUDA array interface
            return xp.array(view, copy=True)
        return xp.asarray(tensor.numpy())
    if xp.__name__ == "numpy" and hasattr(value, "get"):  # a CuPy array into NumPy
        value = value.get()
    return xp.asarray(value, dtype=xp.float64)


def short_reason(error: BaseException, limit: int = 300) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= limit else line[:limit] + "..."


def torch_or_reason():
    """(torch, None) or (None, why it cannot be used)."""
    try:
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
    except Exception as e:
        return None, f"PyTorch is not importable ({short_reason(e)}); hint: pip install torch"
    return torch, None


def torch_device_reason(torch, case: Case) -> str | None:
    if case.device == "cuda" and not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda})"
    return None


@contextmanager
def tf32_flags(enabled: bool):
    """Set torch's two TF32 switches (cuBLAS matmul and cuDNN) and restore them afterwards."""
    torch, _ = torch_or_reason()
    if torch is None:
        yield
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def torch_tf32_state() -> dict:
    torch, _ = torch_or_reason()
    if torch is None:
        return {}
    return {"torch.backends.cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "torch.backends.cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32)}


class Implementation:
    name = ""
    family = ""
    precision = "fp32"
    tf32 = False
    timer = "cupy"              # which clock and memory probe: "cupy", "torch" or "wall" (CPU tests)
    group: str | None = None    # candidates of one group are reported as one row: the fastest
    failure_status = "failed"   # the status of an exception in setup or the first run

    def __init__(self):
        self.detail: dict = {}

    def unavailable_reason(self, case: Case) -> str | None:
        return None

    @contextmanager
    def context(self):
        yield

    def flags(self) -> dict:
        return {}

    def setup(self, case: Case) -> None:
        raise NotImplementedError

    def forward(self, k: int, poison: bool = False):
        raise NotImplementedError

    def output(self, value, xp):
        return to_xp64(value, xp)

    def after_first_call(self, seconds: float) -> None:
        """Raise Unavailable if the first call (which compiles, for some) took too long."""

    def teardown(self) -> None:
        pass


class TorchImplementation(Implementation):
    """A row that runs torch: its TF32 switches set (to self.tf32) around it, and recorded with its numbers."""
    timer = "torch"

    @contextmanager
    def context(self):
        with tf32_flags(self.tf32):
            yield

    def flags(self) -> dict:
        return torch_tf32_state()


# The precision modes, by the harness's short names, in the order their rows are measured.
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp32x3")
CUDNN_PRECISIONS = PRECISIONS[:4]        # fp32x3 (3xTF32) has no cuDNN mode: its rows compare with cudnn-fp32


def row_name(base: str, precision: str) -> str:
    """'persistent' in fp32 (the rows' names from before the modes), 'persistent-bf16' otherwise."""
    return base if precision == "fp32" else f"{base}-{precision}"


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


class CompileBudget:
    """Seconds the whole run may spend compiling (torch.compile, TorchScript, FlashRNN's kernels)."""

    def __init__(self, seconds: float):
        self.total = float(seconds)
        self.spent = 0.0

    @property
    def left(self) -> float:
        return self.total - self.spent

    def spent_reason(self) -> str | None:
        """Why a row that compiles cannot start, once the budget is gone; None while some is left."""
        return f"the run's compile budget ({self.total:g} s) is spent" if self.left <= 0 else None

    def charge(self, seconds: float, what: str) -> None:
        """Count a first call's `seconds`; Unavailable if they were more than was left."""
        left = self.left
        self.spent += seconds
        if seconds > left:
            raise Unavailable(f"{what} took {seconds:.1f} s, more than the {max(left, 0):.1f} s left of the run's "
                              f"compile budget ({self.total:g} s)")

