"""The autotuner: time the schedules that can run a network, keep the fastest, remember it on disk.

    choice = tune(network, params, steps=100, batch=64)      # times candidates, or reads the cache
    choice.schedule, choice.config, choice.why                # e.g. "persistent", TileConfig(...), "..."

Candidates: the fused backend (strict float32, and tf32, float16 and bfloat16 through
engine/schedules/fused_modes.py), and, when the program allows the wavefront tiling, the
persistent kernel with a few tilings (accumulator tiles suited to the batch; as many blocks as SMs,
and half as many) and the graph schedule. Each candidate runs once on fresh random inputs and is
compared with the first candidate's output (relative error over 1e-4 in float32, 1e-2 in a reduced
precision, disqualifies it: a fast wrong answer is never chosen), then timed: the median wall time of `repeats` runs,
which is what a caller of engine.run waits for. Each of those timings follows the candidate's compile, seconds in
which the GPU idles and its clock drops, so the first pass only shortlists: the candidates within 10% of its best
(three at most) run again after a warm-up, taking turns in three rounds (runoff()), and the fastest median of the
runoff is the choice.

fp32 on tensor cores is opt-in: with allow_tensor_core_fp32=True, precision="float32" also times every candidate in
float32x3 (3xTF32, engine/codegen/precision.py; the fused backend's without lengths), held to the float32 tolerance
against the first (strict) candidate like the others and, further, to at most X3_ERROR_BOUND times the strict
candidate's relative error against float64 on the same input (X3Gate), and the choice records the mode it runs in
(Choice.precision). Without the flag no float32x3 candidate is tried, and the two are cached under different keys
(the mode segment "float32+3xtf32-gated-wgmma": choices cached before X3Gate ("float32+3xtf32"), before the fused
candidate's parts were fp16 ("float32+3xtf32-gated") or before its step products ran on the engine's wgmma kernel
("float32+3xtf32-gated-fp16") are not read).

With lengths (a batch padded at the end, engine/backends/lengths.py) the candidates are those that take it (not the
scan), built with the kernels that hold the rows past their end (engine/passes/lengths.py), and run on random lengths
in [T/2, T]; the choice is cached apart from the one without lengths.

The cache is one JSON file (default ~/.cache/cellforge/autotune.json, or $CELLFORGE_CACHE_DIR),
keyed by the program key (cell structure, passes, layout, precision, generator version), the sizes,
T, B, the device name and whether lengths are given. Writes take a lock file and replace the file atomically (temporary file,
then rename), so two processes tuning at once both leave a valid file. A file that does not parse is
reported, moved aside as `autotune.json.corrupt-<time>`, and rebuilt; it is never trusted.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ..arguments import shown
from ..backends import fused, naive
from ..backends.common import check_float32_only, check_precision
from ..chunk_replay import release_retired
from ..codegen import GENERATOR_VERSION
from ..compiler import compile_program
from ..errors import BackendError, CompileError, FileError
from ..files import cache_root, load_json, write_text
from ..network import Network
from ..params import Params
from ..passes.scan import analyse_scan
from . import fused_modes, scan
from .registry import schedule_class
from .tiling import GEMV_MAX_ROWS, DeviceLimits, TileConfig, eligibility, make_tiling

try:
    import fcntl
except ImportError:                        # pragma: no cover - Windows has no flock
    fcntl = None

log = logging.getLogger("engine.autotune")
CACHE_VERSION = 1
DISQUALIFY_REL_ERR = 1e-4
# In a reduced precision the candidates are compared with the first one in the same mode: they multiply the same
# rounded operands, but a different summation order can flip a rounding of h, which then propagates.
DISQUALIFY_REL_ERR_REDUCED = 1e-2
# The runoff: the first pass times each candidate right after its compile, while the GPU has idled for seconds, so
# a close second can win on the clock's ramp. Candidates within RUNOFF_WITHIN of the first pass's best (at most
# RUNOFF_FINALISTS) are timed again after a warm-up, in RUNOFF_ROUNDS interleaved rounds.
# float32x3 candidates: relative error against float64 at most this many times the strict fp32 candidate's (X3Gate)
X3_ERROR_BOUND = 2.0
RUNOFF_WITHIN = 0.10
RUNOFF_FINALISTS = 3
RUNOFF_ROUNDS = 3
RUNOFF_WARM_MS = 100.0


@dataclass(frozen=True)
class Candidate:
    schedule: str                      # "fused", "graph", "persistent" or "scan"
    config: TileConfig | None = None
    precision: str | None = None       # the mode it runs in, when not the tune's own (float32x3 for float32)

    def label(self) -> str:
        label = self.schedule if self.config is None else f"{self.schedule} ({self.config.label()})"
        return label if self.precision is None else f"{label} [{self.precision}]"


@dataclass
class Choice:
    schedule: str
    config: TileConfig | None
    why: str
    key: str
    timings: list = field(default_factory=list)   # [{"candidate", "ms" | "error"}]
    cached: bool = False
    precision: str | None = None       # the mode the choice runs in, when not the tuned one (float32x3)

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.schedule, self.config, self.precision)

    def to_dict(self) -> dict:
        found = {"schedule": self.schedule, "config": None if self.config is None else asdict(self.config),
                 "why": self.why, "timings": self.timings}
        return found if self.precision is None else dict(found, precision=self.precision)

    @staticmethod
    def from_dict(key: str, data: dict) -> "Choice":
        config = None if data.get("config") is None else TileConfig(**data["config"])
        if config is not None and config.warp_tile is not None:       # JSON has lists, TileConfig hashes tuples
            config = replace(config, warp_tile=tuple(config.warp_tile))
        if data["schedule"] not in ("fused", "graph", "persistent", "scan"):
            raise ValueError(f"unknown schedule {data['schedule']!r}")
        mode = data.get("precision")
        if mode is not None and mode != "float32x3":
            raise ValueError(f"unknown precision {mode!r}")
        return Choice(data["schedule"], config, data["why"], key, list(data.get("timings", [])), cached=True,
                      precision=mode)


def tile_shapes(batch: int, precision: str = "float32") -> list[tuple[int, int]]:
    """Accumulator tiles (rows x columns per thread) worth trying at this batch size (the warp GEMV of
    small batches and the tensor-core path of reduced precisions have none: one shape stands for them)."""
    if batch <= GEMV_MAX_ROWS or precision != "float32":
        return [(1, 4)] if batch <= GEMV_MAX_ROWS else [(4, 4)]
    if batch <= 8:
        return [(2, 4), (4, 4)]
    return [(4, 4), (8, 4), (4, 8), (8, 8)]      # 8x8: GRU blogA 34.8 -> 27.7 ms on an H200, slower elsewhere


def candidates(network: Network, batch: int, limits: DeviceLimits, precision: str = "float32",
               lengths: bool = False, tensor_core_fp32: bool = False) -> list[Candidate]:
    """What tune() times: the fused backend (fused_modes.TUNED_MODES) and the schedules that take the cell. lengths:
    only those that take it (the scan runs batches of one length). tensor_core_fp32 (precision "float32" only): the
    schedule candidates once more in float32x3, after the strict ones (the first candidate stays strict fp32)."""
    found = _candidates(network, batch, limits, precision, lengths)
    if tensor_core_fp32 and precision == "float32":
        try:
            found += [replace(c, precision="float32x3") for c in _candidates(network, batch, limits, "float32x3",
                                                                               lengths)]
        except BackendError:
            pass                         # no wavefront schedule for this cell: the strict candidates stand alone
    return found


def _candidates(network: Network, batch: int, limits: DeviceLimits, precision: str,
                lengths: bool) -> list[Candidate]:
    program = compile_program(network.cell, layout="interleaved", precision=precision, lengths=lengths)
    tuned = precision in fused_modes.TUNED_MODES and not (lengths and precision == "float32x3")   # X3Gate: no lengths
    found = [Candidate("fused")] if precision == "float32" or tuned else []
    if not lengths and analyse_scan(network.cell).qualifies:   # a linear recurrence, in any mode
        found.append(Candidate("scan"))
    why = eligibility(program)
    if why is not None:
        if not found:
            raise BackendError(f"precision '{precision}' runs on the wavefront schedules only, and they cannot run "
                               f"cell '{network.cell.name}': {why}; hint: use precision='float32'")
        return found
    H, L = network.hidden_size, network.num_layers
    full = -(-H // max(1, limits.multiprocessors // L))
    threads = (128, 256) if batch <= GEMV_MAX_ROWS else (None,)
    for units in dict.fromkeys((full, min(H, 2 * full))):
        for rb, rc in tile_shapes(batch, precision):
            for n in threads:
                found.append(Candidate("persistent", TileConfig(units, rb, rc, n)))
    first = next(c for c in found if c.schedule == "persistent")
    by_head = replace(first.config, sync="head")          # cells whose step GEMMs all read one head (the sLSTM)
    try:
        make_tiling(program, network, batch, by_head, limits)
        found.append(Candidate("persistent", by_head))
    except CompileError:
        pass
    # Clusters of a head's (or a small layer's) blocks, 8 and 16 a cluster (engine/schedules/cluster.py)
    try:
        tiling = make_tiling(program, network, batch, TileConfig(sync="cluster"), limits)
        found.append(Candidate("persistent", TileConfig(sync="cluster")))
        if tiling.cluster <= 8 and tiling.units_per_block % 2 == 0:
            halved = TileConfig(tiling.units_per_block // 2, sync="cluster")
            make_tiling(program, network, batch, halved, limits)
            found.append(Candidate("persistent", halved))
    except CompileError:
        pass                                             # no clusters for this cell or size (the error says why)
    if L > 1:
        # The other barrier than the default (TileConfig.sync=None: per-layer arrival counters for the warp GEMV of
        # small batches, grid barriers otherwise): each wins somewhere, so it is timed rather than assumed.
        found.append(Candidate("persistent", replace(first.config, sync="grid" if batch <= GEMV_MAX_ROWS else "layer")))
        # layer by layer: one layer's weights fit on chip when all do not; or half the layers a launch (a deep
        # stack, e.g. DeepSpeech's 8 layers joined through their pool, whose halves fit as 4-layer stacks do)
        if L >= 4 and L % 2 == 0:
            rb, rc = tile_shapes(batch, precision)[0]
            found.append(Candidate("persistent", TileConfig(None, rb, rc, threads[0], layers_per_launch=L // 2)))
        for rb, rc in tile_shapes(batch, precision)[:2]:
            found.append(Candidate("persistent", TileConfig(None, rb, rc, threads[0], layers_per_launch=1)))
    found.append(Candidate("graph", TileConfig(full, *tile_shapes(batch, precision)[0], resident=False)))
    return found


def check_tensor_core_fp32(allow, precision: str) -> bool:
    """allow_tensor_core_fp32 checked: a bool, and only with precision="float32" (the mode it widens)."""
    if not isinstance(allow, bool):
        raise BackendError(f"argument 'allow_tensor_core_fp32' must be True or False, got {shown(allow)}; hint: True "
                           "lets backend='auto' pick float32x3 (3xTF32 tensor cores) for precision='float32'")
    if allow and precision != "float32":
        raise BackendError(f"allow_tensor_core_fp32=True widens precision='float32' only, not {precision!r}; hint: "
                           "leave it False, or use precision='float32'")
    return allow


def cache_path(name: str = "autotune.json") -> Path:
    """The cache file `name` (autotune.json: the schedules' choices; pipelines.json: engine.multigpu's tuned plans)
    in $CELLFORGE_CACHE_DIR, else ~/.cache/cellforge."""
    return cache_root() / name


def cache_key(network: Network, steps: int, batch: int, device: str, precision: str = "float32",
              lengths: bool = False, tensor_core_fp32: bool = False) -> str:
    program = compile_program(network.cell, layout="interleaved", precision=precision)
    mode = tuned_mode(precision, tensor_core_fp32)
    return (f"{program.key}|gen{GENERATOR_VERSION}|I{network.input_size}|H{network.hidden_size}|"
            f"L{network.num_layers}|T{steps}|B{batch}|{mode}|{device}" + ("|lengths" if lengths else ""))


def tuned_mode(precision: str, tensor_core_fp32: bool) -> str:
    """The mode segment of a cache key: the precision, or "float32+3xtf32-gated-wgmma" when float32 may take
    float32x3 (candidates held to X3Gate's bound, the fused one in fp16 parts on the wgmma step product where the GPU
    has it; a choice cached before any of these, "float32+3xtf32", "float32+3xtf32-gated" or
    "float32+3xtf32-gated-fp16", is tuned again)."""
    return f"{precision}+3xtf32-gated-wgmma" if tensor_core_fp32 and precision == "float32" else precision


@contextmanager
def _locked(path: Path):
    """An exclusive lock beside the cache file (POSIX flock; a no-op where fcntl does not exist)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:                      # pragma: no cover - Windows
        yield
        return
    with open(path.with_suffix(path.suffix + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_cache(path: Path | None = None) -> dict:
    """The cache's entries; a corrupt file is reported and moved aside, never trusted."""
    path = path or cache_path()
    if not path.exists():
        return {}
    try:
        data = load_json(path, "autotune cache", hint="it is rebuilt")   # FileError: unreadable, not JSON, too deep
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(
                data.get("entries"), dict):
            raise ValueError(f"version {shown(data.get('version') if isinstance(data, dict) else None)}, expected "
                             f"{CACHE_VERSION}")
        return data["entries"]
    except (ValueError, FileError) as e:
        stamp = int(time.time())
        aside = path.with_name(f"{path.name}.corrupt-{stamp}")
        copies = 0
        while aside.exists():              # corrupt twice within a second: keep the earlier copy too
            copies += 1
            aside = path.with_name(f"{path.name}.corrupt-{stamp}-{copies}")
        log.warning("cache %s is unreadable (%s); moved to %s and rebuilt", path, e, aside)
        try:
            os.replace(path, aside)
        except OSError:
            pass
        return {}


def write_entry(key: str, choice: "Choice | dict", path: Path | None = None) -> None:
    """Merge one entry (a Choice, or any JSON-able dict) into the cache: locked read-modify-write, atomic replace."""
    path = path or cache_path()
    with _locked(path):
        entries = read_cache(path)
        entries[key] = choice if isinstance(choice, dict) else choice.to_dict()
        write_text(path, json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1, sort_keys=True),
                   "autotune cache")


def prepare(candidate: Candidate, network: Network, params: Params, precision: str = "float32"):
    """The candidate's runnable program (prepare(...).run(x)), in the candidate's own mode when it has one."""
    precision = candidate.precision or precision
    if candidate.schedule == "fused":
        if precision in fused_modes.MODES:
            return fused_modes.prepare(network, params, precision=precision)
        check_float32_only("backend 'fused'", precision)
        return fused.prepare(network, params)
    if candidate.schedule == "scan":
        return scan.prepare(network, params, precision=precision)
    return schedule_class(candidate.schedule)(network, params, config=candidate.config, precision=precision)


def finalists(timed: list[tuple[float, object]], within: float = RUNOFF_WITHIN,
              most: int = RUNOFF_FINALISTS) -> list:
    """The candidates of the runoff from the first pass's (ms, candidate) pairs: the fastest and those within
    `within` of it, at most `most`, fastest first."""
    ranked = sorted(timed, key=lambda t: t[0])
    if not ranked:
        return []
    best = ranked[0][0]
    return [c for ms, c in ranked[:most] if ms <= best * (1.0 + within)]


def runoff(entrants: list, time_one, repeats: int, rounds: int = RUNOFF_ROUNDS,
           warm_ms: float = RUNOFF_WARM_MS) -> list[float]:
    """Each entrant's median run time (ms) over `rounds` rounds of `repeats` runs each, the entrants taking turns
    within every round (0, 1, 2, 0, 1, 2, ...), after the first entrant has run for `warm_ms` of wall time: a drift
    of the GPU's clock over the runoff lands on every entrant alike. time_one(entrant) -> the ms of one run, the
    result waited for."""
    spent = 0.0
    while spent < warm_ms:
        spent += max(time_one(entrants[0]), 1e-3)
    samples: list[list[float]] = [[] for _ in entrants]
    for _ in range(rounds):
        for i, entrant in enumerate(entrants):
            samples[i] += [time_one(entrant) for _ in range(repeats)]
    return [float(np.median(s)) for s in samples]


def tune(network: Network, params: Params, steps: int, batch: int, *, repeats: int = 10, use_cache: bool = True,
         seed: int = 0, precision: str = "float32", lengths: bool = False,
         allow_tensor_core_fp32: bool = False) -> Choice:
    """The fastest correct schedule for this network at (T=steps, B=batch) and precision on the current GPU; with
    lengths=True, of those that take lengths, run on random lengths; allow_tensor_core_fp32: float32x3 candidates
    too for precision="float32" (the module's docstring)."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    precision = check_precision(precision)
    allow_tensor_core_fp32 = check_tensor_core_fp32(allow_tensor_core_fp32, precision)
    limits = DeviceLimits.current()
    key = cache_key(network, steps, batch, limits.name, precision, lengths, allow_tensor_core_fp32)
    if use_cache:
        entry = read_cache().get(key)
        if entry is not None:
            try:
                return Choice.from_dict(key, entry)
            except (KeyError, TypeError, ValueError) as e:
                log.warning("autotune cache entry for %s is malformed (%s); tuning again", key, e)
    rng = np.random.default_rng(seed)
    x = cupy.asarray(rng.standard_normal((steps, batch, network.input_size)), dtype=cupy.float32)
    options = {}
    if lengths:          # every row but the first ends somewhere in the second half of the batch's steps
        drawn = rng.integers(max(1, steps // 2), steps + 1, batch)
        drawn[0] = steps
        options = {"lengths": drawn}
    reference = None
    gate = None if lengths else X3Gate(cupy, network, params, x)     # (the naive backend runs no lengths)
    timings = []
    timed = []                  # (ms, candidate) of the first pass
    best = None
    tolerance = DISQUALIFY_REL_ERR if precision == "float32" else DISQUALIFY_REL_ERR_REDUCED
    for cand in candidates(network, batch, limits, precision, lengths, allow_tensor_core_fp32):
        try:
            program = prepare(cand, network, params, precision)
            out = program.run(x, **options).outputs
            cupy.cuda.get_current_stream().synchronize()
            if reference is None and cand.precision == "float32x3":     # (they come after every strict candidate)
                timings.append({"candidate": cand.label(), "error": "no strict fp32 candidate ran: nothing to hold "
                                "its error against float64 to"})
                continue
            if reference is None:
                reference = out
            else:
                err = relative_error(cupy, out, reference)
                if not np.isfinite(err) or err > tolerance:
                    timings.append({"candidate": cand.label(),
                                    "error": f"output differs from the first candidate's by {err:.2e}"})
                    continue
                refused = gate.refuses(out, reference) if gate and cand.precision == "float32x3" else None
                if refused:
                    timings.append({"candidate": cand.label(), "error": refused})
                    continue
            ms = float(np.median([_time_run(cupy, program, x, options) for _ in range(repeats)]))
            timings.append({"candidate": cand.label(), "ms": ms})
            timed.append((ms, cand))
            if best is None or ms < best[1]:
                best = (cand, ms)
        except (BackendError, CompileError) as e:
            timings.append({"candidate": cand.label(), "error": str(e).splitlines()[0]})
        finally:
            program = None
    if best is None:
        raise BackendError(f"no schedule could run network '{network.cell.name}' at T={steps}, B={batch}: "
                           + "; ".join(f"{t['candidate']}: {t.get('error')}" for t in timings))
    final, ms_of = _runoff(cupy, finalists(timed), network, params, precision, x, options, repeats, timings)
    gc.collect()                  # the candidates' programs are gone: what their replays held goes back to the device
    release_retired()
    if final is not None:
        best = final
    cand, ms = best
    key_ms = "runoff_ms" if final is not None else "ms"
    ranked = sorted((t for t in timings if key_ms in t), key=lambda t: t[key_ms])
    runner_up = (f"; next {ranked[1]['candidate']} at {ranked[1][key_ms]:.3g} ms" if len(ranked) > 1 else "")
    mode = ", float32x3 allowed" if allow_tensor_core_fp32 else "" if precision == "float32" else f", {precision}"
    how = (f"median of {RUNOFF_ROUNDS} interleaved rounds of {repeats} runs, a runoff of the {len(ms_of)} within "
           f"{RUNOFF_WITHIN:.0%} of the first pass's best" if final is not None else f"median of {repeats} runs")
    correct = len([t for t in timings if "ms" in t])
    why = (f"fastest of {correct} correct candidate(s) on {limits.name}: {cand.label()} at {ms:.3g} ms "
           f"({how}, T={steps}, B={batch}{mode}){runner_up}")
    choice = Choice(cand.schedule, cand.config, why, key, timings, precision=cand.precision)
    if use_cache:
        write_entry(key, choice)
    return choice


def relative_error(xp, out, reference) -> float:
    """max |out - reference| / max |reference| (the harness's measure, engine/bench/divergence.py)."""
    scale = float(xp.abs(reference).max()) or 1.0
    return float(xp.abs(out - reference).max()) / scale


class X3Gate:
    """float32x3 candidates held to fp32-level error: each one's relative error against float64 (the naive backend in
    float64 on the GPU, made at the first float32x3 candidate) at most X3_ERROR_BOUND times the strict first
    candidate's on the same input, as issue #34 bounds the mode by cuDNN fp32's. Tensor cores add into their
    accumulators with truncation, so the error of the fused backend's chunked products depends on K and the cell
    (engine/schedules/split_products.py); measured, not assumed. (Without lengths only: the naive backend has none,
    so with lengths the schedules' float32x3 candidates are held to the float32 tolerance alone, and the fused
    float32x3 candidate, whose chunks this guards, is not tried.)"""

    def __init__(self, cupy, network: Network, params: Params, x):
        self.cupy, self.network, self.params, self.x = cupy, network, params, x
        self.exact = None

    def refuses(self, out, strict) -> str | None:
        """Why `out` is refused (None: it is within the bound); strict: the first (strict fp32) candidate's output."""
        if self.exact is None:
            self.exact = naive.prepare(self.network, self.params, dtype=np.float64).run(self.x).outputs
        exact = self.exact
        err = relative_error(self.cupy, out.astype(self.cupy.float64), exact)
        strict_err = max(relative_error(self.cupy, strict.astype(self.cupy.float64), exact), 2.0 ** -24)
        if err <= X3_ERROR_BOUND * strict_err:
            return None
        return (f"relative error {err:.2e} against float64 is over {X3_ERROR_BOUND:g}x strict fp32's ({strict_err:.2e}) "
                "on the same input")


def _time_run(cupy, program, x, options) -> float:
    """The wall time (ms) of one run, the result waited for: what a caller of engine.run waits."""
    start = time.perf_counter()
    program.run(x, **options)
    cupy.cuda.get_current_stream().synchronize()     # runs are asynchronous: wait for the result
    return (time.perf_counter() - start) * 1e3


def _runoff(cupy, entrants: list, network, params, precision, x, options, repeats: int, timings: list):
    """The runoff of the first pass's finalists (runoff()): ((candidate, ms) of the fastest, {label: ms}), each
    finalist's timing entry given its runoff_ms; (None, {}) when there is one finalist or a finalist cannot be
    prepared again beside the others (the first pass's pick then stands)."""
    if len(entrants) < 2:
        return None, {}
    try:
        programs = [prepare(c, network, params, precision) for c in entrants]
        medians = runoff(programs, lambda p: _time_run(cupy, p, x, options), repeats)
    except (BackendError, CompileError, cupy.cuda.memory.OutOfMemoryError) as e:
        log.info("autotune: runoff skipped (%s); the first pass's pick stands", str(e).splitlines()[0])
        return None, {}
    ms_of = {c.label(): ms for c, ms in zip(entrants, medians)}
    for t in timings:
        if t["candidate"] in ms_of:
            t["runoff_ms"] = ms_of[t["candidate"]]
    i = int(np.argmin(medians))
    return (entrants[i], medians[i]), ms_of
