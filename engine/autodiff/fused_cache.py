"""The fused training step's caches: Programs (engine/autodiff/fused_program.py) by (network, T, B, switches, runner,
device), and Runners (engine/autodiff/fused_runner.py) by (cell, lengths, precision mode, device, switches). A program
is reused by the next record once its tape's backward has run (or the tape is dropped); idle programs beyond
CACHE_BYTES (4 GiB) of buffers are dropped oldest first, and clear_cache() drops them all. Past MAX_RUNNERS runners the
least recently used goes, with its idle programs. One lock guards both (a runner's eviction drops programs).
"""
from __future__ import annotations

import threading

import numpy as np

from . import persistent, stage_fusion
from .fused_plan import TrainingPlan
from .fused_program import Program
from .fused_runner import Runner

_lock = threading.Lock()

_programs: dict = {}             # key -> [Program]: most recently used key last
CACHE_BYTES = 4 << 30           # idle programs kept beyond this many bytes of buffers are dropped, oldest first


def acquire(network, runner, T: int, B: int, poison: bool, wavefront: bool = False, check_memory=None) -> Program:
    """A program of this network, runner and (T, B) that no live tape holds (cached; a new one when all are, after
    check_memory() where given). Idle programs of other shapes are dropped, least recently used first, while the
    cache holds over CACHE_BYTES."""
    key = (network.cell, network.input_size, network.hidden_size, network.num_layers, network.projection_size, T, B,
           poison, wavefront, stage_fusion.switches(), persistent.PERSISTENT, id(runner),
           _device_id(runner.xp))  # a cached program holds its runner: its id
    with _lock:
        pool = _programs.pop(key, [])
        _programs[key] = pool
        program = next((p for p in pool if not p.busy), None)
        if program is None:
            if check_memory is not None:
                check_memory()
            program = Program(network, runner, T, B, poison, wavefront)
            pool.append(program)
        program.busy = True
        _evict()
    return program


def _evict() -> None:
    total = sum(p.bytes for pool in _programs.values() for p in pool)
    for key in list(_programs):
        if total <= CACHE_BYTES:
            break
        keep = []
        for p in _programs[key]:
            if p.busy or total <= CACHE_BYTES:
                keep.append(p)
            else:
                total -= p.bytes
        _programs[key] = keep
        if not keep:
            del _programs[key]


def cached_bytes() -> int:
    """Bytes of buffers the cached programs hold (on the GPU, or host memory for the NumPy runner)."""
    with _lock:
        return sum(p.bytes for pool in _programs.values() for p in pool)


def clear_cache() -> None:
    """Drop every idle program (their buffers and graphs); programs held by live tapes stay until released."""
    with _lock:
        for key in list(_programs):
            _programs[key] = [p for p in _programs[key] if p.busy]
            if not _programs[key]:
                del _programs[key]


def _device_id(xp) -> int:
    return xp.cuda.Device().id if xp is not np else -1


_runners: dict = {}              # key -> Runner, the most recently used last
MAX_RUNNERS = 8                  # runners kept (each holds cuBLAS handles and workspaces, ~100 MiB for a wavefront):
                                 # an app session that trains cell after cell keeps the last few, not every one


def gpu_runner(plan: TrainingPlan) -> Runner:
    """The runner of a cell's plan on the current device (cached by the cell itself, whether the plan takes lengths
    and its precision mode, never by an object's id), with the fused stages' tiled GEMM compiled in where
    stage_fusion.FUSE_MAX_ROWS asks for it. Past MAX_RUNNERS the least recently used runner is dropped, with the idle programs that hold it."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    tiled = stage_fusion.FUSE_MAX_ROWS > stage_fusion.GEMV_MAX_ROWS
    key = (plan.cell, plan.lengths, plan.precision, cupy.cuda.Device().id, tiled, stage_fusion.INTERLEAVED)
    with _lock:
        runner = _runners.pop(key, None)
        if runner is not None:
            _runners[key] = runner
    if runner is None:
        runner = Runner(cupy, plan, tiled)
        with _lock:
            _runners[key] = runner
            while len(_runners) > MAX_RUNNERS:
                _drop_runner(_runners.pop(next(iter(_runners))))
    return runner


def _drop_runner(runner: Runner) -> None:
    """The idle cached programs of an evicted runner go with it (a busy one stays until its tape is done). Called
    with _lock held."""
    for key in list(_programs):
        pool = [p for p in _programs[key] if p.busy or p.runner is not runner]
        if pool:
            _programs[key] = pool
        else:
            del _programs[key]


def clear_runners() -> None:
    """Drop the cached runners (each holds cuBLAS handles with a 32 MiB workspace a stream, ~100 MiB for a 2-layer
    wavefront); a program that holds one keeps it until the program is dropped too (clear_cache)."""
    with _lock:
        _runners.clear()
