"""run_bench: time every available implementation of a cell over a set of configurations, side by
side in one process, after checking each one's output against a float64 reference.

Per (cell, configuration):
  1. the memory it needs is estimated; too large -> skipped with a message, nothing allocated;
  2. seeded parameters and several random-normal input buffers (never zeros);
  3. the float64 reference on the GPU (the naive backend in float64), itself checked against the
     NumPy reference when that is cheap;
  4. each implementation: set up, one run on buffer 0 with NaN-poisoned outputs where supported,
     error and per-step divergence against the reference (and against cuDNN fp32), then, if the
     output is right, warm-up and >= 20 timed repetitions rotating the input buffers;
  5. speedups, TFLOP/s and floors; the results file is rewritten after every cell.
An implementation that cannot run is reported with the reason; nothing here raises for it.
"""
from __future__ import annotations

import gc
import hashlib
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .. import backends
from ..arguments import integer, shown
from ..backends import naive
from ..backends import reference as numpy_reference
from ..chunk_replay import release_retired
from ..errors import BackendError, EngineError
from ..files import as_path, check_destination
from ..flops import network_flops
from ..gallery import Preset
from ..gallery import get as get_preset
from ..ir import CellGraph
from ..memory import run_bytes
from ..params import init_params
from .configs import BenchConfig, NetBenchConfig, parse_configs
from .divergence import error_bound, error_summary, gate, step_curves
from .flops import floors
from .implementation import Case, Implementation, Unavailable, short_reason
from .implementations import default_implementations, select
from .nets import bench_net, net_implementations
from .results import RESULTS_DIR, new_results, results_filename, save_results
from .timing import MEMORY, TIMERS, cupy_timer, time_runs

MIN_REPS = 20
QUICK = {"reps": 20, "warmup": 3, "buffers": 3, "compile_budget_s": 60.0}
FULL = {"reps": 50, "warmup": 5, "buffers": 4, "compile_budget_s": 300.0}
# Check the GPU float64 reference against NumPy when the cell costs less than this many FLOPs.
CPU_CHECK_FLOPS = 2e10

Progress = Callable[[int, int, str], None]


def _sync(kind: str) -> None:
    if kind == "cupy":
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        cupy.cuda.Device().synchronize()
    elif kind == "torch":
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        torch.cuda.synchronize()


def _free_device_memory() -> None:
    gc.collect()
    try:
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        release_retired()                     # what replays that have gone still held (engine/chunk_replay.py)
        cupy.get_default_memory_pool().free_all_blocks()
    except Exception:
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- one implementation --------------------------------------------------------------------------

def measure_implementation(impl: Implementation, case: Case, reference, cudnn_reference, *, reps: int,
                           warmup: int, buffers: int) -> tuple[dict, object]:
    """The result entry of one implementation, and its float64 output on buffer 0 (or None)."""
    xp = case.xp
    impl.detail = {}                      # one implementation object serves every cell: details are per cell
    entry = {"name": impl.name, "family": impl.family, "precision": impl.precision, "status": "ok",
             "reason": None, "tf32": impl.tf32, "tf32_flags": {}, "detail": impl.detail}
    reason = impl.unavailable_reason(case)
    if reason:
        entry.update(status="unavailable", reason=reason)
        return entry, None
    output = None
    try:
        with impl.context():
            entry["tf32_flags"] = impl.flags()
            memory = MEMORY[impl.timer]()
            memory.reset()
            start = time.perf_counter()
            impl.setup(case)
            value = impl.forward(0, poison=True)
            _sync(impl.timer)
            first_call_s = time.perf_counter() - start
            entry["peak_bytes"] = memory.peak()
            entry["first_call_s"] = first_call_s
            output = impl.output(value, xp)
            del value
            entry["error"] = error_summary(output, reference, xp, impl.precision)
            entry["divergence"] = {"vs_reference": step_curves(output, reference, xp)}
            if cudnn_reference is not None and impl.name != "cudnn-fp32":
                entry["error_vs_cudnn_fp32"] = error_summary(output, cudnn_reference, xp, impl.precision)
                entry["divergence"]["vs_cudnn_fp32"] = step_curves(output, cudnn_reference, xp)
            impl.after_first_call(first_call_s)
            wrong = gate(entry["error"], impl.precision)
            if wrong:
                entry.update(status="failed", reason=wrong)
                return entry, None
            timing = time_runs(impl.forward, TIMERS[impl.timer], buffers=buffers, warmup=warmup, reps=reps)
            entry.update(timing.to_dict())
    except Unavailable as e:
        entry.update(status="unavailable", reason=str(e))
        output = None
    except Exception as e:  # any failure of one implementation is reported, never raised
        entry.update(status=impl.failure_status, reason=short_reason(e))
        output = None
    finally:
        try:
            impl.teardown()
        except Exception:
            pass
    return entry, output


