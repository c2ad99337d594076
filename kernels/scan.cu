// The linear recurrence s[t] = a[t] * s[t-1] + b[t] over t = 0..steps-1 for `chains` independent chains (one per
// batch row and hidden unit), as three passes over chunks of `chunk` steps (engine/schedules/scan.py):
//   1. scan_chunks: per chain and chunk, the chunk as one affine map s -> A s + B (A = the product of its a,
//      B = the recurrence from 0): the associative combination (a, b) o (a', b') = (a a', a' b + b');
//   2. scan_carry: per chain, the state entering each chunk, from the initial state through the chunks' maps;
//   3. scan_apply: per chain and chunk, the recurrence again from that state, writing every step.
// Arrays are (steps, chains) with chains contiguous: consecutive threads read consecutive addresses. SCAN_T is
// float or double (engine/schedules/scan.py defines it before this file and kernels/scan_carry.cuh, pass 2,
// which the scan that forms its coefficients itself shares: engine/schedules/scan_kernel.py).

extern "C" __global__ void scan_chunks(const SCAN_T* __restrict__ a, const SCAN_T* __restrict__ b,
                                       SCAN_T* __restrict__ map_a, SCAN_T* __restrict__ map_b,
                                       int steps, long long chains, int chunk) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= chains) return;
  const int t0 = blockIdx.y * chunk, t1 = min(t0 + chunk, steps);
  SCAN_T pa = 1, pb = 0;
  for (int t = t0; t < t1; ++t) {
    const SCAN_T at = a[t * chains + c];
    pb = at * pb + b[t * chains + c];
    pa *= at;
  }
  map_a[blockIdx.y * chains + c] = pa;
  map_b[blockIdx.y * chains + c] = pb;
}

extern "C" __global__ void scan_apply(const SCAN_T* __restrict__ a, const SCAN_T* __restrict__ b,
                                      const SCAN_T* __restrict__ entering, SCAN_T* __restrict__ out,
                                      int steps, long long chains, int chunk) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= chains) return;
  const int t0 = blockIdx.y * chunk, t1 = min(t0 + chunk, steps);
  SCAN_T s = entering[blockIdx.y * chains + c];
  for (int t = t0; t < t1; ++t) {
    s = a[t * chains + c] * s + b[t * chains + c];
    out[t * chains + c] = s;
  }
}
