// Vector parameters' gradients of a layer in one launch (engine/autodiff/fused.py, plan.column_dots): for item i of
// the table and column c < cols[i], out_i[c] += sum over the rows r < rows of a_i[r * lda_i + c] * b_i[r * ldb_i + c]
// (a peephole's gradient: its gate's dy times the cell state, over every step and batch row).
//
// Block (x, i) takes 32 columns of item i: lane = column, the block's 8 warps take every 8th row, each in row order,
// and the 8 partial sums are added in warp order: a fixed order, so the result is the same run to run. The table is
// six arrays of `items` entries: a, b, out (addresses), lda, ldb, cols.
extern "C" __global__ void column_dots(const long long* __restrict__ table, const int items, const int rows)
{
    __shared__ float partial[8][32];
    const int i = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* a = reinterpret_cast<const float*>(table[i]);
    const float* b = reinterpret_cast<const float*>(table[items + i]);
    float* out = reinterpret_cast<float*>(table[2 * items + i]);
    const long long lda = table[3 * items + i], ldb = table[4 * items + i], cols = table[5 * items + i];
    const long long c = (long long)blockIdx.x * 32 + lane;
    float sum = 0.0f;
    if (c < cols)
        for (int r = warp; r < rows; r += 8) sum = fmaf(a[r * lda + c], b[r * ldb + c], sum);
    partial[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && c < cols) {
        float total = partial[0][lane];
        for (int w = 1; w < 8; ++w) total += partial[w][lane];
        out[c] += total;
    }
}