def merge_groups(entries: list[dict], groups: dict[str, str]) -> list[dict]:
    """Report the candidates of a group (torch.compile, TorchScript) as one row: the fastest that ran."""
    merged: list[dict] = []
    done: set[str] = set()
    for entry in entries:
        group = groups.get(entry["name"])
        if group is None:
            merged.append(entry)
            continue
        if group in done:
            continue
        done.add(group)
        members = [e for e in entries if groups.get(e["name"]) == group]
        ok = [e for e in members if e["status"] == "ok"]
        candidates = {e["name"]: {k: e.get(k) for k in ("status", "reason", "median_ms", "first_call_s")}
                      | {"compile_s": e["detail"].get("compile_s")} for e in members}
        if ok:
            best = min(ok, key=lambda e: e["median_ms"])
            row = dict(best, name=group, detail=dict(best.get("detail", {}), variant=best["name"],
                                                     candidates=candidates))
        else:
            status = "failed" if any(e["status"] == "failed" for e in members) else (
                "skipped" if all(e["status"] == "skipped" for e in members) else "unavailable")
            first = members[0]
            row = {"name": group, "family": first.get("family"), "precision": first.get("precision"),
                   "status": status, "reason": "; ".join(f"{e['name']}: {e.get('reason')}" for e in members),
                   "tf32": first.get("tf32"), "tf32_flags": first.get("tf32_flags", {}),
                   "detail": {"candidates": candidates}}
        merged.append(row)
    return merged


def add_derived(entries: list[dict], flops_total: int, floor_ms: float | None) -> None:
    """TFLOP/s, the ratio to the floor, and speedups (baseline median / this median, None where the
    baseline did not run): over cuDNN fp32, over naive, and "vs_cudnn_same" over cuDNN in the entry's
    own precision (cudnn-bf16 for persistent-bf16; cuDNN fp32 for the fp32 rows; 1.0 for cuDNN itself)."""
    medians = {e["name"]: e.get("median_ms") for e in entries if e["status"] == "ok"}

    def over(base: str, median: float) -> float | None:
        return medians[base] / median if medians.get(base) else None

    cudnn_fp32 = next((e for e in entries if e["name"] == "cudnn-fp32" and e.get("error")), None)
    for entry in entries:
        bound = error_bound(entry, cudnn_fp32)          # fp32x3 rows: their error beside cuDNN fp32's
        if bound is not None:
            entry["error_vs_cudnn_bound"] = bound
        if entry["status"] != "ok":
            continue
        median = entry["median_ms"]
        entry["tflops"] = flops_total / (median * 1e-3) / 1e12 if median > 0 else None
        entry["vs_floor"] = median / floor_ms if floor_ms else None
        entry["speedup"] = {"vs_cudnn_fp32": over("cudnn-fp32", median), "vs_naive": over("naive", median),
                            "vs_cudnn_same": over(f"cudnn-{entry.get('precision', 'fp32')}", median)}


