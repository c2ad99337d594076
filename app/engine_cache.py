"""The pages' one door into the engine: cached engine calls, and the sizes form they are called with.

Engine objects (cells, plans, generated sources, reference runs) are cached across reruns and sessions.
A cell is keyed by its JSON text: a frozen CellGraph round-trips exactly through it, and hashing a
string is cheap and unambiguous. Parts of the engine that other issues add (engine.explain,
engine.export, engine.bench, engine.dsl_emit) are looked up with `optional()`, so a page can say
"not available yet" instead of failing when a module is missing.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import streamlit as st

import engine
from app import state
from engine import backends, memory
from engine.schedule import wavefront as build_wavefront

SIZE_FIELDS = ("input_size", "hidden_size", "num_layers", "steps", "batch")
SIZE_LABELS = {"input_size": "input size (I)", "hidden_size": "hidden size (H)", "num_layers": "layers (L)",
               "steps": "time steps (T)", "batch": "batch (B)", "proj_size": "projection size (P)"}
# What the forms accept. Beyond these a request is a typo, not an experiment.
SIZE_LIMITS = {"input_size": 65536, "hidden_size": 65536, "num_layers": 64, "steps": 65536, "batch": 65536,
               "proj_size": 65536}
# A plan describes every layer-step of the wavefront; past this many its JSON takes seconds to build
# (64 layers x 65536 steps: about two minutes and 100 MB).
PLAN_MAX_LAYER_STEPS = 100_000


# ---- sizes -------------------------------------------------------------------------------------

def size_problems(sizes: Mapping[str, object], limits: Mapping[str, int] = SIZE_LIMITS) -> list[str]:
    """One message per bad size, naming the field, what is wrong and what to do. Empty when all are fine."""
    problems = []
    for name, limit in limits.items():
        if name not in sizes:
            continue
        value = sizes[name]
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            problems.append(f"{name}: must be a whole number, got {value!r}. hint: type an integer such as 64")
        elif value < 1:
            problems.append(f"{name}: must be at least 1, got {value}. hint: sizes count things; use 1 or more")
        elif value > limit:
            problems.append(f"{name}: {value} is larger than the limit {limit}. hint: use at most {limit}")
    return problems


def plan_problems(sizes: Mapping[str, int]) -> list[str]:
    """Why a plan at these sizes would be too big to build inside a page (empty when it is fine)."""
    layer_steps = sizes["num_layers"] * sizes["steps"]
    if layer_steps <= PLAN_MAX_LAYER_STEPS:
        return []
    return [f"steps: {sizes['steps']} steps x {sizes['num_layers']} layers = {layer_steps} layer-steps, more than "
            f"the {PLAN_MAX_LAYER_STEPS} a plan is built for here. hint: use fewer steps; every step runs the "
            "same GEMMs and kernels"]


def typed_size(name: str, text: str, limit: int) -> tuple[int | None, str | None]:
    """(value, None) for a whole number from 1 to `limit` typed into the field `name`, else (None, why, naming the
    field): text, "12abc" and 2.5 are refused, never read as 0, 12 or 2."""
    typed = text.strip().replace("_", "")
    if not typed.isascii() or not typed.isdigit():
        return None, (f"{name}: {text!r} typed in '{SIZE_LABELS.get(name, name)}' is not a whole number. hint: type "
                      "digits only, such as 64 (the field keeps what you typed until you fix it)")
    value = int(typed)
    problems = size_problems({name: value}, {name: limit})
    return (None, problems[0]) if problems else (value, None)


_TYPED = "sizes.typed"          # page -> field -> the text last typed: kept while the field is not on screen


def sizes_ui(page: str, fields: tuple[str, ...] = SIZE_FIELDS, defaults: Mapping[str, int] | None = None,
             limits: Mapping[str, int] = SIZE_LIMITS, sets_design_sizes: bool = False) -> dict[str, int] | None:
    """A row of size fields, seeded from the design (state.design_sizes()) and re-seeded when the
    design's sizes change. Returns the sizes, or None after showing an st.error per bad field.

    The fields are text: what is typed is read whole or refused with a message naming the field, and stays in
    the field (also when the user visits another page and comes back: Streamlit forgets a widget that is not
    drawn, so the text is kept beside it). sets_design_sizes=True (the Designer): valid sizes become the design's
    sizes, and the seed follows them, so that the next run does not re-seed the fields from what this page itself
    just wrote (which would drop an edit made to another field in between)."""
    if defaults is None:
        defaults = state.design_sizes()
    seed = {f: int(defaults[f]) for f in fields}
    seed_key = f"{page}.sizes_seed"
    reseed = st.session_state.get(seed_key) != seed
    st.session_state[seed_key] = seed
    typed = st.session_state.setdefault(_TYPED, {}).setdefault(page, {})
    sizes: dict[str, int] = {}
    problems = []
    for column, name in zip(st.columns(len(fields)), fields):
        key = f"{page}.{name}"
        if reseed:
            typed[name] = str(seed[name])
        if reseed or key not in st.session_state:
            st.session_state[key] = typed.get(name, str(seed[name]))
        text = column.text_input(SIZE_LABELS[name], key=key, help=f"{name}: a whole number from 1 to {limits[name]}")
        typed[name] = text
        value, problem = typed_size(name, text, limits[name])
        if problem:
            problems.append(problem)
        else:
            sizes[name] = value
    for problem in problems:
        st.error(problem)
    if problems:
        return None
    if sets_design_sizes:
        state.set_design_sizes(**sizes)
        st.session_state[seed_key] = dict(sizes)
    return sizes


# ---- memory ------------------------------------------------------------------------------------

# What one run of the NumPy reference inside the app may take (parameters and values, float64). The CPU and
# the server are shared by every session; beyond this a run would swap or be killed, and the page with it.
MEMORY_LIMIT_BYTES = 4 << 30          # the app's own cap on one reference run, below the host's available memory


def memory_estimate(cell: engine.CellGraph, input_size: int, hidden_size: int, num_layers: int, steps: int,
                    batch: int, proj_size: int | None = None) -> dict[str, int]:
    """Bytes a reference run of `cell` at these sizes needs in the app: its parameters (engine.memory's count, float64)
    and its values (the app keeps every node's value of every layer-step for its plots, plus the input and the
    outputs). The app's one estimate: every page that runs the reference asks memory_problem first. Raises
    engine.EngineError for sizes the network refuses."""
    network = engine.Network(cell, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers,
                             proj_size=proj_size if cell.uses_projection else None)
    widest = max(input_size, hidden_size, network.projection_size)
    parameters = memory.parameter_bytes(network, itemsize=8)
    values = (len(cell.nodes) * num_layers * (steps + 1) + 2 * steps) * batch * widest * 8
    return {"parameters": parameters, "values": values, "total": parameters + values}


def memory_limit() -> int:
    """The app's cap, or the host memory available now where that is less (engine.memory.limit_bytes)."""
    available = memory.limit_bytes("host")
    return MEMORY_LIMIT_BYTES if available is None else min(MEMORY_LIMIT_BYTES, available)


def memory_problem(cell: engine.CellGraph, what: str, **sizes) -> str | None:
    """Why the reference run `what` of `cell` at these sizes is refused (its memory figure and the limit), or None.
    Raises engine.EngineError for sizes the network refuses."""
    estimate = memory_estimate(cell, **sizes)
    limit = memory_limit()
    if estimate["total"] <= limit:
        return None
    shown = ", ".join(f"{k} {v}" for k, v in sizes.items() if v is not None)
    return (f"sizes ({shown}): {what} of cell '{cell.name}' would need about {memory.size_text(estimate['total'])} "
            f"(parameters {memory.size_text(estimate['parameters'])}, values {memory.size_text(estimate['values'])}), "
            f"more than the limit of {memory.size_text(limit)}. hint: use a smaller hidden_size or input_size here; "
            "the plan and the CUDA export take any size")


# ---- optional engine parts ---------------------------------------------------------------------

def optional(module: str, attr: str) -> Callable | None:
    """engine `module`.`attr`, or None when that module (or the name in it) does not exist.

    Only a missing module counts as "not available": an import error inside an existing module is a
    bug and is raised.
    """
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            return None
        raise
    return getattr(found, attr, None)


def bench_results_dir() -> Path | None:
    """The folder of saved benchmark results the Benchmarks page reads: RNN_RESULTS_DIR (the README's pictures
    read docs/demo/results), else None (engine.bench's benchmarks/results/)."""
    folder = os.environ.get("RNN_RESULTS_DIR")
    return Path(folder) if folder else None


def gpu_status() -> tuple[bool, str]:
    return backends.gpu_status()


# ---- cached engine calls -----------------------------------------------------------------------

@st.cache_resource(show_spinner=False)
def presets() -> dict[str, engine.Preset]:
    return engine.presets()


@st.cache_resource(show_spinner=False)
def cell_from_json(cell_json: str) -> engine.CellGraph:
    return engine.from_json(cell_json)


@st.cache_data(show_spinner=False, max_entries=64)
def wavefront(num_layers: int, num_steps: int) -> dict:
    return build_wavefront(num_layers, num_steps).to_dict()


@st.cache_data(show_spinner="Compiling the plan...", max_entries=32)
def plan(cell_json: str, input_size: int, hidden_size: int, num_layers: int, steps: int, batch: int,
         schedule: str | None = None, autotune_stamp: str | None = None, precision: str = "float32",
         proj_size: int | None = None, allow_tensor_core_fp32: bool = False) -> dict | None:
    """engine.explain.explain_json for the cell at these sizes, or None when engine.explain does not exist.

    schedule: passed on (a wavefront schedule brings its generated CUDA); precision: the mode the GPU
    schedules are planned in; allow_tensor_core_fp32: the autotuner's choices shown are those tuned with float32x3
    allowed (engine.run's flag of that name). autotune_stamp is only part of the cache key: pass autotune_stamp() so that a
    new autotuner choice shows up."""
    explain_json = optional("engine.explain", "explain_json")
    if explain_json is None:
        return None
    extra = {} if schedule is None else {"schedule": schedule}
    if precision != "float32":
        extra["precision"] = precision
    if allow_tensor_core_fp32:
        extra["allow_tensor_core_fp32"] = True
    cell = cell_from_json(cell_json)
    if proj_size is not None and cell.uses_projection:      # a Network carries P into explain
        cell = engine.Network(cell, input_size, hidden_size, num_layers, proj_size)
    return explain_json(cell, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, steps=steps,
                        batch=batch, **extra)


def autotune_stamp() -> str | None:
    """Which autotuner cache file there is and when it last changed ("<path>@<mtime>", or "<path>@absent")."""
    cache_path = optional("engine.schedules.autotune", "cache_path")
    if cache_path is None:
        return None
    path = cache_path()
    try:
        return f"{path}@{path.stat().st_mtime_ns}"
    except OSError:
        return f"{path}@absent"


@st.cache_data(show_spinner="Generating CUDA...", max_entries=32)
def cuda_source(cell_json: str, input_size: int, hidden_size: int, num_layers: int) -> str | None:
    """The exported .cu for the cell, or None when engine.export does not exist."""
    export_cuda = optional("engine.export", "export_cuda")
    if export_cuda is None:
        return None
    return export_cuda(cell_from_json(cell_json), input_size=input_size, hidden_size=hidden_size,
                       num_layers=num_layers)


@st.cache_data(show_spinner=False, max_entries=64)
def dsl_source(cell_json: str) -> str | None:
    """The cell written back as DSL, or None when engine.dsl_emit does not exist."""
    emit_dsl = optional("engine.dsl_emit", "emit_dsl")
    if emit_dsl is None:
        return None
    return emit_dsl(cell_from_json(cell_json))


@st.cache_data(show_spinner="Running the NumPy reference...", max_entries=32)
def reference_sample(cell_json: str, input_size: int, hidden_size: int, num_layers: int, steps: int = 3,
                     batch: int = 2, seed: int = 0, proj_size: int | None = None) -> dict:
    """A small run of the reference backend on a random input, for the designer to show what the cell
    computes: shapes, a few output values, whether everything is finite."""
    cell = cell_from_json(cell_json)
    network = engine.Network(cell, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers,
                             proj_size=proj_size if cell.uses_projection else None)
    params = engine.init_params(network, seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal((steps, batch, input_size))   # (T, B, I)
    result = engine.run(network, params, x, backend="reference", dtype=np.float64)
    outputs = np.asarray(result.outputs)                                               # (T, B, H)
    finals = {name: np.asarray(v) for name, v in result.final_states.items()}          # (L, B, H)
    return {"x_shape": list(x.shape), "outputs_shape": list(outputs.shape),
            "final_shapes": {name: list(v.shape) for name, v in finals.items()},
            "first_values": outputs[-1, 0, :6].tolist(), "max_abs": float(np.max(np.abs(outputs))),
            "finite": bool(np.isfinite(outputs).all() and all(np.isfinite(v).all() for v in finals.values()))}


@st.cache_data(show_spinner="Running the NumPy reference...", max_entries=32)
def reference_divergence(cell_json: str, input_size: int, hidden_size: int, num_layers: int, steps: int,
                         batch: int, seed: int = 0, precision: str = "float32",
                         proj_size: int | None = None) -> dict[str, list[float]]:
    """Per-step max and mean |out - float64| of the reference backend on one random input.

    The float64 run is the definition. precision="float32": the reference in float32, how rounding
    accumulates through the recurrence; "tf32" / "float16" / "bfloat16": the reference emulating that mode
    (every matmul operand rounded as the GPU schedules round it, the rest in float64), so the curve is the
    mode's own divergence. All runs use the same parameters and input, drawn from `seed`.
    """
    cell = cell_from_json(cell_json)
    network = engine.Network(cell, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers,
                             proj_size=proj_size if cell.uses_projection else None)
    params = engine.init_params(network, seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal((steps, batch, input_size))   # (T, B, I)
    exact = engine.run(network, params, x, backend="reference", dtype=np.float64).outputs          # (T, B, H)
    if precision == "float32":
        out = engine.run(network, params.astype(np.float32), x.astype(np.float32), backend="reference",
                         dtype=np.float32).outputs                                              # (T, B, H)
    else:
        out = engine.run(network, params, x, backend="reference", dtype=np.float64, precision=precision).outputs
    error = np.abs(out.astype(np.float64) - exact).reshape(steps, -1)
    return {"max_abs": error.max(axis=1).tolist(), "mean_abs": error.mean(axis=1).tolist()}
