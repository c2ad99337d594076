"""Networks of blocks in the benchmark harness (issue #11): a preset network timed whole, side by side.

    python -m engine bench --config deepspeech [--preset gru] [--impl cudnn-fp32 --impl persistent]

A net configuration (configs.NetBenchConfig) names a preset network of engine/nets/presets.py and the sizes it runs at;
`deepspeech` is the seed benchmark's block: 4 layers of the cell, max-pool over time by 2 (stride 2), 4 more layers,
I = H = 512, T = 100, B = 64. Each --preset gives the cell of its layers (LSTM by default).

Rows (fp32 only: the engine rows run in IEEE fp32, cuDNN with TF32 off):
- `cudnn-fp32`: one torch.nn module per block of layers (LSTM, GRU or RNN, whichever cuDNN mode the preset has),
  loaded with the engine's weights (engine.torch_layout), and torch's max_pool1d / avg_pool1d over time between them;
- `fused`, `graph`, `persistent`, `auto`: the engine's `prepare_net(net, params, backend)`, prepared once and run as
  a user keeps it (each block of layers one program on the GPU; pools between them on CuPy arrays);
- `persistent-fused-pools`, `graph-fused-pools`: the same with `fuse_pools=True` (blocks of one cell joined into one
  wavefront through their pools, each pool folded into the layer below it: engine.nets.fusion.fused_runs).
Each row's output on input buffer 0 (NaN-poisoned buffers for the engine rows) is checked against the float64 NumPy
reference of the whole net (run_net on the reference backend) and is timed only when it passes
(engine/bench/divergence.py). Timing as for cells (engine/bench/timing.py): CUDA events around one whole forward
after warm-up, inputs rotated among buffers, the median.

For the CPU tests of this module, device="cpu" runs cuDNN's row as torch on the CPU and an engine row `reference`
(the reference backend in float32) with a wall clock; the GPU rows say they need a GPU.
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import numpy as np

from ..errors import BackendError
from ..flops import network_flops
from ..gallery import presets as all_presets
from ..nets.data import Net, Pool, init_net_params
from ..nets.io import net_to_dict
from ..nets.runner import prepare_net, run_net
from ..network import Network
from ..params import Params
from ..torch_layout import to_torch_state_dict
from .configs import NetBenchConfig
from .divergence import error_summary, gate, step_curves
from .implementation import Unavailable, short_reason
from .timing import TIMERS, time_runs

FOLDED_SUFFIX = "-fused-pools"      # prepare_net(..., fuse_pools=True): one wavefront through the pools
ENGINE_ROWS = ("fused", "graph", "persistent", "auto", "persistent" + FOLDED_SUFFIX, "graph" + FOLDED_SUFFIX)
NET_IMPLEMENTATIONS = ("cudnn-fp32",) + ENGINE_ROWS
TF32_FLAGS = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32")


def net_flops(net: Net, steps: int, batch: int) -> int:
    """FLOPs of one forward: every block of layers at the steps that reach it (pools are free here)."""
    total, k_steps = 0, steps
    for k, block in enumerate(net.blocks):
        if isinstance(block, Pool):
            k_steps = block.steps_out(k_steps)
            continue
        directions = 2 if block.bidirectional else 1
        network = Network(block.cell, net.sizes[k], block.hidden_size, block.num_layers, block.proj_size)
        total += directions * network_flops(network, k_steps, batch)["total"]
    return total


@contextmanager
def _tf32_off(torch):
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def cudnn_net(torch, net: Net, params, device: str):
    """The net as torch modules with the engine's weights, float32: forward(x (T, B, I) tensor) -> tensor. Raises
    Unavailable for a block cuDNN has no form of."""
    by_structure = {p.cell.structural_hash: p for p in all_presets().values() if p.cudnn and p.torch is not None}
    stages = []
    for k, block in enumerate(net.blocks):
        if isinstance(block, Pool):
            stages.append(block)
            continue
        preset = by_structure.get(block.cell.structural_hash)
        if preset is None:
            raise Unavailable(f"cuDNN has no form of cell '{block.cell.name}' (block {k}, {block.label})")
        if block.bidirectional or block.proj_size is not None:
            raise Unavailable(f"block {k} ({block.label}): the harness maps forward blocks without projection to "
                              "cuDNN only")
        layout = preset.torch
        module = getattr(torch.nn, layout.module)(net.sizes[k], block.hidden_size, block.num_layers)
        weights = {}
        for layer in range(block.num_layers):
            network = block.layer_network(layer, net.sizes[k])
            one = to_torch_state_dict(network, Params([params.blocks[k]["forward"].layers[layer]]), layout)
            weights.update({key.replace("_l0", f"_l{layer}"): value for key, value in one.items()})
        module.load_state_dict({key: torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
                                for key, value in weights.items()})
        stages.append(module.to(device))
    functional = torch.nn.functional

    def forward(x):
        with torch.no_grad():
            for stage in stages:
                if isinstance(stage, Pool):
                    pool = functional.max_pool1d if stage.op == "max" else functional.avg_pool1d
                    x = pool(x.permute(1, 2, 0), kernel_size=stage.window, stride=stage.stride).permute(2, 0, 1)
                    x = x.contiguous()
                else:
                    x, _ = stage(x)
        return x
    return forward


def _row(name: str, net: Net, params, inputs: list, device: str, torch):
    """(forward(k, poison=False) -> output, timer name, family) of one row; Unavailable when it cannot run here."""
    if name == "cudnn-fp32":
        if torch is None:
            raise Unavailable("torch is not installed: no cuDNN baseline")
        if device == "cuda" and not torch.cuda.is_available():
            raise Unavailable("torch has no CUDA here: no cuDNN baseline")
        run = cudnn_net(torch, net, params, device)
        tensors = [torch.from_dlpack(x) if device == "cuda" else torch.from_numpy(x) for x in inputs]
        return (lambda k, poison=False: run(tensors[k])), "torch" if device == "cuda" else "wall", "cudnn"
    if device == "cpu":
        if name != "reference":
            raise Unavailable(f"engine row '{name}' needs a GPU (on the CPU only the 'reference' row runs)")
        program = prepare_net(net, params, "reference", dtype=np.float32)
        return (lambda k, poison=False: program.run(inputs[k]).outputs), "wall", "engine"
    if name not in ENGINE_ROWS:
        raise Unavailable(f"'{name}' is not a row of a net benchmark; rows: {', '.join(NET_IMPLEMENTATIONS)}")
    folded = name.endswith(FOLDED_SUFFIX)
    program = prepare_net(net, params, name.removesuffix(FOLDED_SUFFIX), fuse_pools=folded)
    return (lambda k, poison=False: program.run(inputs[k], poison=poison).outputs), "cupy", "engine"


def bench_net(name: str, cell, config: NetBenchConfig, implementations, *, reps: int, warmup: int, buffers: int,
              seed: int = 0, device: str = "cuda", deadline: float | None = None) -> dict:
    """The results entry of one preset cell in one net configuration (results.py, "nets")."""
    net = config.build(cell)
    T, B = config.steps, config.batch
    result = {"preset": name, "config": config.to_dict(), "net": net_to_dict(net), "status": "ok", "reason": None,
              "block_steps": net.steps(T), "flops_total": net_flops(net, T, B), "implementations": []}
    params = init_net_params(net, seed=seed)
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal((T, B, config.input_size)).astype(np.float32) for _ in range(buffers)]
    start = time.perf_counter()
    reference = run_net(net, params, host[0].astype(np.float64), backend="reference").outputs
    result["reference"] = {"implementation": "run_net on the NumPy reference backend, float64",
                           "seconds": time.perf_counter() - start}
    if device == "cuda":
        import cupy as xp  # deferred: CuPy is optional (no GPU in CI)
        inputs = [xp.asarray(x) for x in host]
        reference = xp.asarray(reference)
    else:
        xp, inputs = np, host
    try:
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
    except ImportError:
        torch = None
    cudnn_ms = None
    for impl in implementations:
        entry = {"name": impl, "family": "cudnn" if impl.startswith("cudnn") else "engine", "precision": "fp32",
                 "status": "ok", "reason": None, "tf32": False}
        if deadline is not None and time.monotonic() > deadline:
            entry.update(status="skipped", reason="the run's time budget was spent")
            result["implementations"].append(entry)
            continue
        try:
            with (_tf32_off(torch) if torch is not None else nullcontext()):
                forward, timer, entry["family"] = _row(impl, net, params, inputs, device, torch)
                if torch is not None:
                    entry["tf32_flags"] = {TF32_FLAGS[0]: torch.backends.cuda.matmul.allow_tf32,
                                           TF32_FLAGS[1]: torch.backends.cudnn.allow_tf32}
                output = _as_float64(forward(0, poison=True), xp)
                entry["error"] = error_summary(output, reference, xp, "fp32")
                entry["divergence"] = {"vs_reference": step_curves(output, reference, xp)}
                wrong = gate(entry["error"], "fp32")
                if wrong:
                    entry.update(status="failed", reason=wrong)
                else:
                    entry.update(time_runs(forward, TIMERS[timer], buffers=buffers, warmup=warmup,
                                           reps=reps).to_dict())
        except Unavailable as e:
            entry.update(status="unavailable", reason=str(e))
        except Exception as e:  # one row's failure is reported, never raised
            entry.update(status="failed", reason=short_reason(e))
        if entry["status"] == "ok" and impl == "cudnn-fp32":
            cudnn_ms = entry["median_ms"]
        result["implementations"].append(entry)
    for entry in result["implementations"]:
        if entry["status"] == "ok":
            entry["tflops"] = result["flops_total"] / entry["median_ms"] / 1e9
            entry["speedup"] = {"vs_cudnn_fp32": None if cudnn_ms is None else cudnn_ms / entry["median_ms"]}
    return result


def _as_float64(output, xp):
    """A row's output (a CuPy or NumPy array, or a torch tensor) as an xp float64 array."""
    if hasattr(output, "detach"):                              # torch
        output = output.detach()
        output = output.cpu().numpy() if xp is np else xp.from_dlpack(output)
    return xp.asarray(output, dtype=xp.float64)