def measure_cell(case: Case, implementations: list[Implementation], reference, *, reps: int, warmup: int,
                 buffers: int, deadline: float | None = None, progress: Progress | None = None,
                 done: int = 0, total: int = 0, time_budget_s: float | None = None) -> list[dict]:
    """Every implementation on one case, in order; returns the merged entries."""
    entries = []
    cudnn_reference = None
    for impl in implementations:
        if progress:
            progress(done, total, f"{case.name}/{case.config.name} {impl.name}")
        if deadline is not None and time.monotonic() > deadline:
            entry = {"name": impl.name, "family": impl.family, "precision": impl.precision, "status": "skipped",
                     "reason": f"the run's time budget ({time_budget_s:g} s) was spent", "tf32": impl.tf32,
                     "tf32_flags": {}, "detail": {}}
        else:
            entry, output = measure_implementation(impl, case, reference, cudnn_reference, reps=reps,
                                                   warmup=warmup, buffers=buffers)
            if impl.name == "cudnn-fp32" and entry["status"] == "ok":
                cudnn_reference = output
            del output
            if case.device == "cuda":
                _free_device_memory()
        entries.append(entry)
        done += 1
    groups = {i.name: i.group for i in implementations if i.group}
    return merge_groups(entries, groups)


# ---- the device -------------------------------------------------------------------------------------

def _version(code: int) -> str:
    return f"{code // 1000}.{code % 1000 // 10}"


def _command_output(args: list[str]) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def source_hash(root: Path | None = None) -> str:
    """A hash of the code a result ran: every file under engine/ and kernels/ but caches, by path and content
    (sha256, 16 hex digits). A copy of the tree whose .git lags its files (a machine the tree was copied to)
    records a stale git_commit; this names the code itself: `python -c "from engine.bench.runner import
    source_hash; print(source_hash())"` in a checkout gives the same value when its code is the same."""
    root = Path(__file__).resolve().parents[2] if root is None else Path(root)
    digest = hashlib.sha256()
    for folder in ("engine", "kernels"):
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".cubin"):
                digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def environment() -> dict:
    """Device, driver and library versions, recorded with every result."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    device = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    env = {"device": name, "compute_capability": f"{props['major']}.{props['minor']}",
           "multiprocessors": int(props["multiProcessorCount"]), "memory_bytes": int(props["totalGlobalMem"]),
           "driver": _command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
           "cuda_driver_api": _version(cupy.cuda.runtime.driverGetVersion()),
           "cuda_runtime": _version(cupy.cuda.runtime.runtimeGetVersion()),
           "cupy": cupy.__version__, "numpy": np.__version__, "python": platform.python_version(),
           "platform": platform.platform(), "CUPY_TF32": os.environ.get("CUPY_TF32", "0"),
           "git_commit": _command_output(["git", "-C", str(Path(__file__).resolve().parents[2]), "rev-parse",
                                          "HEAD"]),
           "source_hash": source_hash()}
    try:
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        env.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    except Exception as e:
        env.update(torch=None, torch_unavailable=short_reason(e))
    try:
        import triton  # deferred: triton is optional (torch.compile's backend)
        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    return env


def measure_sgemm(size: int = 8192, reps: int = 5) -> dict:
    """The device's fp32 GEMM rate with TF32 off (CuPy uses TF32 only when CUPY_TF32=1)."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    free = cupy.cuda.runtime.memGetInfo()[0]
    while size > 1024 and 3 * size * size * 4 > free // 2:
        size //= 2
    best_ms = _best_sgemm_ms(cupy, size, reps)
    cupy.get_default_memory_pool().free_all_blocks()
    return {"sgemm_fp32_tflops": 2 * size ** 3 / (best_ms * 1e-3) / 1e12, "sgemm_size": size,
            "sgemm_note": f"cupy.matmul float32 {size}x{size}, TF32 off, best of {reps}"}


def _best_sgemm_ms(cupy, size: int, reps: int) -> float:
    rng = cupy.random.RandomState(1)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    for _ in range(2):
        cupy.matmul(a, b)
    return min(cupy_timer(lambda: cupy.matmul(a, b)) for _ in range(reps))


