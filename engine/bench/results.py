"""Benchmark results: a versioned JSON document, its loader, its listing and its markdown table.

Schema (version 1), every time in ms, every size in bytes:

    {"schema": "rnn-engine/bench-results", "version": 1, "created": ISO date, "status": "complete"|"partial",
     "environment": {device, compute_capability, driver, cuda_runtime, cupy, torch, torch_cuda, cudnn, ...},
     "device_measurements": {"sgemm_fp32_tflops", "sgemm_size", "launch_us", ...},
     "settings": {"reps", "warmup", "buffers", "seed", "compile_budget_s", "quick", ...},
     "cells": [{"preset", "config": {name, input_size, hidden_size, num_layers, steps, batch},
                "status": "ok"|"skipped"|"failed", "reason", "flops": {per_step, total, ...},
                "wavefront_steps", "floors": {compute_ms, latency_ms, floor_ms}, "reference": {...},
                "implementations": [{"name", "family", "precision": "fp32"|"tf32"|"fp16"|"bf16",
                                     "status": "ok"|"unavailable"|"failed"|"skipped",
                                     "reason", "tf32", "tf32_flags", "median_ms", "min_ms", "max_ms", "reps",
                                     "tflops", "vs_floor", "peak_bytes", "first_call_s",
                                     "error": {max_abs, mean_abs, rel, ...}, "error_vs_cudnn_fp32",
                                     "speedup": {"vs_cudnn_fp32", "vs_naive", "vs_cudnn_same"},
                                     "divergence": {"vs_reference": {"max": [T], "mean": [T]},
                                                    "vs_cudnn_fp32": {...}},
                                     "detail": {...}}]}],
     "nets": [{"preset", "config": {name, net, input_size, hidden_size, layers, steps, batch}, "net": the net's
               JSON, "status", "block_steps", "flops_total", "reference": {...},
               "implementations": [{"name", "family", "precision", "status", "reason", "tf32", "tf32_flags",
                                    "median_ms", ..., "error", "divergence", "tflops",
                                    "speedup": {"vs_cudnn_fp32"}}]}]          (only when a net config ran)

Rows are named by implementation and precision: "persistent" and "cudnn-fp32" are fp32 (TF32 off),
"persistent-bf16" and "cudnn-bf16" their bfloat16 counterparts. speedup["vs_cudnn_same"] is over the
cuDNN row of the entry's own precision; files written before it existed lack it (readers show "-").

The app reads it through load_results / list_results and draws it; it never recomputes it.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

from ..arguments import shown
from ..errors import BackendError
from ..files import error_of, load_json, write_text

SCHEMA = "rnn-engine/bench-results"
SCHEMA_VERSION = 1
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def new_results(environment: dict, device_measurements: dict, settings: dict) -> dict:
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "created": datetime.now(timezone.utc).isoformat(),
            "status": "partial", "environment": environment, "device_measurements": device_measurements,
            "settings": settings, "cells": []}


def results_filename(results: dict, kind: str = "bench") -> str:
    """<kind>-<date>-<device>.json: "bench" for run_bench's documents, "train" for the training-step benchmark."""
    stamp = results.get("created", "")[:19].replace(":", "").replace("-", "").replace("T", "-")
    device = re.sub(r"[^A-Za-z0-9]+", "-", str(results.get("environment", {}).get("device", "device"))).strip("-")
    return f"{kind}-{stamp or 'undated'}-{device or 'device'}.json"


def save_results(results: dict, path: str | Path) -> Path:
    """Write atomically (engine.files: a reader never sees half a file, a failed write leaves no temporary);
    returns the path."""
    return write_text(path, json.dumps(results, separators=(",", ":"), allow_nan=False), "benchmark results")


def read_document(path: str | Path, schema: str, label: str, kind: str, *, missing_hint: str = "",
                  version: int | None = None) -> dict:
    """A JSON document of `schema` (and `version`, when given) with a list of 'cells'; BackendError naming the file
    as `label` ("results file") and what it is not (`kind`: "a benchmark result")."""
    hint = missing_hint.removeprefix(". hint: ") or f"pass {kind} file written by the benchmark"
    data = load_json(path, label, error=error_of(BackendError), hint=hint)
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise BackendError(f"{label} {path} is not {kind} (schema "
                           f"{shown(data.get('schema') if isinstance(data, dict) else None)}, expected {schema!r}); "
                           f"hint: {hint}")
    if version is not None and (type(data.get("version")) is not int or data["version"] != version):
        raise BackendError(f"{label} {path} has schema version {shown(data.get('version'))}; this engine reads "
                           f"version {version}. hint: re-run the benchmark")
    if not isinstance(data.get("cells"), list):
        raise BackendError(f"{label} {path}: field 'cells' must be a list; hint: {hint}")
    return data


def readable_documents(pattern: str, load, directory: str | Path | None = None) -> list[tuple[Path, dict]]:
    """(path, document) of every file matching `pattern` in `directory` (default benchmarks/results/) that `load`
    reads; the others are skipped."""
    directory = Path(directory) if directory is not None else RESULTS_DIR
    found = []
    for path in sorted(directory.glob(pattern)):
        try:
            found.append((path, load(path)))
        except BackendError:
            continue
    return found


