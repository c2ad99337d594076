// A pool over time folded into the kernel that produces its input (issue #11): the last layer of a wavefront
// program, instead of storing h_t into its (T*B, F) output sequence, folds it into the pooled output
// (T_out*B, F), T_out = (T - W) / S + 1, where output step tp is the max or the mean over steps [tp*S, tp*S + W).
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

// out: element (b, column) of output step 0; step_stride: elements between output steps (B * row length).
template <int OP, int W, int S>
__host__ __device__ __forceinline__ void rnn_pool_step(float* __restrict__ out, long step_stride, float v, int t,
                                                       int steps_out)
{
    const int first = t < W ? 0 : (t - W + S) / S;            // ceil((t - W + 1) / S), never negative
    const int last = t / S < steps_out - 1 ? t / S : steps_out - 1;
    for (int tp = first; tp <= last; ++tp) {
        float& p = out[tp * step_stride];
        const int k = t - tp * S;                             // position of step t in window tp: 0 <= k < W
        if (k == 0) {
            p = v;
        } else if (OP == RNN_POOL_MAX) {
            p = (v > p || v != v) ? v : p;
        } else {
            p += v;
        }
        if (OP == RNN_POOL_MEAN && k == W - 1) p = p / W;
    }
}

#endif  // RNN_POOL_CUH
