// A pool over time folded into the kernel that produces its input (issue #11): a layer of a wavefront program
// followed by a pool (the last one, or one with layers above it: engine/schedules/steps.py), instead of storing h_t
// into its (T*B, F) output sequence, folds it into the pooled output (T_out*B, F), T_out = (T - W) / S + 1, where
// output step tp is the max or the mean over steps [tp*S, tp*S + W). The layer above reads the pooled sequence.
//
// Every (b, column) of the output is written by one thread of one block at every step (the block owns its hidden
// units for the whole run, and the thread that owns element e of the cell math at step t owns it at t + 1), so the
// read-modify-write below is private to that thread and ordered by its own program order: no atomics, no barrier,
// and the same order of operations on every run (bit-identical reruns). The unpooled sequence is never written.
//
// A step t falls into the windows tp with tp*S <= t < tp*S + W and tp < T_out: the first step of a window
// overwrites (so a poisoned or stale buffer never leaks in), the later ones fold in, and for a mean the last one
// divides by W. Max propagates NaN as NumPy's max does (fmaxf would drop it). Steps past the last window
// (T - T_out*S - (W - S) of them) touch nothing.
#ifndef RNN_POOL_CUH
#define RNN_POOL_CUH

#ifndef __CUDACC__                      // the host test (tests/test_pool_epilogue.py) compiles this with a C++ compiler
#define __host__
#define __device__
#define __forceinline__ inline
#endif

#define RNN_POOL_MAX 0
#define RNN_POOL_MEAN 1

// out: element (b, column) of output step 0; step_stride: elements between output steps (B * row length). op, w, s:
// the pool (RNN_POOL_MAX or RNN_POOL_MEAN, window, stride), run-time values: a layer's own, from its argument row.
__host__ __device__ __forceinline__ void rnn_pool_step(float* __restrict__ out, long step_stride, float v, int t,
                                                       int steps_out, int op, int w, int s)
{
    const int first = t < w ? 0 : (t - w + s) / s;            // ceil((t - w + 1) / s), never negative
    const int last = t / s < steps_out - 1 ? t / s : steps_out - 1;
    for (int tp = first; tp <= last; ++tp) {
        float& p = out[tp * step_stride];
        const int k = t - tp * s;                             // position of step t in window tp: 0 <= k < w
        if (k == 0) {
            p = v;
        } else if (op == RNN_POOL_MAX) {
            p = (v > p || v != v) ? v : p;
        } else {
            p += v;
        }
        if (op == RNN_POOL_MEAN && k == w - 1) p = p / w;
    }
}

#endif  // RNN_POOL_CUH
