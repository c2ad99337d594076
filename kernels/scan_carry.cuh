// Pass 2 of the chunked scan (kernels/scan.cu): per chain, the state entering each chunk, from the initial state
// through the chunks' maps s -> A s + B. Shared by kernels/scan.cu and the scan that forms a and b itself
// (engine/schedules/scan_kernel.py); SCAN_T is defined before it.

extern "C" __global__ void scan_carry(const SCAN_T* __restrict__ map_a, const SCAN_T* __restrict__ map_b,
                                      const SCAN_T* __restrict__ initial, SCAN_T* __restrict__ entering,
                                      int chunks, long long chains) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= chains) return;
  SCAN_T s = initial[c];
#pragma unroll 8
  for (int k = 0; k < chunks; ++k) {                  // unrolled: the maps' loads of 8 chunks in flight at once
    entering[k * chains + c] = s;
    s = map_a[k * chains + c] * s + map_b[k * chains + c];
  }
}
