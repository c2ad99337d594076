// Adds one row vector to every row of a row-major (rows, cols) matrix: y[r, c] += bias[c].
//
// The exported program uses it after a hoisted input-projection GEMM whose sums carry biases
// (engine/passes/fold.py folds them there): the biases are then added once per sequence row
// instead of once per step inside the cell kernel. Grid-stride, so any grid size covers any matrix.
#ifndef RNN_ROW_BIAS_CUH
#define RNN_ROW_BIAS_CUH

extern "C" __global__ void rnn_add_row_bias(float* __restrict__ y, const float* __restrict__ bias,
                                            const long rows, const int cols)
{
    const long total = rows * (long)cols;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        y[idx] += bias[idx % cols];
    }
}

#endif  // RNN_ROW_BIAS_CUH
