"""engine/chunk_replay.py without a GPU: a stand-in for the few CuPy calls ChunkReplay makes (a memory pool and
allocator switch, streams with capture, graph launches) checks how it wires a body into its graphs: one direct
warm-up run under the replay's own allocator, two captures (from zero states, from the carried ones) on a stream of
their own, the final states copied into the carry inside the capture, launches on the caller's stream, and a failed
capture reported as CaptureError with the stream's capture ended. What the graphs compute is checked on the GPU
(tests/gpu/test_pipeline_gpu.py, tests/gpu/test_schedules.py: replayed runs equal direct runs bit for bit)."""
from __future__ import annotations

import gc
import weakref
from contextlib import contextmanager

import numpy as np
import pytest

from engine import chunk_replay
from engine.chunk_replay import CaptureError, ChunkReplay


class FakeGraph:
    def __init__(self, stream, ops):
        self.ops, self.launched_on = ops, []

    def launch(self, stream):
        self.launched_on.append(stream)


class FakeStream:
    def __init__(self, cuda, name):
        self.cuda, self.name, self.capturing, self.ops, self.ended = cuda, name, False, [], 0

    def __enter__(self):
        self.previous, self.cuda.current = self.cuda.current, self
        return self

    def __exit__(self, *exc):
        self.cuda.current = self.previous
        return False

    def begin_capture(self):
        assert not self.capturing
        self.capturing = True

    def end_capture(self):
        assert self.capturing, "end_capture without begin_capture"
        self.capturing, self.ended = False, self.ended + 1
        if self.cuda.invalidate:
            raise RuntimeError("cudaErrorStreamCaptureInvalidated: operation failed due to a previous error")
        return FakeGraph(self, self.ops)


class FakeCuda:
    def __init__(self):
        self.current = FakeStream(self, "caller")
        self.allocator = "default"
        self.streams = []
        self.invalidate = False

    freed = []                                   # (pool, whether the replay's graphs and input were gone by then)

    class MemoryPool:
        def __init__(self):
            self.owner, self.in_use = None, 0

        def used_bytes(self):
            return self.in_use

        def malloc(self, size):                  # never called by the stand-in arrays
            raise AssertionError

        def free_all_blocks(self):
            FakeCuda.freed.append((self, self.owner is None or self.owner() is None))

    @contextmanager
    def using_allocator(self, malloc):
        previous, self.allocator = self.allocator, malloc
        try:
            yield
        finally:
            self.allocator = previous

    def Stream(self, non_blocking=False):  # noqa: N802 (CuPy's name)
        stream = FakeStream(self, f"capture {len(self.streams)}")
        self.streams.append(stream)
        return stream

    def get_current_stream(self):
        return self.current


class FakeCupy:
    float32 = np.float32

    def __init__(self):
        self.cuda = FakeCuda()

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype)


def recording_body(cupy, calls, fail_in_capture=False):
    """A chunk's work: outputs 2x, one piece's state h = the chunk's last row (+ the state it started from)."""
    def body(x, states):
        stream = cupy.cuda.get_current_stream()
        calls.append({"states": states, "allocator": cupy.cuda.allocator, "stream": stream.name,
                      "capturing": stream.capturing, "collecting": gc.isenabled()})
        if fail_in_capture and stream.capturing:
            raise ValueError("boom: cuBLAS refused")
        start = states.get("piece", {}).get("h", 0.0)
        return x * 2, {"piece": {"h": x[-1] + start}, "bidirectional": None}
    return body


def test_a_replay_warms_up_once_then_captures_both_graphs_on_a_stream_of_its_own():
    cupy, calls, carry = FakeCupy(), [], {}
    replay = ChunkReplay(cupy, recording_body(cupy, calls), (3, 2, 4), carry)
    assert [c["capturing"] for c in calls] == [False, True, True]
    warm, first, later = calls
    assert warm["states"] == {} and warm["stream"] == "caller"
    assert all(c["allocator"] == replay.pool.malloc for c in calls)          # the replay's own pool, every time
    assert cupy.cuda.allocator == "default" and cupy.cuda.current.name == "caller"   # both restored
    assert first["states"] == {} and later["states"] is carry                # zero states, then the carried ones
    assert first["stream"].startswith("capture") and later["stream"].startswith("capture")   # not the caller's
    assert sorted(carry) == ["piece"] and carry["piece"]["h"].shape == (2, 4)    # a piece without states: none
    assert replay.x.shape == (3, 2, 4) and replay.x.dtype == np.float32
    assert all(s.ended == 1 and not s.capturing for s in cupy.cuda.streams)


def test_launch_replays_the_graph_asked_for_on_the_callers_stream():
    cupy, calls = FakeCupy(), []
    replay = ChunkReplay(cupy, recording_body(cupy, calls), (3, 2, 4), {})
    caller = cupy.cuda.get_current_stream()
    out = replay.launch(first=False)
    assert replay.graphs[False][0].launched_on == [caller] and replay.graphs[True][0].launched_on == []
    assert out is replay.graphs[False][1]                                  # the captured outputs, rewritten each time
    replay.launch(first=True)
    assert replay.graphs[True][0].launched_on == [caller]
    assert len(calls) == 3                                                 # launching runs no Python body


