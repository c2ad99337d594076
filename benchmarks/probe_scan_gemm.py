"""The minGRU scan's GEMM in strict fp32, every way cuBLAS offers it (issue #33's 10x target): the GEMM is 0.74-0.81
of the scan call's 0.92 ms, at ~45 of the H200's 67 TFLOP/s FFMA peak. Times (CUDA-event medians after warm-up, on
random inputs, TF32 off) the product P = X W^T with X (T B, I) = (32768, 512) and W (2H, I) = (1024, 512):
- CuPy's `X @ W.T` (what engine/schedules/scan.py calls) and `(W @ X.T).T` (the product transposed);
- torch.mm with TF32 off;
- every algorithm cublasLt's heuristic offers (up to 64, 32 MiB workspace, CUBLAS_COMPUTE_32F) in both
  orientations, each checked against the float64 product (a TF32 algorithm would show ~1e-3, strict fp32 ~1e-6).

    python3 benchmarks/probe_scan_gemm.py [--out DIR]
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CUPY_TF32", "0")

from engine.bench.timing import cupy_timer, time_runs  # noqa: E402
from engine.codegen.cublas_enums import CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_32F  # noqa: E402

# cublasLt.h (CUDA 13): cublasLtMatmulDescAttributes_t and cublasLtMatmulPreferenceAttributes_t
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
HEURISTIC_BYTES = 96        # cublasLtMatmulHeuristicResult_t: algo (64 B), workspaceSize, state, wavesCount, reserved[4]
WORKSPACE = 32 << 20


def loaded_library(name: str) -> str:
    """The path of a shared library this process has loaded (CuPy's cuBLAS brings libcublasLt with it)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if f"/{name}.so" in path:
                return path
    found = ctypes.util.find_library(name.removeprefix("lib"))
    if not found:
        raise RuntimeError(f"{name} is not loaded and not on the loader's path")
    return found


class Lt:
    """cublasLt through ctypes: one handle, the layouts of a column-major m x n = op(A) op(B) product."""

    def __init__(self):
        import cupy
        cupy.cuda.device.get_cublas_handle()              # loads libcublas (and libcublasLt)
        self.lib = ctypes.CDLL(loaded_library("libcublasLt"))
        self.handle = ctypes.c_void_p()
        self.check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = cupy.empty(WORKSPACE, dtype=cupy.uint8)

    @staticmethod
    def check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} returned cuBLAS status {status}")

    def layout(self, rows: int, cols: int, ld: int):
        out = ctypes.c_void_p()
        self.check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(out), CUDA_R_32F, ctypes.c_uint64(rows),
                                                       ctypes.c_uint64(cols), ctypes.c_int64(ld)), "layout")
        return out

    def algorithms(self, op_a: int, op_b: int, m: int, n: int, k: int, lda: int, ldb: int, ldc: int, count: int = 64):
        """[(description, call)] of every algorithm the heuristic returns for C (m x n) = op(A) op(B)."""
        desc = ctypes.c_void_p()
        self.check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc")
        for attr, value in ((DESC_TRANSA, op_a), (DESC_TRANSB, op_b)):
            v = ctypes.c_int32(value)
            self.check(self.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), ctypes.c_size_t(4)), "transpose")
        a = self.layout(*((m, k) if op_a == CUBLAS_OP_N else (k, m)), lda)
        b = self.layout(*((k, n) if op_b == CUBLAS_OP_N else (n, k)), ldb)
        c = self.layout(m, n, ldc)
        pref = ctypes.c_void_p()
        self.check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        ws = ctypes.c_uint64(WORKSPACE)
        self.check(self.lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), ctypes.c_size_t(8)),
                   "workspace")
        results = (ctypes.c_uint8 * (HEURISTIC_BYTES * count))()
        returned = ctypes.c_int()
        self.check(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, a, b, c, c, pref, count, results,
                                                           ctypes.byref(returned)), "heuristic")
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        out = []
        for i in range(returned.value):
            raw = bytes(results[i * HEURISTIC_BYTES:(i + 1) * HEURISTIC_BYTES])
            algo = (ctypes.c_uint8 * 64).from_buffer_copy(raw[:64])
            need, state, waves = np.frombuffer(raw[64:72], np.uint64)[0], np.frombuffer(raw[72:76], np.int32)[0], \
                np.frombuffer(raw[76:80], np.float32)[0]
            if state != 0 or need > WORKSPACE:
                continue

            def call(pa, pb, pc, algo=algo):
                import cupy
                stream = ctypes.c_void_p(cupy.cuda.get_current_stream().ptr)
                self.check(self.lib.cublasLtMatmul(self.handle, desc, ctypes.byref(alpha), ctypes.c_void_p(pa), a,
                                                   ctypes.c_void_p(pb), b, ctypes.byref(beta), ctypes.c_void_p(pc), c,
                                                   ctypes.c_void_p(pc), c, ctypes.byref(algo),
                                                   ctypes.c_void_p(self.workspace.data.ptr), ctypes.c_size_t(WORKSPACE),
                                                   stream), "cublasLtMatmul")
            out.append((f"heuristic #{i} (workspace {int(need) >> 10} KiB, waves {float(waves):.2f})", call))
        return out


