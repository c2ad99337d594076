"""One GPU's work on a time chunk of a pipelined run, captured into CUDA graphs (engine/multigpu, issue #11).

A pipelined run issues every GPU's work on every chunk from one Python thread. Issued directly, one schedule run is
~60 CuPy calls, 0.5-0.8 ms of host time (benchmarks/profile_host.py), as long as a GPU's work on a chunk of the
DeepSpeech net: the GPUs wait on the host. Captured, a chunk is one graph launch and one copy of its input.

    replay = ChunkReplay(cupy, body, x_shape, carry)      # body(value, states) -> (value, final states); captures
    replay.x[...] = chunk                                 # the input goes into a fixed buffer ...
    out = replay.launch(first=True)                       # ... the outputs come back in one (rewritten every launch)

Each ChunkReplay holds two graphs of the same body on the same fixed input buffer: `first` starts from zero states,
the other from the states in `carry`, and both leave their final states in `carry`; a GPU's replays of every chunk
length share one `carry`, so chunk k + 1 starts where chunk k ended whatever their lengths. Memory: everything the
captured body allocates comes from a pool of the replay's own, so nothing the graph writes on a later launch (its
temporaries included) can be handed to anyone else; the outputs and the states stay referenced here.

CuPy refuses cuBLAS calls during capture (cupy issue #6290), so a body that calls cuBLAS through CuPy (the fused
backend's strict fp32 path; a projection for which cublasLt offers no algorithm) cannot be captured: ChunkReplay
raises CaptureError, and the pipeline runs that GPU's chunks directly, saying why. The schedules' projections call
cublasLt through ctypes (engine/schedules/cublaslt.py; float32x3's three products too), which captures.
"""
from __future__ import annotations

import gc


def capture_graph(cupy, body):
    """body() captured into a CUDA graph on a stream of its own (capture needs one), not run: (graph, body's value).

    Python's garbage collector runs before the capture and is held off during it. An object of an earlier run that
    the collector frees mid-capture (a memory pool returning its blocks, a module, a stream) makes CUDA calls that
    invalidate the capture (cudaErrorStreamCaptureInvalidated: "operation failed due to a previous error during
    capture"); the GPU suite under xdist met it where a capture happened to coincide with a collection."""
    stream = cupy.cuda.Stream(non_blocking=True)
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with stream:
            stream.begin_capture()
            try:
                value = body()
            finally:
                graph = stream.end_capture()
    finally:
        if collecting:
            gc.enable()
    return graph, value


_RETIRED: list = []          # the pools of replays that have gone, until every block of theirs is back and freed


def release_retired() -> None:
    """Free the blocks that have come back to the pools of replays that have gone (ChunkReplay.__del__); a pool with
    none in use any more is dropped. Runs when a replay goes or is made, and from the bench's memory release."""
    for pool in list(_RETIRED):
        try:
            pool.free_all_blocks()
            if pool.used_bytes() == 0:
                _RETIRED.remove(pool)
        except Exception:  # noqa: BLE001 -- at interpreter exit CuPy may be gone; nothing is left to give back
            _RETIRED.remove(pool)


class CaptureError(RuntimeError):
    """A GPU's chunk could not be captured into a CUDA graph; the message says why."""


class ChunkReplay:
    def __init__(self, cupy, body, x_shape: tuple, carry: dict, x=None):
        """x: the fixed input buffer (float32, x_shape), where the body's own input buffer can be it (the body then
        skips its copy of x); by default one of the replay's own, zeros."""
        self.cupy, self.body, self.carry = cupy, body, carry
        release_retired()
        self.pool = cupy.cuda.MemoryPool()
        # One direct run before any capture: it builds and compiles the body's programs for this chunk length (nothing
        # of that may happen inside a capture), shows the shapes of the states to carry, and leaves in the replay's
        # pool the blocks the captured run will allocate again.
        with cupy.cuda.using_allocator(self.pool.malloc):
            self.x = cupy.zeros(x_shape, dtype=cupy.float32) if x is None else x
            _, states = body(self.x, {})
        for key, named in states.items():
            if named and key not in carry:
                carry[key] = {name: value.copy() for name, value in named.items()}
        del states
        # Both graphs now, launching neither (a launch would overwrite the carried states of the chunk before).
        self.graphs = {first: self._capture(first) for first in (True, False)}

    def launch(self, first: bool):
        """Run the chunk now in self.x on the current stream; returns the outputs array (rewritten by the next launch
        of the same graph: copy it out, or wait, before launching again)."""
        graph, outputs = self.graphs[first]
        graph.launch(self.cupy.cuda.get_current_stream())
        return outputs

    def __del__(self):
        """Give the replay's memory back to the device (also where __init__ failed: a capture that could not be
        made). CuPy keeps the cached blocks of a MemoryPool that is dropped (CuPy 14.2: a fused program's replay at
        mid, T = 1000 held 6 GB after the program, the replay and its pool were gone; H200, 2026-11-28). The graphs,
        the input, the body (whose closure holds the owner's executor, with the buffers it made in the warm-up run)
        and the carry go first, so that what only they held is back in the pool; a pool with blocks still in use
        elsewhere is retired: kept, and its free blocks freed now and whenever release_retired() runs again."""
        pool = self.__dict__.get("pool")
        for name in ("graphs", "x", "body", "carry"):      # the body's closure holds its owner's executor and buffers
            self.__dict__.pop(name, None)
        if pool is not None:
            try:
                _RETIRED.append(pool)
                release_retired()
            except Exception:  # noqa: BLE001 -- at interpreter exit this module's names may be gone already
                pass

    def _capture(self, first: bool):
        def body():
            with self.cupy.cuda.using_allocator(self.pool.malloc):
                value, states = self.body(self.x, {} if first else self.carry)
                for key, named in states.items():
                    for name, final in (named or {}).items():
                        self.carry[key][name][...] = final
            return value
        try:
            return capture_graph(self.cupy, body)
        except Exception as e:  # noqa: BLE001 -- any failure of capture means: run this GPU's chunks directly
            raise CaptureError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