def measure_launch(launches: int = 2000) -> dict:
    """The cost of one empty kernel launch, back to back from Python through CuPy."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    kernel = cupy.RawKernel('extern "C" __global__ void engine_bench_empty() {}', "engine_bench_empty")
    kernel((1,), (1,), ())
    cupy.cuda.Device().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(launches):
        kernel((1,), (1,), ())
    end.record()
    end.synchronize()
    return {"launch_us": cupy.cuda.get_elapsed_time(start, end) * 1e3 / launches, "launch_count": launches,
            "launch_note": "empty kernel, back-to-back launches from Python via CuPy"}


def estimate_cell_bytes(case_network, config: BenchConfig, buffers: int) -> int:
    """What one cell needs on the device at its peak, before anything is allocated: the input
    buffers, the float64 reference run, the kept reference outputs, and the largest implementation
    (bounded by twice the naive fp32 run plus converted input copies)."""
    T, B, I, H = config.steps, config.batch, config.input_size, config.hidden_size
    inputs = buffers * T * B * I * 4
    reference = run_bytes(case_network, T, B, 8, backend="naive")
    kept = 3 * T * B * H * 8                  # the reference, cuDNN fp32's output and the output being checked
    largest = 2 * run_bytes(case_network, T, B, 4, backend="naive") + buffers * T * B * I * 4
    return inputs + reference + kept + largest + (64 << 20)


def free_device_bytes() -> int:
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    _free_device_memory()
    return int(cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes())


# ---- the run ----------------------------------------------------------------------------------------------

def _cells(presets: Iterable) -> list[tuple[str, CellGraph, Preset | None]]:
    if isinstance(presets, (str, Preset, CellGraph)):           # one cell: bench("lstm") times the LSTM
        presets = [presets]
    if not isinstance(presets, Iterable):
        raise BackendError(f"argument 'presets' must be preset names, Presets or CellGraphs, got "
                           f"{type(presets).__name__}; hint: e.g. presets=['lstm', 'gru']")
    cells = []
    for item in presets:
        if isinstance(item, str):
            preset = get_preset(item)
            cells.append((preset.name, preset.cell, preset))
        elif isinstance(item, Preset):
            cells.append((item.name, item.cell, item))
        elif isinstance(item, CellGraph):
            cells.append((item.name, item, None))
        else:
            raise BackendError(f"argument 'presets': expected preset names, Presets or CellGraphs, got "
                               f"{type(item).__name__}; hint: e.g. presets=['lstm', 'gru']")
    if not cells:
        raise BackendError("argument 'presets' is empty. hint: e.g. presets=['lstm']")
    return cells


def _reference(case: Case) -> tuple[object, dict]:
    """The float64 output on buffer 0, computed on the GPU by the naive backend in float64."""
    start = time.perf_counter()
    program = naive.prepare(case.network, case.params, dtype=np.float64)
    reference = program.run(case.inputs[0], poison=True).outputs
    _sync("cupy")
    info = {"implementation": "naive backend in float64 on the GPU", "seconds": time.perf_counter() - start}
    del program
    return reference, info


def _check_reference(case: Case, reference, flops_total: int) -> dict:
    """Compare the GPU float64 reference with the NumPy reference when that is cheap enough."""
    if flops_total > CPU_CHECK_FLOPS:
        return {"cpu_check": f"skipped: {flops_total:.2g} FLOPs is over the {CPU_CHECK_FLOPS:.0e} limit"}
    x = case.xp.asnumpy(case.inputs[0]).astype(np.float64)
    expected = numpy_reference.run(case.network, case.params, x).outputs
    got = case.xp.asnumpy(reference)
    max_abs = float(np.max(np.abs(got - expected)))
    return {"cpu_check_max_abs": max_abs, "cpu_check_ok": bool(max_abs <= 1e-9 * max(1.0, np.max(np.abs(expected))))}


def bench_cell(name: str, cell: CellGraph, preset: Preset | None, config: BenchConfig,
               implementations: list[Implementation], settings: dict, measurements: dict, *,
               deadline: float | None, progress: Progress | None, done: int, total: int) -> dict:
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    network = config.network(cell)
    flops = network_flops(network, config.steps, config.batch)
    floor = floors(flops["total"], config.wavefront_steps, measurements.get("sgemm_fp32_tflops"),
                   measurements.get("launch_us"))
    result = {"preset": name, "config": config.to_dict(), "status": "ok", "reason": None, "flops": flops,
              "wavefront_steps": config.wavefront_steps, "floors": floor, "reference": None,
              "implementations": [], "warnings": []}
    if deadline is not None and time.monotonic() > deadline:
        result.update(status="skipped", reason=f"the run's time budget ({settings['time_budget_s']:g} s) was spent")
        return result
    need, free = estimate_cell_bytes(network, config, settings["buffers"]), free_device_bytes()
    if need > 0.9 * free:
        result.update(status="skipped", reason=f"needs about {need / 2**30:.1f} GiB of GPU memory, "
                      f"{free / 2**30:.1f} GiB are free (checked before allocating)")
        return result
    try:
        params = init_params(network, seed=settings["seed"])
        rng = cupy.random.RandomState(settings["seed"] + 1)
        shape = (config.steps, config.batch, config.input_size)
        inputs = [rng.standard_normal(shape, dtype=np.float32) for _ in range(settings["buffers"])]
        case = Case(name=name, cell=cell, preset=preset, config=config, network=network, params=params,
                    inputs=inputs, xp=cupy, device="cuda")
        if progress:
            progress(done, total, f"{name}/{config.name} float64 reference")
        reference, info = _reference(case)
        info.update(_check_reference(case, reference, flops["total"]))
        result["reference"] = info
        if info.get("cpu_check_ok") is False:
            result["warnings"].append(f"the GPU float64 reference differs from the NumPy reference by "
                                      f"{info['cpu_check_max_abs']:.3g}; errors below are suspect")
        entries = measure_cell(case, implementations, reference, reps=settings["reps"], warmup=settings["warmup"],
                               buffers=settings["buffers"], deadline=deadline, progress=progress, done=done + 1,
                               total=total, time_budget_s=settings["time_budget_s"])
    except EngineError as e:
        result.update(status="failed", reason=str(e))
        return result
    except Exception as e:  # e.g. out of memory in the reference: report the cell, go on to the next
        result.update(status="failed", reason=short_reason(e))
        return result
    finally:
        case = reference = inputs = None
        _free_device_memory()
    add_derived(entries, flops["total"], floor["floor_ms"])
    result["implementations"] = entries
    return result


def implementation_names(value) -> list[str] | None:
    """`implementations` as given to run_bench: None (every one), one name, or a list of names."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value):
        return list(value)
    raise BackendError(f"argument 'implementations' must be implementation names, got {type(value).__name__} "
                       f"{shown(value)}; hint: e.g. implementations=['cudnn-fp32', 'auto'], or leave it out for every "
                       "one")


