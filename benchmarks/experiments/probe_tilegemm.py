"""The fp32 tile GEMM alone, on the GPU: one block per SM (128) computing its slice of a recurrent GEMM `steps` times
from the same L2-resident X, as the persistent kernel does every step, but with nothing else in the kernel.

    python benchmarks/probe_tilegemm.py [rot|diag|kt2|load] mid large blogB blogA gru-mid
    python benchmarks/probe_tilegemm.py single large rot 4        # one variant, one launch of 20 steps (for ncu)

Variants: `old` is the production rnn_tile_gemms (kernels/tile_gemm.cuh); `new` (rnn_kt_gemms) and `kt2`
(rnn_kt2_gemms) are the k-major experiment of the ninth session (kernels/kt_gemm.cuh, benchmarks/NOTES.md):
operands k-major in shared memory, staged through registers (`new`) or by cp.async then transposed (`kt2`).
Macros per variant: RNN_KT_NO_STAGE (X staged once: the FMAs alone), RNN_KT_NO_LDG (stores without loads),
RNN_KT_LOAD (the load instruction), RNN_ROTATE (each block starts its K loop at a different chunk).
Every variant is checked against a float64 product first (err: max |Y - ref| / max |ref|)."""
import json, os, statistics, sys
import numpy as np
import cupy as cp

KDIR = os.path.join(os.path.dirname(__file__), "..", "..", "kernels")
KDIR2 = os.path.dirname(os.path.abspath(__file__))
SMEM = 232448