def load_results(path: str | Path) -> dict:
    """A results document, checked for its schema name and version."""
    return read_document(path, SCHEMA, "results file", "a benchmark result",
                         missing_hint=". hint: see list_results()", version=SCHEMA_VERSION)


def unreadable_results(directory: str | Path | None = None) -> list[tuple[str, str]]:
    """(path, why) of every bench-*.json in `directory` (the name results_filename gives) that list_results skips:
    not JSON, not a results document, another schema version. The files are left as they are. The folder's other
    JSON files (probe outputs, phase profiles, pipeline sweeps, training steps) are not results documents and are
    not reported: the Benchmarks page warned about each of them."""
    directory = Path(directory) if directory is not None else RESULTS_DIR
    bad = []
    for path in sorted(directory.glob("bench-*.json")):
        try:
            load_results(path)
        except BackendError as e:
            bad.append((str(path), str(e)))
    return bad


def list_results(directory: str | Path | None = None) -> list[dict]:
    """Every readable results file in `directory` (default benchmarks/results/), newest first:
    [{"path", "created", "device", "status", "presets", "configs"}]. Unreadable files are skipped here;
    unreadable_results() says which and why."""
    found = []
    for path, data in readable_documents("*.json", load_results, directory):
        cells = data["cells"]
        found.append({"path": str(path), "created": data.get("created", ""),
                      "device": data.get("environment", {}).get("device"), "status": data.get("status"),
                      "presets": sorted({c.get("preset") for c in cells}),
                      "configs": sorted({c.get("config", {}).get("name") for c in cells})})
    return sorted(found, key=lambda r: r["created"], reverse=True)


# ---- the table ---------------------------------------------------------------------------------