def test_replays_of_one_gpu_share_its_carry():
    cupy, calls, carry = FakeCupy(), [], {}
    ChunkReplay(cupy, recording_body(cupy, calls), (6, 2, 4), carry)
    held = carry["piece"]["h"]
    ChunkReplay(cupy, recording_body(cupy, calls), (2, 2, 4), carry)        # a shorter tail chunk
    assert carry["piece"]["h"] is held                                     # not replaced: the same buffer
    assert calls[-1]["states"] is carry


@pytest.mark.parametrize("invalidate", [False, True])
def test_a_failed_capture_is_a_capture_error_and_leaves_no_stream_capturing(invalidate):
    cupy, calls = FakeCupy(), []
    cupy.cuda.invalidate = invalidate
    with pytest.raises(CaptureError, match="ValueError: boom" if not invalidate else "RuntimeError: cudaError"):
        ChunkReplay(cupy, recording_body(cupy, calls, fail_in_capture=True), (3, 2, 4), {})
    assert all(not s.capturing and s.ended == 1 for s in cupy.cuda.streams)
    assert cupy.cuda.allocator == "default" and cupy.cuda.current.name == "caller"


@pytest.mark.parametrize("fail", [False, True])
def test_the_garbage_collector_is_held_off_during_a_capture_and_restored_after(fail):
    """An earlier run's objects freed by the collector mid-capture make CUDA calls that invalidate it; the collector
    runs before each capture instead, and is on again after it (also after a failed one), unless it was off."""
    cupy, calls = FakeCupy(), []
    assert gc.isenabled()
    if fail:
        with pytest.raises(CaptureError):
            ChunkReplay(cupy, recording_body(cupy, calls, fail_in_capture=True), (3, 2, 4), {})
    else:
        ChunkReplay(cupy, recording_body(cupy, calls), (3, 2, 4), {})
    assert [c["collecting"] for c in calls] == [True, False] + ([] if fail else [False])
    assert gc.isenabled()
    gc.disable()
    try:
        ChunkReplay(cupy, recording_body(cupy, []), (3, 2, 4), {})
        assert not gc.isenabled()                                          # a caller's choice is kept
    finally:
        gc.enable()


@pytest.mark.parametrize("fail", [False, True])
def test_a_dropped_replay_gives_its_pools_blocks_back(fail):
    """CuPy keeps the cached blocks of a MemoryPool that is dropped: a replay frees its pool's blocks when it goes,
    after its graphs and input buffer, and so does one whose capture failed."""
    cupy, calls = FakeCupy(), []
    FakeCuda.freed.clear()
    if fail:
        with pytest.raises(CaptureError):
            ChunkReplay(cupy, recording_body(cupy, calls, fail_in_capture=True), (3, 2, 4), {})
    else:
        replay = ChunkReplay(cupy, recording_body(cupy, calls), (3, 2, 4), {})
        graph, x = weakref.ref(replay.graphs[True][0]), weakref.ref(replay.x)
        assert FakeCuda.freed == []                                        # not while it lives
        replay.pool.owner = lambda: graph() or x()
        del replay
    gc.collect()
    assert len(FakeCuda.freed) == 1 and FakeCuda.freed[0][1], FakeCuda.freed
    assert chunk_replay._RETIRED == []                                     # nothing in use: dropped


def test_a_retired_pool_is_kept_until_its_blocks_come_back():
    """Buffers an owner made in the warm-up run (an executor's caches) come back to the pool after the replay has
    gone: the pool stays retired, and release_retired() frees them once they are back."""
    cupy, calls = FakeCupy(), []
    FakeCuda.freed.clear()
    replay = ChunkReplay(cupy, recording_body(cupy, calls), (3, 2, 4), {})
    pool = replay.pool
    pool.in_use = 4096                                                     # the owner's buffers, still alive
    del replay
    gc.collect()
    assert chunk_replay._RETIRED == [pool] and len(FakeCuda.freed) == 1
    pool.in_use = 0                                                        # the owner has gone too
    kept = ChunkReplay(cupy, recording_body(cupy, calls), (3, 2, 4), {})   # a new replay releases the retired first
    assert chunk_replay._RETIRED == [] and [p for p, _ in FakeCuda.freed] == [pool, pool] and kept.pool is not pool


def test_what_only_the_body_held_is_given_back_at_once():
    """The body's closure holds its owner's executor and the buffers it made in the warm-up run: dropped with the
    replay, they are back in the pool before it is freed, so the pool is not left retired."""
    cupy, calls = FakeCupy(), []
    FakeCuda.freed.clear()

    class Buffers:                                     # the executor's warm-up buffers, in the replay's pool
        def __del__(self):
            pool.in_use = 0

    def closure(held, body):
        return lambda x, states: (held, body(x, states))[1]

    replay = ChunkReplay(cupy, closure(Buffers(), recording_body(cupy, calls)), (3, 2, 4), {})
    pool = replay.pool
    pool.in_use = 4096
    del replay
    gc.collect()
    assert chunk_replay._RETIRED == [] and [p for p, _ in FakeCuda.freed] == [pool] and pool.in_use == 0

