// The sum of a split-K GEMM's partial products (engine/autodiff/cublas.py, split_k): out[r, c] (+)= the sum over i of
// part[i][r, c], part holding `splits` contiguous (m, n) products, out row-major with leading dimension ldc.
extern "C" __global__ void splitk_reduce(float* __restrict__ out, const float* __restrict__ part, const int splits,
                                         const int m, const int n, const int ldc, const int accumulate)
{
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)m * n) return;
    const long r = idx / n, c = idx - r * n;
    float sum = accumulate ? out[r * ldc + c] : 0.0f;
    for (int i = 0; i < splits; ++i) sum += part[(long)i * m * n + idx];
    out[r * ldc + c] = sum;
}