def _ms(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def implementation_names(results: dict) -> list[str]:
    """Implementation names in the order they first appear."""
    names: dict[str, None] = {}
    for cell in results.get("cells", []):
        for entry in cell.get("implementations", []):
            names.setdefault(entry["name"], None)
    return list(names)


def same_mode_speedup(entry: dict) -> float | None:
    """The speedup over cuDNN in the entry's own reduced precision, where that is a different row from
    cuDNN fp32 and from the entry itself (cudnn-bf16 for persistent-bf16); else None."""
    precision = entry.get("precision")
    if precision in (None, "fp32") or entry.get("name") == f"cudnn-{precision}":
        return None
    return (entry.get("speedup") or {}).get("vs_cudnn_same")


def _ratios(entry: dict) -> str:
    """' (2.10x)', ' (2.10x; 1.30x same mode)', ' (2.10x; err 1.2x cuDNN)' (fp32x3) or ''."""
    speedup = (entry.get("speedup") or {}).get("vs_cudnn_fp32")
    same = same_mode_speedup(entry)
    bound = entry.get("error_vs_cudnn_bound") or {}
    parts = ([f"{speedup:.2f}x"] if speedup else []) + ([f"{same:.2f}x same mode"] if same else [])
    parts += [f"err {bound['ratio']:.2g}x cuDNN"] if bound.get("ratio") is not None else []
    return f" ({'; '.join(parts)})" if parts else ""


def markdown_table(results: dict) -> str:
    """One row per (cell, configuration); per implementation the median ms, and in parentheses the
    speedup over cuDNN fp32 (TF32 off) where that ran, and for the engine's reduced-precision rows the
    speedup over cuDNN in the same mode. n/a: unavailable; fail: wrong output."""
    names = implementation_names(results)
    header = ["cell", "config", "I,H,L,T,B", "floor ms (compute / latency)", *names]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in results.get("cells", []):
        config = cell.get("config", {})
        shape = ",".join(str(config.get(k)) for k in ("input_size", "hidden_size", "num_layers", "steps", "batch"))
        floors = cell.get("floors") or {}
        row = [str(cell.get("preset")), str(config.get("name")), shape,
               f"{_ms(floors.get('compute_ms'))} / {_ms(floors.get('latency_ms'))}"]
        by_name = {e["name"]: e for e in cell.get("implementations", [])}
        for name in names:
            entry = by_name.get(name)
            if cell.get("status") != "ok" and entry is None:
                row.append(cell.get("status", "-"))
            elif entry is None:
                row.append("-")
            elif entry["status"] == "ok":
                row.append(_ms(entry["median_ms"]) + _ratios(entry))
            else:
                row.append({"unavailable": "n/a", "failed": "fail", "skipped": "skip"}.get(entry["status"], "-"))
        lines.append("| " + " | ".join(row) + " |")
    device = results.get("environment", {}).get("device", "?")
    lines.append("")
    lines.append(f"Median ms over {results.get('settings', {}).get('reps', '?')} repetitions on {device}; "
                 "(Nx) = speedup over cuDNN fp32 with TF32 off"
                 + ("; (Nx; Mx same mode): M = speedup over cuDNN in the row's own precision (cudnn-bf16 for "
                    "persistent-bf16)." if _any_same_mode(results) else ".")
                 + (" err Mx cuDNN (fp32x3 rows): max relative error against float64 over cuDNN fp32's on the same "
                    "inputs (bound 2x)." if _any_bound(results) else ""))
    return "\n".join(lines)


def _any_bound(results: dict) -> bool:
    return any(e.get("error_vs_cudnn_bound") for cell in results.get("cells", []) for e in cell.get("implementations", []))


def _any_same_mode(results: dict) -> bool:
    return any(e.get("status") == "ok" and same_mode_speedup(e) for cell in results.get("cells", [])
               for e in cell.get("implementations", []))


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def text_summary(results: dict) -> str:
    """Per cell: the napkin math (FLOPs and both floors), then one line per implementation with its
    time beside the floor, speedups, error and peak memory; reasons for anything that did not run."""
    measured = results.get("device_measurements", {})
    lines = []
    for cell in results.get("cells", []):
        config = cell.get("config", {})
        shape = " ".join(f"{k}={config.get(key)}" for k, key in (("I", "input_size"), ("H", "hidden_size"),
                                                                  ("L", "num_layers"), ("T", "steps"), ("B", "batch")))
        lines.append(f"{cell.get('preset')} / {config.get('name')} ({shape})")
        if cell.get("status") != "ok":
            lines.append(f"  {cell.get('status')}: {cell.get('reason')}")
            lines.append("")
            continue
        floors = cell.get("floors", {})
        lines.append(f"  {cell['flops']['total'] / 1e9:.3g} GFLOP; floors: compute {_fmt(floors.get('compute_ms'), '.3g')} ms "
                     f"(fp32 GEMM {_fmt(measured.get('sgemm_fp32_tflops'), '.1f')} TFLOP/s), latency "
                     f"{_fmt(floors.get('latency_ms'), '.3g')} ms ({cell.get('wavefront_steps')} wavefront steps x "
                     f"{_fmt(measured.get('launch_us'), '.2f')} us)")
        for warning in cell.get("warnings", []):
            lines.append(f"  warning: {warning}")
        lines.append(f"  {'implementation':<15} {'median ms':>10} {'min-max ms':>17} {'x floor':>8} {'TFLOP/s':>8} "
                     f"{'vs cuDNN':>8} {'vs same':>8} {'vs naive':>8} {'rel err':>9} {'peak MiB':>9}  tf32")
        for e in cell.get("implementations", []):
            if e["status"] != "ok":
                lines.append(f"  {e['name']:<15} {e['status']}: {e.get('reason')}")
                continue
            speedup = e.get("speedup") or {}
            peak = e.get("peak_bytes")
            lines.append(
                f"  {e['name']:<15} {e['median_ms']:>10.3f} {e['min_ms']:>8.3f}-{e['max_ms']:<8.3f} "
                f"{_fmt(e.get('vs_floor'), '.1f'):>8} {_fmt(e.get('tflops'), '.2f'):>8} "
                f"{_fmt(speedup.get('vs_cudnn_fp32'), '.2f'):>8} {_fmt(speedup.get('vs_cudnn_same'), '.2f'):>8} "
                f"{_fmt(speedup.get('vs_naive'), '.2f'):>8} "
                f"{_fmt((e.get('error') or {}).get('rel'), '.2e'):>9} "
                f"{_fmt(None if peak is None else peak / 2**20, '.1f'):>9}  {'on' if e.get('tf32') else 'off'}")
        for e in cell.get("implementations", []):
            bound = e.get("error_vs_cudnn_bound")
            if bound:
                lines.append(f"  {e['name']}: rel err {bound['rel']:.2e} against cuDNN fp32's {bound['cudnn_fp32_rel']:.2e}"
                             f" on the same inputs: {bound['ratio']:.3g}x ({'within' if bound['within'] else 'over'} "
                             f"the {bound['bound']:g}x bound)")
        lines.append("")
    for net in results.get("nets", []):
        config = net.get("config", {})
        lines.append(f"{net.get('preset')} / {config.get('name')} (network: I={config.get('input_size')} "
                     f"H={config.get('hidden_size')} T={config.get('steps')} B={config.get('batch')}; "
                     f"{net.get('flops_total', 0) / 1e9:.3g} GFLOP)")
        for e in net.get("implementations", []):
            if e["status"] != "ok":
                lines.append(f"  {e['name']:<15} {e['status']}: {e.get('reason')}")
                continue
            lines.append(f"  {e['name']:<15} {e['median_ms']:>10.3f} {e['min_ms']:>8.3f}-{e['max_ms']:<8.3f} "
                         f"{_fmt((e.get('speedup') or {}).get('vs_cudnn_fp32'), '.2f'):>8} "
                         f"{_fmt((e.get('error') or {}).get('rel'), '.2e'):>9}  tf32 off")
        lines.append("")
    lines.append("x floor: median over the larger floor; vs cuDNN (fp32, TF32 off), vs same (cuDNN in the row's "
                 "own precision) and vs naive: times faster; rel err: max |out - ref| / max |ref| against the "
                 "float64 reference.")
    return "\n".join(lines)