def blocks_label(net: dict) -> str:
    """A net's JSON dict in one line: 'lstm x4 -> max-pool 2/2 -> lstm x4'."""
    parts = []
    for b in net.get("blocks", []):
        if b.get("kind") == "pool":
            parts.append(f"{b.get('op')}-pool {b.get('window')}/{b.get('stride')}")
        else:
            cell = b.get("cell") if isinstance(b.get("cell"), str) else "custom"
            parts.append(f"{cell} x{b.get('num_layers')}" + (" bi" if b.get("direction") == "bidirectional" else ""))
    return " -> ".join(parts)


def net_implementations(chosen: list[str] | None) -> list[str]:
    """The rows of a net benchmark: those of `chosen` a net has (all of NET_IMPLEMENTATIONS when None)."""
    if chosen is None:
        return list(NET_IMPLEMENTATIONS)
    rows = [name for name in chosen if name in NET_IMPLEMENTATIONS]
    if not rows:
        raise BackendError(f"none of the implementations {', '.join(chosen)} runs a network; hint: a net config "
                           f"takes {', '.join(NET_IMPLEMENTATIONS)}")
    return rows


def net_markdown_table(results: dict) -> str:
    """One row per (cell, net configuration): the median ms of each row and, in parentheses, cuDNN fp32 (TF32 off)
    over it."""
    nets = results.get("nets") or []
    if not nets:
        return ""
    names = list(dict.fromkeys(e["name"] for n in nets for e in n.get("implementations", [])))
    header = ["cell", "net", "blocks", "I,H,T,B", *names]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for n in nets:
        c = n.get("config", {})
        blocks = blocks_label(n.get("net", {}))
        row = [str(n.get("preset")), str(c.get("name")), blocks,
               ",".join(str(c.get(k)) for k in ("input_size", "hidden_size", "steps", "batch"))]
        by_name = {e["name"]: e for e in n.get("implementations", [])}
        for name in names:
            e = by_name.get(name)
            if e is None:
                row.append("-")
            elif e["status"] == "ok":
                ratio = (e.get("speedup") or {}).get("vs_cudnn_fp32")
                row.append(f"{e['median_ms']:.3g}" + ("" if ratio is None else f" ({ratio:.2f}x)"))
            else:
                row.append({"unavailable": "n/a", "failed": "fail", "skipped": "skip"}.get(e["status"], "-"))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