def median_ms(run) -> float:
    return time_runs(lambda k: run(), cupy_timer, buffers=1, warmup=5, reps=30).median_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import cupy
    M, N, K = 4096 * 8, 1024, 512
    rng = np.random.default_rng(7)
    x_host = rng.standard_normal((M, K)).astype(np.float32)
    w_host = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    x, w = cupy.asarray(x_host), cupy.asarray(w_host)
    sample = rng.choice(M, 512, replace=False)                      # rows checked against float64
    exact = x_host[sample].astype(np.float64) @ w_host.T.astype(np.float64)
    flops = 2.0 * M * N * K
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows = []

    def record(label, run, result):
        out = result()
        out.fill(np.nan)
        run()
        got = cupy.asnumpy(result())[sample] if result().shape == (M, N) else cupy.asnumpy(result().T)[sample]
        err = float(np.max(np.abs(got - exact)) / np.max(np.abs(exact)))
        ms = median_ms(run)
        rows.append({"label": label, "ms": ms, "tflops": flops / ms / 1e9, "max_rel_err": err})
        print(f"{label:64s} {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s  err {err:.1e}", flush=True)

    c = cupy.empty((M, N), dtype=cupy.float32)
    ct = cupy.empty((N, M), dtype=cupy.float32)
    record("cupy X @ W.T (the scan's call)", lambda: cupy.matmul(x, w.T, out=c), lambda: c)
    record("cupy W @ X.T (product transposed)", lambda: cupy.matmul(w, x.T, out=ct), lambda: ct)
    try:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
        tc = torch.as_tensor(c, device="cuda")
        record(f"torch.mm, TF32 off (torch {torch.__version__})", lambda: torch.mm(tx, tw.T, out=tc), lambda: c)
    except ImportError as exc:
        print(f"torch: not installed ({exc})")
    lt = Lt()
    # row-major C (M x N) = X W^T is column-major C^T (N x M) = W^T(col: K x N, op T) . X^T(col: K x M, op N)
    for label, call in lt.algorithms(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, K, K, N):
        record(f"Lt C = X W^T, {label}", lambda call=call: call(w.data.ptr, x.data.ptr, c.data.ptr), lambda: c)
    # row-major C^T (N x M) = W X^T is column-major (M x N) = X^T(col: K x M, op T) . W^T(col: K x N, op N)
    for label, call in lt.algorithms(CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, K, K, M):
        record(f"Lt C^T = W X^T, {label}", lambda call=call: call(x.data.ptr, w.data.ptr, ct.data.ptr), lambda: ct)
    best = min(rows, key=lambda r: r["ms"])
    print(f"\n{device}: the scan's call {rows[0]['ms']:.3f} ms; fastest {best['label']} {best['ms']:.3f} ms "
          f"({best['tflops']:.1f} TFLOP/s, err {best['max_rel_err']:.1e})")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "probe_scan_gemm.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
