// Many copies in one launch: block i copies piece i, a run of at most COPY_CHUNK floats
// (engine/autodiff/fused_runner.py).
// Table columns, `pieces` entries each: the piece's first source float (0: write zeros), the destination's first
// float, the piece's count, its first element's index in the copy, the destination's row width and row stride.
// Element e of a copy goes to dst[(e / width) * stride + e % width]: a contiguous destination has width = stride
// (a run), a block of a larger matrix (a Stack's weight grid, a state beside others) its own width and the matrix's.
//
// The fused training step loads x, every layer's parameters (the stacked weights, the vectors) and the initial
// states into its fixed buffers with it: a copy a parameter from Python cost ~20 us of host time each.
extern "C" __global__ void copy_pieces(const long long* __restrict__ table, const int pieces)
{
    const long long i = blockIdx.x;
    const float* src = reinterpret_cast<const float*>(table[i]);
    float* dst = reinterpret_cast<float*>(table[pieces + i]);
    const long long n = table[2 * pieces + i], first = table[3 * pieces + i];
    const long long width = table[4 * pieces + i], stride = table[5 * pieces + i];
    for (long long e = threadIdx.x; e < n; e += blockDim.x) {
        const long long k = first + e;
        dst[(k / width) * stride + k % width] = src ? src[e] : 0.0f;
    }
}
