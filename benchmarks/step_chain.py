"""What the step probes share (benchmarks/probe_step_*.py, probe_cell_kernel.py, probe_stream_*.py): a CUDA graph's
median time, and a chain of T recurrent steps built around a product under test.

    ms = graph_ms(cupy, stream, graph, reps=11)        # median of CUDA-event intervals after 3 warm-up launches
    chain = StepChain(cupy, "bfloat16", H, B, N, T)     # random normal W (N, H) and h (B, H), in the mode's storage
    chain.error(product); chain.time(chain.capture(product))

A product is a callable product(operand_ptr, stream_ptr) writing out (B, N) fp32 = operand @ W^T. A step is the
product, then next operand = mode(tanh(out[:, :H])): one elementwise kernel and one rounding, so every step depends on
the one before, as a recurrent layer's do.
"""
from __future__ import annotations

import statistics


def graph_ms(cupy, stream, graph, reps: int = 11, warm: int = 3) -> float:
    """The median ms of graph.launch(stream) (anything with that method) over `reps` launches after `warm`."""
    for _ in range(warm):
        graph.launch(stream)
    stream.synchronize()
    times = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(stream)
        graph.launch(stream)
        b.record(stream)
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b))
    return statistics.median(times)


def product_chain(cupy, stream, out, exact, issue, chain: int = 50) -> tuple[float, float]:
    """A product issued by `issue()` into `out`, checked then timed: out poisoned (NaN), one product, its error
    against `exact` (norm-relative), then `chain` products captured into one CUDA graph on `stream` and timed by
    graph_ms. Returns (error, us a product)."""
    out.fill(float("nan"))
    cupy.cuda.Device().synchronize()
    with stream:
        issue()
    stream.synchronize()
    error = float(cupy.linalg.norm(out - exact) / cupy.linalg.norm(exact))
    with stream:
        stream.begin_capture()
        for _ in range(chain):
            issue()
        graph = stream.end_capture()
    return error, graph_ms(cupy, stream, graph) * 1e3 / chain


class StepChain:
    """T chained steps of a product, captured into one CUDA graph and timed (median ms)."""

    def __init__(self, cupy, mode: str, H: int, B: int, N: int, T: int, reps: int = 11):
        import numpy as np

        from engine.schedules.project import operand_dtype, round_into
        self.cupy, self.mode, self.H, self.T, self.reps = cupy, mode, H, T, reps
        self.round_into = round_into
        rng = np.random.default_rng(0)
        self.w32 = cupy.asarray(rng.standard_normal((N, H), dtype=np.float32) / H ** 0.5)
        self.h32 = cupy.asarray(rng.standard_normal((B, H), dtype=np.float32))
        self.w = round_into(cupy, self.w32, cupy.empty(self.w32.shape, operand_dtype(cupy, mode)), mode)
        self.h0 = round_into(cupy, self.h32, cupy.empty(self.h32.shape, operand_dtype(cupy, mode)), mode)
        self.h = self.h0.copy()
        self.out = cupy.empty((B, N), dtype=cupy.float32)
        self.hf = cupy.empty((B, H), dtype=cupy.float32)
        self.tanh = cupy.ElementwiseKernel("float32 g", "float32 h", "h = tanhf(g)", "probe_step_tanh")
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.ref = None
        cupy.cuda.Device().synchronize()          # the arrays were made on the null stream, which `stream` ignores

    def error(self, product) -> float:
        """One product of the first operand against float64 (out poisoned with NaN first)."""
        cupy = self.cupy
        if self.ref is None:
            self.ref = self.h32.astype(cupy.float64) @ self.w32.astype(cupy.float64).T
        self.out.fill(float("nan"))
        cupy.cuda.Device().synchronize()
        with self.stream:
            product(self.h0.data.ptr, self.stream.ptr)
            self.tanh(self.out[:, :self.H], self.hf)               # compiled before any capture
            self.round_into(cupy, self.hf, cupy.empty_like(self.h), self.mode)
        self.stream.synchronize()
        return float(cupy.abs(self.out - self.ref).max() / cupy.abs(self.ref).max())

    def steps(self, product) -> None:
        """Issue the T steps on the chain's stream."""
        with self.stream:
            for _ in range(self.T):
                product(self.h.data.ptr, self.stream.ptr)
                self.tanh(self.out[:, :self.H], self.hf)
                self.round_into(self.cupy, self.hf, self.h, self.mode)

    def capture(self, product):
        with self.stream:
            self.stream.begin_capture()
            self.steps(product)
            return self.stream.end_capture()

    def time(self, graph) -> float:
        """graph_ms of `graph` (or anything with launch(stream)) from the first operand; h must stay finite."""
        with self.stream:
            self.h[...] = self.h0
        ms = graph_ms(self.cupy, self.stream, graph, self.reps)
        if not bool(self.cupy.isfinite(self.hf).all()):
            raise AssertionError("non-finite h after the chain")
        return ms
