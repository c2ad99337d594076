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

extern "C" __global__ void scan_chunks(const SCAN_T* __restrict__ a, const SCAN_T* __restrict__ b,
                                       SCAN_T* __restrict__ map_a, SCAN_T* __restrict__ map_b,
                                       int steps, long long chains, int chunk, int reverse, int a_shift) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= chains) return;
  const int k0 = blockIdx.y * chunk, k1 = min(k0 + chunk, steps);
  SCAN_T pa = 1, pb = 0;
  for (int k = k0; k < k1; ++k) {
    const int t = reverse ? steps - 1 - k : k, ta = t + a_shift;
    const SCAN_T at = ta < steps ? a[ta * chains + c] : (SCAN_T)0;
    pb = at * pb + b[t * chains + c];
    pa *= at;
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
  for (int k = k0; k < k1; ++k) {
    const int t = reverse ? steps - 1 - k : k, ta = t + a_shift;
    s = (ta < steps ? a[ta * chains + c] : (SCAN_T)0) * s + b[t * chains + c];
    out[t * chains + c] = s;
  }
}
