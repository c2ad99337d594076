// The fused stages' copies of the stacked weights, every layer's in one launch (engine/autodiff/fused_runner.py
// Runner.lay_out_weights; the same layouts as stage_fusion.lay_out, which the NumPy runner and the tests use).
//
// Target y of the launch reads a stacked weight S (rows x cols, row-major) and writes A, where A is S ("interleaved")
// or S^T ("transposed"), with its rows interleaved by `members`: A's row a = m * per + j (per = A's rows / members)
// goes to row j * members + m of the target. Table columns, `targets` entries each: S's address, the target's, S's
// rows, S's cols, transposed (0 or 1), members.
//
// A block copies 32 x 32 tiles of S: read along S's rows (coalesced), then written along the target's rows: directly
// where the target keeps S's orientation, through shared memory where it is transposed. The step used CuPy, an
// assignment a layout and layer (~40 us of host time each, 0.16 ms a step for a 2-layer LSTM).
#define TILE 32
#define ROWS_A_PASS 8     // blockDim.y: a block is 32 x 8 threads

__device__ __forceinline__ int interleaved_row(int a, int per, int members)
{
    return (a % per) * members + a / per;     // 32-bit: a stacked weight has fewer than 2^31 elements
}

extern "C" __global__ void lay_out_weights(const long long* __restrict__ table, const int targets)
{
    __shared__ float tile[TILE][TILE + 1];
    const int y = blockIdx.y;
    const float* __restrict__ src = reinterpret_cast<const float*>(table[y]);
    float* __restrict__ dst = reinterpret_cast<float*>(table[targets + y]);
    const int rows = static_cast<int>(table[2 * targets + y]), cols = static_cast<int>(table[3 * targets + y]);
    const bool transposed = table[4 * targets + y] != 0;
    const int members = static_cast<int>(table[5 * targets + y]);
    const int tiles_c = (cols + TILE - 1) / TILE, tiles = ((rows + TILE - 1) / TILE) * tiles_c;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {             // uniform over the block: the barriers hold
        const int r0 = (t / tiles_c) * TILE, c0 = (t % tiles_c) * TILE;
        if (!transposed) {                     // A = S: a permutation of whole rows
            const int per = rows / members;
            for (int dy = ty; dy < TILE; dy += ROWS_A_PASS) {
                const int r = r0 + dy, c = c0 + tx;
                if (r < rows && c < cols)
                    dst[static_cast<long long>(interleaved_row(r, per, members)) * cols + c] =
                        src[static_cast<long long>(r) * cols + c];
            }
            continue;
        }
        for (int dy = ty; dy < TILE; dy += ROWS_A_PASS) {
            const int r = r0 + dy, c = c0 + tx;
            if (r < rows && c < cols)
                tile[dy][tx] = src[static_cast<long long>(r) * cols + c];
        }
        __syncthreads();
        const int per = cols / members;        // A = S^T: cols rows of `rows` values
        for (int dy = ty; dy < TILE; dy += ROWS_A_PASS) {
            const int a = c0 + dy, r = r0 + tx;
            if (a < cols && r < rows)
                dst[static_cast<long long>(interleaved_row(a, per, members)) * rows + r] = tile[tx][dy];
        }
        __syncthreads();
    }
}
