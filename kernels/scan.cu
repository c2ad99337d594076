// The linear recurrence s[t] = a[t] * s[t-1] + b[t] over t = 0..steps-1 for `chains` independent chains (one per
// batch row and hidden unit), as three passes over chunks of `chunk` steps (engine/schedules/scan.py):
//   1. scan_chunks: per chain and chunk, the chunk as one affine map s -> A s + B (A = the product of its a,
//      B = the recurrence from 0): the associative combination (a, b) o (a', b') = (a a', a' b + b');
//   2. scan_carry: per chain, the state entering each chunk, from the initial state through the chunks' maps;
//   3. scan_apply: per chain and chunk, the recurrence again from that state, writing every step.
// Arrays are (steps, chains) with chains contiguous: consecutive threads read consecutive addresses. reverse = 1
// runs the recurrence from the last step to the first (scan step k is time steps-1-k; out stays in time order), and
// a_shift = 1 takes time t's coefficient from a[t + 1] (0 past the end): together, the adjoint's reverse scan
// g[t] = b[t] + a[t+1] g[t+1] over the forward's own arrays, with no reversed or shifted copy. SCAN_T is
// float or double (engine/schedules/scan.py defines it before this file and kernels/scan_carry.cuh, pass 2,
// which the scan that forms its coefficients itself shares: engine/schedules/scan_kernel.py).

// SCAN_U1 and SCAN_U3: the steps whose loads a thread has in flight at once in pass 1 and pass 3, defined before
// this file with SCAN_T (engine/schedules/scan_kernel.py UNROLL says why they are what they are).
#if !defined(SCAN_U1) || !defined(SCAN_U3)
#error "define SCAN_U1 and SCAN_U3 first (engine/schedules/scan_kernel.py unroll_defines)"
#endif

// Step k's coefficients (k counts scan steps; t is its time): a from time t + a_shift (0 past the end), b from t.
// The indices are clamped, not branched on, so the loads of an unrolled batch issue together.
__device__ __forceinline__ void step_coefficients(const SCAN_T* __restrict__ a, const SCAN_T* __restrict__ b, int k,
                                          int steps, long long chains, long long c, int reverse, int a_shift,
                                          SCAN_T& at, SCAN_T& bt) {
  const int t = reverse ? steps - 1 - k : k, ta = t + a_shift;
  at = a[(long long)min(ta, steps - 1) * chains + c];
  if (ta >= steps) at = 0;
  bt = b[(long long)t * chains + c];
}

extern "C" __global__ void scan_chunks(const SCAN_T* __restrict__ a, const SCAN_T* __restrict__ b,
                                       SCAN_T* __restrict__ map_a, SCAN_T* __restrict__ map_b,
                                       int steps, long long chains, int chunk, int reverse, int a_shift) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= chains) return;
  const int k0 = blockIdx.y * chunk, k1 = min(k0 + chunk, steps);
  SCAN_T pa = 1, pb = 0;
  for (int k = k0; k < k1; k += SCAN_U1) {
    SCAN_T as[SCAN_U1], bs[SCAN_U1];
#pragma unroll
    for (int i = 0; i < SCAN_U1; ++i) step_coefficients(a, b, min(k + i, k1 - 1), steps, chains, c, reverse, a_shift, as[i], bs[i]);
#pragma unroll
    for (int i = 0; i < SCAN_U1; ++i)
      if (k + i < k1) { pb = as[i] * pb + bs[i]; pa *= as[i]; }
  }
  map_a[blockIdx.y * chains + c] = pa;
  map_b[blockIdx.y * chains + c] = pb;
}

extern "C" __global__ void scan_apply(const SCAN_T* __restrict__ a, const SCAN_T* __restrict__ b,
                                      const SCAN_T* __restrict__ entering, SCAN_T* __restrict__ out,
                                      int steps, long long chains, int chunk, int reverse, int a_shift) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= chains) return;
  const int k0 = blockIdx.y * chunk, k1 = min(k0 + chunk, steps);
  SCAN_T s = entering[blockIdx.y * chains + c];
  for (int k = k0; k < k1; k += SCAN_U3) {
    SCAN_T as[SCAN_U3], bs[SCAN_U3];
#pragma unroll
    for (int i = 0; i < SCAN_U3; ++i) step_coefficients(a, b, min(k + i, k1 - 1), steps, chains, c, reverse, a_shift, as[i], bs[i]);
#pragma unroll
    for (int i = 0; i < SCAN_U3; ++i) {
      if (k + i < k1) {
        s = as[i] * s + bs[i];
        out[(long long)(reverse ? steps - 1 - (k + i) : k + i) * chains + c] = s;
      }
    }
  }
}
