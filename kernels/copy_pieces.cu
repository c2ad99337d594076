// Many copies in one launch: block i copies piece i, a run of at most COPY_CHUNK floats (engine/autodiff/fused.py)
// from table[i] to table[pieces + i], table[2 * pieces + i] of them; a source of 0 writes zeros.
//
// The fused training step loads x, every layer's parameters (the stacked weights, the vectors) and the initial
// states into its fixed buffers with it: a copy a parameter from Python cost ~20 us of host time each.
extern "C" __global__ void copy_pieces(const long long* __restrict__ table, const int pieces)
{
    const float* src = reinterpret_cast<const float*>(table[blockIdx.x]);          /* 0: zeros */
    float* dst = reinterpret_cast<float*>(table[pieces + blockIdx.x]);
    const long long n = table[2 * pieces + blockIdx.x];
    for (long long i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src ? src[i] : 0.0f;
}