def resolve_settings(*, quick: bool, reps, warmup, buffers, compile_budget_s, seed, time_budget_s) -> dict:
    if not isinstance(quick, (bool, np.bool_)):
        raise BackendError(f"argument 'quick' must be True or False, got {shown(quick)}; hint: quick=True for the "
                           "short settings")
    base = QUICK if quick else FULL
    settings = {"reps": base["reps"] if reps is None else reps,
                "warmup": base["warmup"] if warmup is None else warmup,
                "buffers": base["buffers"] if buffers is None else buffers,
                "compile_budget_s": base["compile_budget_s"] if compile_budget_s is None else compile_budget_s,
                "seed": seed, "quick": quick, "time_budget_s": time_budget_s}
    settings["quick"] = bool(quick)
    settings["seed"] = integer(seed, "argument 'seed'", low=0, high=2**32 - 1)
    for key, low in (("reps", MIN_REPS), ("warmup", 1), ("buffers", 2)):
        value = settings[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise BackendError(f"argument '{key}' must be an integer >= {low}, got {shown(value)}; hint: leave it out "
                               "for the default")
    for key in ("compile_budget_s", "time_budget_s"):
        value = settings[key]
        if value is not None and (not isinstance(value, (int, float)) or value < 0):
            raise BackendError(f"argument '{key}' must be a number of seconds >= 0, got {shown(value)}; hint: leave it "
                               "out for no limit")
    return settings


def run_bench(presets: Iterable = ("lstm",), configs: Iterable[BenchConfig | str] | None = None, *,
              implementations: list[str] | None = None, quick: bool = False, reps: int | None = None,
              warmup: int | None = None, buffers: int | None = None, compile_budget_s: float | None = None,
              time_budget_s: float | None = None, seed: int = 0, out_dir: str | Path | None = RESULTS_DIR,
              copy_to: str | Path | None = None, progress: Progress | None = None) -> dict:
    """Benchmark cells (preset names, Presets or CellGraphs) over configurations (BenchConfigs, anchor
    names or 'I,H,L,T,B'; all anchors by default). Returns the results document (see results.py) and
    writes it to out_dir (and copy_to) after every cell; results["saved_to"] lists the files.

    progress(done, total, label) is called before each step (the app draws a bar from it).
    """
    if isinstance(configs, (str, BenchConfig, NetBenchConfig)):
        configs = [configs]
    if configs is not None and not isinstance(configs, Iterable):
        raise BackendError(f"argument 'configs' must be BenchConfigs or config names, got {type(configs).__name__}; "
                           "hint: e.g. configs=['small'], or leave it out for every anchor")
    for folder, name in ((out_dir, "out_dir"), (copy_to, "copy_to")):   # before the work, not after the first cell
        if folder is not None:
            check_destination(as_path(folder, name) / "bench.json", "benchmark results", flag=name)
    implementations = implementation_names(implementations)
    if progress is not None and not callable(progress):
        raise BackendError(f"argument 'progress' must be a function progress(done, total, label), got "
                           f"{type(progress).__name__}; hint: leave it out for no progress reports")
    configs = [c for item in configs
               for c in ([item] if isinstance(item, (BenchConfig, NetBenchConfig)) else parse_configs([item]))] \
        if configs is not None else parse_configs(None)
    net_configs = [c for c in configs if isinstance(c, NetBenchConfig)]
    configs = [c for c in configs if isinstance(c, BenchConfig)]
    cells = _cells(presets)
    settings = resolve_settings(quick=quick, reps=reps, warmup=warmup, buffers=buffers,
                                compile_budget_s=compile_budget_s, seed=seed, time_budget_s=time_budget_s)
    net_rows = net_implementations(implementations) if net_configs else []
    chosen = select(default_implementations(settings["compile_budget_s"]), implementations) if configs else []
    settings["implementations"] = [i.name for i in chosen] or net_rows
    ok, why = backends.gpu_status()
    if not ok:
        raise BackendError(f"the benchmark needs a CUDA GPU: {why}. hint: run it on a machine with an NVIDIA "
                           "GPU and CuPy (`./run` installs both CuPy and, where nvidia-smi lists a GPU, the CUDA "
                           "wheels); the CPU tests do not need one")
    start = time.monotonic()
    deadline = start + time_budget_s if time_budget_s is not None else None
    total = len(cells) * (len(configs) * (len(chosen) + 1) + len(net_configs) * (len(net_rows) + 1))
    if progress:
        progress(0, total, "measuring the device (fp32 GEMM rate, launch cost)")
    measurements = {**measure_sgemm(), **measure_launch()}
    results = new_results(environment(), measurements, settings)
    paths = [Path(d) / results_filename(results) for d in (out_dir, copy_to) if d is not None]
    results["saved_to"] = [str(p) for p in paths]
    done = 0
    for name, cell, preset in cells:
        for config in configs:
            results["cells"].append(bench_cell(name, cell, preset, config, chosen, settings, measurements,
                                               deadline=deadline, progress=progress, done=done, total=total))
            done += len(chosen) + 1
            for path in paths:
                save_results(results, path)
        for config in net_configs:               # a whole network of blocks (engine/bench/nets.py)
            if progress:
                progress(done, total, f"{name}/{config.name} (net)")
            results.setdefault("nets", []).append(
                bench_net(name, cell, config, net_rows, reps=settings["reps"], warmup=settings["warmup"],
                          buffers=settings["buffers"], seed=seed, deadline=deadline))
            done += len(net_rows) + 1
            for path in paths:
                save_results(results, path)
    results["status"] = "complete"
    results["seconds"] = time.monotonic() - start
    for path in paths:
        save_results(results, path)
    if progress:
        progress(total, total, "done")
    return results
