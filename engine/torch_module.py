"""Any cell as a torch.nn.Module, with autograd through the engine's own backward pass (issue #13, item 6).

    from engine.torch_module import CellRNN
    rnn = CellRNN(engine.preset("gru").cell, input_size=64, hidden_size=128, num_layers=2).cuda()
    out, states = rnn(x)                 # x: (T, B, 64), like nn.GRU; states: {name: (L, B, H)}
    out.sum().backward()                 # gradients of every parameter, of x and of the initial states

In an existing training script that is the swap of the nn.LSTM line for a CellRNN one (and of the unpacked
(h_n, c_n) for the `states` dict). The parameters are the cell's own, one nn.Parameter per weight of each layer
(`layer{l}_{name}`, the engine's shapes), initialised as engine.init_params does. On CUDA tensors the forward pass
and the backward pass (engine.autodiff: record, then Tape.backward) run on the GPU through CuPy on the same memory
(no copies: CuPy arrays over the tensors' pointers, tensors over the arrays' by DLPack) and on torch's current
stream: fp32 on the generated training step (engine.autodiff's backend "fused": cuBLAS GEMMs and generated
kernels), fp64 through the CuPy interpreter; on the CPU they run on the NumPy reference. All are checked against
the engine's own float64 gradients, and fp32 against torch's LSTM and GRU. `last_backend` says which one the last
forward pass ran on.

A cell whose recurrence is linear (minGRU, minLSTM's gates, a diagonal linear RNN: engine/passes/scan.py) trains as a
scan on CUDA in fp32 (and in the precision modes below) where its scan walks (engine/schedules/scan_grad.py walk_record: one GEMM and one walk a layer
forward, one walk back and two GEMMs backward), not step by step: minGRU at I = H = 512, B = 8, T = 4096, x data, in
2.05-2.22 ms a step against the step-by-step 18.7-18.8 (H200, benchmarks/results/input-gradient-20261127-H200/).
scan=False keeps the step-by-step path; sequences of several lengths take it too.

precision="tf32", "bfloat16" or "float16" (bf16, fp16 too) trains in that mode: the parameters, inputs, states and
gradients stay fp32 tensors (fp32 master weights), and every matmul of both passes rounds its operands to the mode's
format and sums in fp32 (engine/codegen/precision.py): on CUDA the fused step's GEMMs on tensor cores, on the CPU the
reference's emulation. A float64 module is the reference path and takes float32 precision only.

torch is imported here only: the rest of the engine does not need it.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .autodiff import record
from .backends.common import check_training_precision
from .errors import BackendError
from .ir import CellGraph
from .network import Network
from .params import Params, init_params
from .schedules.scan_grad import walk_record

try:
    import torch  # deferred: torch is optional (the cuDNN and torch baselines)
except ImportError as e:       # the module cannot exist without torch: say so once, where it is imported
    raise ImportError("engine.torch_module needs PyTorch (pip install torch)") from e


class CellRNN(torch.nn.Module):
    """num_layers stacked layers of `cell`, over (T, B, input_size) sequences (time first, as nn.LSTM's default)."""

    def __init__(self, cell: CellGraph, input_size: int, hidden_size: int, num_layers: int = 1, *,
                 proj_size: int | None = None, seed: int = 0, dtype=torch.float32, precision: str = "float32",
                 scan: bool = True):
        super().__init__()
        if not isinstance(cell, CellGraph):
            raise BackendError(f"CellRNN needs a CellGraph, got {type(cell).__name__}; hint: engine.preset('lstm').cell "
                               "or a @cell design")
        self.precision = check_training_precision("CellRNN", precision)
        if self.precision != "float32" and dtype != torch.float32:
            raise BackendError(f"CellRNN(precision={precision!r}) keeps float32 parameters (fp32 master weights), got "
                               f"dtype={dtype}; hint: dtype=torch.float32 (float64 is the reference path, in "
                               "precision='float32')")
        self.network = Network(cell, input_size, hidden_size, num_layers, proj_size)
        self.names = [[p.name for p in cell.params] for _ in range(num_layers)]
        self.scan = bool(scan)                    # a linear recurrence trained as a scan where it walks (below)
        self.last_backend: str | None = None      # "scan", "fused", "naive" or "reference": the last forward's
        for layer, values in enumerate(init_params(self.network, seed=seed).layers):
            for name in self.names[layer]:
                self.register_parameter(f"layer{layer}_{name}",
                                        torch.nn.Parameter(torch.tensor(values[name], dtype=dtype)))

    def layer_parameters(self) -> list[list[torch.nn.Parameter]]:
        return [[getattr(self, f"layer{layer}_{name}") for name in names] for layer, names in enumerate(self.names)]

    def engine_params(self) -> Params:
        """The parameters as engine Params of NumPy arrays (copies), for engine.run or engine.bptt."""
        return Params([{name: p.detach().cpu().numpy().copy() for name, p in zip(names, tensors)}
                       for names, tensors in zip(self.names, self.layer_parameters())])

    def forward(self, x, initial_states: dict | None = None) -> tuple:
        """x: (T, B, input_size), or a PackedSequence of sequences of several lengths (as nn.LSTM takes it: the
        outputs come back packed the same way, and the final states are each sequence's own last ones, in the
        batch's original order). initial_states: name -> (L, B, size) tensors, zeros where not given. Returns the
        top layer's outputs (T, B, output size) and the final states, name -> (L, B, size)."""
        network = self.network
        packed, lengths = None, None
        if isinstance(x, torch.nn.utils.rnn.PackedSequence):
            packed = x
            x, steps = torch.nn.utils.rnn.pad_packed_sequence(packed)        # the batch's original order
            lengths = steps.numpy()
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != network.input_size:
            raise BackendError(f"CellRNN input must be a (T, B, {network.input_size}) tensor, got "
                               + (f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__))
        params = [p for tensors in self.layer_parameters() for p in tensors]
        if x.dtype != params[0].dtype or x.device != params[0].device:
            raise BackendError(f"CellRNN input is {x.dtype} on {x.device}, its parameters {params[0].dtype} on "
                               f"{params[0].device}; hint: move one to the other (.to(x) or x.to(...))")
        B = x.shape[1]
        states = []
        for s in network.cell.state_names:
            given = (initial_states or {}).get(s)
            states.append(given if given is not None else
                          x.new_zeros((network.num_layers, B, network.state_size(s))))
        unknown = set(initial_states or {}) - set(network.cell.state_names)
        if unknown:
            raise BackendError(f"initial_states: {sorted(unknown)} are not states of cell '{network.cell.name}' "
                               f"(states: {', '.join(network.cell.state_names)})")
        out, *finals = _CellFunction.apply(self, x, lengths, *states, *params)
        if packed is not None:
            out = repack(out, packed)
        return out, dict(zip(network.cell.state_names, finals))


def repack(out: torch.Tensor, like):
    """Padded outputs (T, B, H) in the batch's original order -> a PackedSequence laid out as `like` is (its
    sorted_indices, so that out.data lines up with nn.LSTM's on the same input)."""
    rnn_utils = torch.nn.utils.rnn
    lengths = torch.as_tensor(rnn_utils.pad_packed_sequence(like)[1])
    if like.sorted_indices is None:
        return rnn_utils.pack_padded_sequence(out, lengths)
    order = like.sorted_indices.to(out.device)
    data = rnn_utils.pack_padded_sequence(out.index_select(1, order), lengths[like.sorted_indices.cpu()])
    return rnn_utils.PackedSequence(data.data, data.batch_sizes, like.sorted_indices, like.unsorted_indices)


class _CellFunction(torch.autograd.Function):
    """Forward: engine.autodiff.record on the tensors' memory. Backward: the tape's backward pass."""

    @staticmethod
    def forward(ctx, module: CellRNN, x, lengths, *tensors):
        network = module.network
        names = network.cell.state_names
        states, params = tensors[:len(names)], tensors[len(names):]
        with _on(x):
            layers, k = [], 0
            for names_l in module.names:
                layers.append({name: _array(params[k + i]) for i, name in enumerate(names_l)})
                k += len(names_l)
            dtype = np.float64 if x.dtype == torch.float64 else np.float32
            # CUDA fp32: the generated training step; CUDA fp64: the CuPy interpreter; CPU: the NumPy reference
            backend = ("fused" if dtype == np.float32 else "naive") if x.is_cuda else "reference"
            if module.precision != "float32" and dtype != np.float32:
                raise BackendError(f"CellRNN(precision={module.precision!r}) runs float32 tensors, got {x.dtype}; "
                                   "hint: .float() the module and its input")
            given = {s: _array(v) for s, v in zip(names, states)}
            tape = None
            if module.scan and backend == "fused" and lengths is None:
                import cupy  # deferred: CuPy is optional (no GPU in CI)
                tape = walk_record(network, Params(layers), _array(x), given, dtype=dtype, xp=cupy,
                                   precision=module.precision)
                backend = "scan" if tape is not None else backend
            if tape is None:
                tape = record(network, Params(layers), _array(x), given, dtype=dtype, backend=backend,
                              lengths=lengths, precision=module.precision)
            module.last_backend = backend
            ctx.tape, ctx.names, ctx.shapes = tape, names, [tuple(p.shape) for p in params]
            ctx.set_materialize_grads(False)      # an output the loss does not use: None, not a tensor of zeros
            return (_tensor(tape.outputs, x), *(_tensor(tape.final_states[s], x) for s in names))

    @staticmethod
    def backward(ctx, d_outputs, *d_finals):
        """The tape's backward; a gradient only where autograd asks for it (ctx.needs_input_grad: x as data, the
        zero initial states CellRNN makes, a frozen parameter), each an engine array wrapped as a tensor."""
        like = next(d for d in (d_outputs, *d_finals) if d is not None)
        wanted = ctx.needs_input_grad
        with _on(like):
            grads = ctx.tape.backward(None if d_outputs is None else _array(d_outputs),
                                      {s: _array(d) for s, d in zip(ctx.names, d_finals) if d is not None},
                                      input_gradient=wanted[1])
            arrays = [g for layer in grads.params for g in layer.values()]
            d_params = [_tensor(g, like) if w else None for g, w in zip(arrays, wanted[3 + len(ctx.names):])]
            d_states = [_tensor(grads.initial_states[s], like) if w else None
                        for s, w in zip(ctx.names, wanted[3:])]
        ctx.tape = None
        return (None, None if grads.x is None else _tensor(grads.x, like), None, *d_states, *d_params)


_CUPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def _array(t: torch.Tensor):
    """The tensor's memory as a CuPy array (CUDA, no copy) or a NumPy array (CPU, no copy). On CUDA the array wraps
    the tensor's pointer and keeps the tensor alive; the work on it is ordered with torch's by _on's stream. DLPack's
    exchange (cupy.from_dlpack, kept for other dtypes) took 41 us a tensor on an H200 against 12 (2026-11-27), and
    a training step converts eight or more."""
    t = t.detach().contiguous()
    if not t.is_cuda:
        return t.numpy()
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    dtype = _CUPY_DTYPES.get(t.dtype)
    if dtype is None or t.numel() == 0:
        return cupy.from_dlpack(t)
    memory = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t, t.device.index)
    return cupy.ndarray(tuple(t.shape), dtype, cupy.cuda.MemoryPointer(memory, 0))


def _tensor(a, like: torch.Tensor) -> torch.Tensor:
    """A CuPy or NumPy array as a tensor on `like`'s device (no copy)."""
    return torch.from_dlpack(a) if like.is_cuda else torch.from_numpy(np.ascontiguousarray(a))


@contextlib.contextmanager
def _on(t: torch.Tensor):
    """CuPy work on the tensor's device and torch's current stream there, so it is ordered with torch's own."""
    if not t.is_cuda:
        yield
        return
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    stream = torch.cuda.current_stream(t.device)
    from_external = getattr(cupy.cuda.Stream, "from_external", None)     # CuPy 14; ExternalStream before it
    with cupy.cuda.Device(t.device.index):
        with (from_external(stream) if from_external and hasattr(stream, "__cuda_stream__")
              else cupy.cuda.ExternalStream(stream.cuda_stream)):
            yield
