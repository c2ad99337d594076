// Vector parameters' gradients of a layer (engine/autodiff/fused_runner.py, plan.column_dots): for item i of the
// table and column c < cols[i], out_i[c] += sum over the rows r < rows of a_i[r * lda_i + c] * b_i[r * ldb_i + c]
// (a peephole's gradient: its gate's dy times the cell state, over every step and batch row).
//
// Two launches, so that the T x B rows (6,400 at `blogB`) are spread over the GPU, not walked by one block a column
// group (24 blocks of 800 dependent steps a warp took 150 us at `blogB`):
// - column_dots_parts: block (x, i, z) takes 32 columns of item i (lane = column) over row chunk z of `chunk` rows;
//   its 8 warps take every 8th row of the chunk, each in row order, and add their sums in warp order into
//   parts[(z * items + i) * widest + c];
// - column_dots_sum: thread (i, c) adds the chunks' sums in chunk order into out_i[c].
// A fixed order throughout, so the result is the same run to run. The table is six arrays of `items` entries: a, b,
// out (addresses), lda, ldb, cols.
extern "C" __global__ void column_dots_parts(const long long* __restrict__ table, const int items, const int rows,
                                             const int chunk, const int widest, float* __restrict__ parts)
{
    __shared__ float partial[8][32];
    const int i = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* a = reinterpret_cast<const float*>(table[i]);
    const float* b = reinterpret_cast<const float*>(table[items + i]);
    const long long lda = table[3 * items + i], ldb = table[4 * items + i], cols = table[5 * items + i];
    const long long c = (long long)blockIdx.x * 32 + lane;
    const int r0 = blockIdx.z * chunk, r1 = min(rows, r0 + chunk);
    float sum = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (int r = r0 + warp; r < r1; r += 8) sum = fmaf(__ldg(a + r * lda + c), __ldg(b + r * ldb + c), sum);
    }
    partial[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && c < cols) {
        float total = partial[0][lane];
        for (int w = 1; w < 8; ++w) total += partial[w][lane];
        parts[((long long)blockIdx.z * items + i) * widest + c] = total;
    }
}

extern "C" __global__ void column_dots_sum(const long long* __restrict__ table, const int items, const int chunks,
                                           const int widest, const float* __restrict__ parts)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= items * widest) return;
    const int i = idx / widest, c = idx - i * widest;
    if (c >= table[5 * items + i]) return;
    float* out = reinterpret_cast<float*>(table[2 * items + i]);
    float total = 0.0f;
    for (int z = 0; z < chunks; ++z) total += parts[((long long)z * items + i) * widest + c];
    out[c] += total;
}