def ru(v, m): return -(-v // m) * m
def row_stride(k): return ru(k, 4) + 4
def kt_stride(c): return ru(c, 4) + 4

def source(kind, B, NC, jobs, T, RB, RC, KC, ST=2, defs="", PW=1):
    ncp = ru(NC, RC)
    ncs = ncp if any(not r for _, r in jobs) else 0
    off, res, decl = 0, [], []
    for j, (K, r) in enumerate(jobs):
        if r:
            if kind == "kt2":
                res.append(f"rnn_load_resident_kt2(smem + {off}, W{j} + (long)blk * NC * {K}, {K}, {K}, NC, {ncp});")
                decl.append(f"smem + {off}"); off += K * ncp
            elif kind in ("old", "ws"):
                res.append(f"rnn_load_resident(smem + {off}, W{j} + (long)blk * NC * {K}, {K}, {K}, NC, {ncp});")
                decl.append(f"smem + {off}"); off += ncp * row_stride(K)
            else:
                res.append(f"rnn_load_resident_kt(smem + {off}, W{j} + (long)blk * NC * {K}, {K}, {K}, NC, {ncp});")
                decl.append(f"smem + {off}"); off += K * kt_stride(ncp)
        else:
            decl.append("nullptr")
    off = ru(off, 4)
    if kind == "old":
        scratch = ST * (ru(B, RB) + ncs) * row_stride(KC) + (T * min(RB * RC, 16) if (ru(B, RB) // RB) * (ncp // RC) < T else 0)
        call = f"rnn_tile_gemms<{RB}, {RC}, 4, {ST}, {KC}>(jobs, B, smem + {off}, {ncs});"
    elif kind == "ws":
        scratch = 16 + ST * (ru(B, RB) + ncs) * row_stride(KC) + (T * min(RB * RC, 16) if (ru(B, RB) // RB) * (ncp // RC) < T else 0)
        call = f"rnn_ws_gemms<{RB}, {RC}, {ST}, {KC}, {len(jobs)}, {PW}>(jobs, B, smem + {off}, {ncs});"
    elif kind == "kt2":
        scratch = 3 * (ru(B, RB) + ncs) * row_stride(KC) + 2 * KC * (kt_stride(ru(B, RB)) + (kt_stride(ncs) if ncs else 0)) + (T * 16 if (ru(B, RB) // RB) * (ncp // RC) < T else 0)
        call = f"rnn_kt2_gemms<{RB}, {RC}, 4, {KC}, B, THREADS, {ncs}>(jobs, smem + {off});"
    else:
        scratch = 2 * KC * (kt_stride(ru(B, RB)) + (kt_stride(ncs) if ncs else 0)) + T * 16
        call = f"rnn_kt_gemms<{RB}, {RC}, 4, {KC}, B, THREADS, {ncs}>(jobs, smem + {off});"
    smem = (off + scratch) * 4
    args = ", ".join(f"const float* X{j}, const float* W{j}, float* Y{j}" for j in range(len(jobs)))
    jl = ",\n".join(f"        {{X{j}, W{j} + (long)blk * NC * {K}, {decl[j]}, Y{j} + (long)blk * NC, NTOT, nullptr, {K}, NC, {ncp}}}"
                    for j, (K, r) in enumerate(jobs))
    src = defs + f"""
#include "tile_gemm.cuh"
#include "mma_gemm.cuh"
#include "kt_gemm.cuh"
#include "ws_gemm.cuh"
constexpr int B = {B}, NC = {NC}, THREADS = {T + (32 * PW if kind == "ws" else 0)};
extern "C" __global__ void __launch_bounds__(THREADS, 1) bench({args}, const int NTOT, const int steps)
{{
    __builtin_assume(blockDim.x == THREADS);
    extern __shared__ float smem[];
    const int blk = blockIdx.x;
    {' '.join(res)}
    __syncthreads();
    for (int s = 0; s < steps; ++s) {{
        const RnnGemm jobs[{len(jobs)}] = {{
{jl}
        }};
        {call}
    }}
}}
"""
    return src, smem

def run(name, kind, B, NC, jobs, T, RB, RC, KC, ST=2, defs="", PW=1, blocks=128, steps=100):
    src, smem = source(kind, B, NC, jobs, T, RB, RC, KC, ST, defs, PW)
    label = f"{name} {kind} {RB}x{RC} thr={T} KC={KC}" + (f" ST={ST}" if kind == "old" else "") + (" " + defs.replace("#define RNN_KT_", "").replace(chr(10), " ") if defs else "") + (f" PW={PW}" if kind == "ws" else "")
    if smem > SMEM:
        return {"label": label, "error": f"smem {smem}"}
    try:
        mod = cp.RawModule(code=src, options=("-std=c++17", f"-I{KDIR}", f"-I{KDIR2}", "--use_fast_math" if False else "-lineinfo"))
        fn = mod.get_function("bench")
    except Exception as e:
        return {"label": label, "error": str(e)[:2000]}
    fn.max_dynamic_shared_size_bytes = smem
    ntot = NC * blocks
    rng = np.random.default_rng(0)
    Xs = [cp.asarray(rng.standard_normal((B, K), dtype=np.float32)) for K, _ in jobs]
    Ws = [cp.asarray(rng.standard_normal((ntot, K), dtype=np.float32)) for K, _ in jobs]
    Ys = [cp.full((B, ntot), np.nan, dtype=np.float32) for _ in jobs]
    argv = []
    for j in range(len(jobs)):
        argv += [Xs[j], Ws[j], Ys[j]]
    argv += [np.int32(ntot)]
    fn((blocks,), (T + (32 * PW if kind == 'ws' else 0),), (*argv, np.int32(1)), shared_mem=smem)
    cp.cuda.runtime.deviceSynchronize()
    err = 0.0
    for j in range(len(jobs)):
        ref = Xs[j].astype(cp.float64) @ Ws[j].astype(cp.float64).T
        err = max(err, float(cp.max(cp.abs(Ys[j] - ref)) / cp.max(cp.abs(ref))))
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(3):
        fn((blocks,), (T + (32 * PW if kind == 'ws' else 0),), (*argv, np.int32(steps)), shared_mem=smem)
    ts = []
    for _ in range(11):
        start.record(); fn((blocks,), (T + (32 * PW if kind == 'ws' else 0),), (*argv, np.int32(steps)), shared_mem=smem); end.record(); end.synchronize()
        ts.append(cp.cuda.get_elapsed_time(start, end))
    ms = statistics.median(ts)
    flops = 2.0 * B * NC * sum(K for K, _ in jobs) * blocks * steps
    regs = fn.num_regs
    return {"label": label, "us_per_step": ms * 1000 / steps, "tflops": flops / ms / 1e9, "err": err, "regs": regs,
            "spill": fn.local_size_bytes, "smem": smem}

CASES = {
    "mid": (64, 64, [(512, True), (512, False)]),
    "large": (128, 32, [(1024, True)]),
    "blogB": (64, 24, [(256, True), (256, True)]),
    "blogA": (64, 80, [(2560, False)]),
    "gru-mid": (64, 48, [(512, True), (512, False)]),
}
NS = "#define RNN_KT_NO_STAGE\n"
RM = "#define RNN_KT_ROWMAJOR_ITEMS\n"
VARIANTS2 = {
    "mid": [("old", 256, 8, 8, 64, 2), ("new", 256, 8, 8, 64, 2, NS), ("new", 384, 8, 8, 32, 2, NS), ("new", 256, 8, 8, 64, 2, RM)],
    "large": [("old", 256, 4, 4, 64, 2), ("new", 256, 4, 4, 64, 2, NS), ("new", 256, 8, 8, 64, 2, NS), ("new", 512, 8, 4, 32, 2, NS),
              ("new", 256, 4, 4, 64, 2, RM)],
    "blogB": [("old", 384, 4, 4, 128, 4), ("new", 384, 4, 4, 64, 2, NS), ("new", 384, 4, 4, 64, 2, RM)],
}
L1 = "#define RNN_KT_LOAD 1\n"
L2 = "#define RNN_KT_LOAD 2\n"
VARIANTS3 = {
    "mid": [("old", 256, 8, 8, 64, 2), ("new", 256, 8, 8, 64, 2, L1), ("new", 256, 8, 8, 64, 2, L2), ("new", 384, 8, 8, 32, 2, L1)],
    "large": [("old", 256, 4, 4, 64, 2), ("new", 256, 4, 4, 64, 2, L1), ("new", 256, 8, 8, 64, 2, L1), ("new", 256, 8, 8, 64, 2, L2),
              ("new", 512, 8, 4, 32, 2, L1)],
    "blogB": [("old", 384, 4, 4, 128, 4), ("new", 384, 4, 4, 64, 2, L1), ("new", 384, 4, 4, 64, 2, L2)],
    "blogA": [("old", 320, 4, 4, 128, 3), ("new", 512, 8, 4, 32, 2, L1), ("new", 256, 8, 4, 64, 2, L1)],
}
NL = "#define RNN_KT_NO_LDG\n"
VARIANTS4 = {
    "mid": [("old", 256, 8, 8, 64, 2), ("new", 256, 8, 8, 64, 2, NL), ("kt2", 256, 8, 8, 32), ("kt2", 256, 8, 8, 16), ("kt2", 256, 4, 8, 32),
            ("kt2", 512, 8, 4, 16), ("kt2", 256, 4, 4, 32)],
    "large": [("old", 256, 4, 4, 64, 2), ("new", 256, 4, 4, 64, 2, NL), ("kt2", 256, 4, 4, 32), ("kt2", 256, 8, 8, 32), ("kt2", 256, 8, 4, 32),
              ("kt2", 512, 8, 4, 16), ("kt2", 384, 8, 8, 16), ("kt2", 256, 8, 8, 16)],
    "blogB": [("old", 384, 4, 4, 128, 4), ("new", 384, 4, 4, 64, 2, NL), ("kt2", 384, 4, 4, 64), ("kt2", 384, 4, 4, 32), ("kt2", 256, 4, 4, 64),
              ("kt2", 512, 4, 4, 64)],
    "blogA": [("old", 320, 4, 4, 128, 3), ("kt2", 512, 8, 4, 32), ("kt2", 320, 4, 4, 64), ("kt2", 256, 8, 8, 32), ("kt2", 512, 8, 8, 32)],
    "gru-mid": [("old", 256, 8, 8, 64, 3), ("kt2", 256, 8, 8, 32), ("kt2", 384, 8, 8, 16)],
}
RO = "#define RNN_ROTATE\n"
VARIANTS5 = {
    "mid": [("old", 256, 8, 8, 64, 2), ("old", 256, 8, 8, 64, 2, RO), ("new", 256, 8, 8, 64, 2, RO), ("new", 384, 8, 8, 32, 2, RO)],
    "large": [("old", 256, 4, 4, 64, 2), ("old", 256, 4, 4, 64, 2, RO), ("old", 256, 8, 8, 32, 2, RO), ("new", 256, 4, 4, 64, 2, RO),
              ("new", 256, 8, 8, 64, 2, RO), ("new", 512, 8, 4, 32, 2, RO)],
    "blogB": [("old", 384, 4, 4, 128, 4), ("old", 384, 4, 4, 128, 4, RO), ("old", 384, 4, 4, 64, 4, RO), ("new", 384, 4, 4, 64, 2, RO)],
    "blogA": [("old", 320, 4, 4, 128, 3), ("old", 320, 4, 4, 128, 3, RO), ("new", 512, 8, 4, 32, 2, RO)],
    "gru-mid": [("old", 256, 8, 8, 64, 3), ("old", 256, 8, 8, 64, 3, RO), ("new", 256, 8, 8, 64, 2, RO)],
}
VARIANTS8 = {
    "mid": [("old", 256, 8, 8, 64, 2), ("ws", 256, 8, 8, 64, 2), ("ws", 256, 8, 8, 32, 4), ("old", 384, 8, 4, 64, 2), ("ws", 384, 8, 4, 64, 2)],
    "large": [("old", 256, 4, 4, 64, 2), ("ws", 256, 4, 4, 64, 2), ("ws", 256, 4, 4, 32, 4), ("old", 384, 8, 4, 64, 2), ("ws", 384, 8, 4, 64, 2), ("ws", 384, 8, 4, 32, 4)],
    "blogB": [("old", 384, 4, 4, 128, 4), ("ws", 384, 4, 4, 128, 4), ("ws", 384, 4, 4, 64, 4)],
    "blogA": [("old", 320, 4, 4, 128, 3), ("ws", 320, 4, 4, 128, 3), ("old", 320, 8, 4, 64, 4), ("ws", 320, 8, 4, 64, 4)],
}
VARIANTS9 = {
    "large": [("old", 256, 4, 4, 64, 2), ("ws", 256, 4, 4, 64, 2, "", 1), ("ws", 256, 4, 4, 64, 2, "", 2), ("ws", 256, 4, 4, 64, 2, "", 4), ("ws", 256, 4, 4, 32, 4, "", 4)],
    "blogB": [("old", 384, 4, 4, 128, 4), ("ws", 384, 4, 4, 128, 4, "", 2), ("ws", 384, 4, 4, 64, 4, "", 4)],
    "blogA": [("old", 320, 4, 4, 128, 3), ("ws", 320, 4, 4, 128, 3, "", 1), ("ws", 320, 4, 4, 128, 3, "", 2), ("ws", 320, 4, 4, 128, 3, "", 4)],
}
VARIANTS = {
    "mid": [("old", 256, 8, 8, 64, 2), ("old", 256, 4, 4, 64, 2), ("new", 256, 8, 8, 64), ("new", 512, 8, 8, 32),
            ("new", 384, 8, 8, 32), ("new", 256, 4, 4, 64), ("new", 512, 8, 4, 32), ("new", 512, 4, 8, 32), ("new", 512, 4, 4, 32)],
    "large": [("old", 256, 4, 4, 64, 2), ("old", 256, 8, 8, 32, 2), ("new", 256, 4, 4, 64), ("new", 256, 8, 8, 64), ("new", 512, 8, 8, 32),
              ("new", 512, 8, 4, 32), ("new", 512, 4, 8, 32), ("new", 256, 8, 4, 64)],
    "blogB": [("old", 384, 4, 4, 128, 4), ("new", 384, 4, 4, 64), ("new", 384, 4, 4, 128), ("new", 256, 4, 4, 128), ("new", 512, 4, 4, 64),
              ("new", 192, 4, 4, 128), ("new", 512, 8, 4, 64)],
    "blogA": [("old", 320, 4, 4, 128, 3), ("new", 320, 4, 4, 64), ("new", 320, 4, 4, 128), ("new", 256, 8, 4, 64), ("new", 512, 8, 4, 32), ("new", 512, 8, 8, 32)],
    "gru-mid": [("old", 256, 8, 8, 64, 3), ("new", 256, 8, 8, 64), ("new", 384, 8, 8, 32), ("new", 512, 8, 4, 32)],
}

def single(name, table, idx, steps=20):
    """For ncu: one variant, one timed launch."""
    B, NC, jobs = CASES[name]
    v = table[name][idx]
    kind, T, RB, RC, KC = v[:5]
    return run(name, kind, B, NC, jobs, T, RB, RC, KC, *(v[5:]), steps=steps)


if __name__ == "__main__":
    if sys.argv[1:2] == ["single"]:
        tables = {"rot": VARIANTS5, "diag": VARIANTS2, "kt2": VARIANTS4, "load": VARIANTS3, "base": VARIANTS}
        print(single(sys.argv[2], tables[sys.argv[3]], int(sys.argv[4])))
        sys.exit(0)
    which = sys.argv[1:] or list(CASES)
    if which[0] == "pw":
        which = which[1:]
        VARIANTS = VARIANTS9
    if which[0] == "ws":
        which = which[1:]
        VARIANTS = VARIANTS8
    if which[0] == "diag":
        which = which[1:]
        VARIANTS = VARIANTS2
    if which[0] == "rot":
        which = which[1:]
        VARIANTS = VARIANTS5
    if which[0] == "kt2":
        which = which[1:]
        VARIANTS = VARIANTS4
    if which[0] == "load":
        which = which[1:]
        VARIANTS = VARIANTS3
    out = []
    for name in which:
        B, NC, jobs = CASES[name]
        for v in VARIANTS[name]:
            kind, T, RB, RC, KC = v[:5]
            r = run(name, kind, B, NC, jobs, T, RB, RC, KC, *(v[5:]))
            out.append(r)
            if "error" in r:
                print(f"{r['label']:40s} ERROR {r['error'][:300]}", flush=True)
            else:
                print(f"{r['label']:40s} {r['us_per_step']:8.2f} us/step {r['tflops']:6.1f} TF/s err {r['err']:.1e} regs {r['regs']} spill {r['spill']} smem {r['smem']}", flush=True)
    if os.environ.get("OUT"):
        json.dump(out, open(os.path.join(os.environ["OUT"], "gemm_micro.json"), "w"), indent=1)
