// The softmax of softmax attention, row by row: Eq. (2) of Katharopoulos et al. (2020),
// arXiv:2006.16236, with the causal mask of Eq. (8), and its backward. The products q k^T,
// P v and their gradients are CuPy matrix products (linattn/cuda/softmax.py); only the
// row-wise softmax needs a kernel. Oracle: linattn/softmax.py.
// The scalar type `real` is float or double, chosen with -DLINATTN_REAL=float|double.
//
// Shapes: x, p, dp (R, N): R = H * N rows of logits, row r is query position i = r % N.
//
// Versions
//   v1  one block of 256 threads per row; thread t visits columns t, t + 256, ...; block
//       reductions by warp shuffles, then across the 8 warps in shared memory. Three passes
//       over the row (max, sum, write), all in the L1/L2 caches for N up to ~10^4.
#ifndef LINATTN_REAL
#define LINATTN_REAL float
#endif
typedef LINATTN_REAL real;
typedef long long index_t;

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;

// max that keeps NaN: a NaN logit makes the whole row NaN, as in NumPy.
__device__ __forceinline__ real nan_max(real a, real b) { return (a > b || a != a) ? a : b; }

// The maximum (if is_max) or the sum of v over the block; every thread gets the result.
__device__ real block_reduce(real v, bool is_max, real* partial)
{
    for (int lane = 16; lane > 0; lane /= 2) {
        const real o = __shfl_xor_sync(0xffffffffu, v, lane);
        v = is_max ? nan_max(v, o) : v + o;
    }
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    v = partial[0];
    for (int w = 1; w < WARPS; ++w) v = is_max ? nan_max(v, partial[w]) : v + partial[w];
    __syncthreads();                                 // partial is reused by the next call
    return v;
}

// In place: x[r, j] <- exp(scale x_rj - max) / sum for j < width, 0 beyond (the causal mask,
// width = i + 1), the max and sum over the visible columns only.
extern "C" __global__ void __launch_bounds__(THREADS)
softmax_rows(real* x, int n, int causal, real scale)
{
    __shared__ real partial[WARPS];
    const index_t r = blockIdx.x;
    real* row = x + r * n;
    const int width = causal ? (int)(r % n) + 1 : n;   // every row sees column 0
    real mx = scale * row[0];
    for (int j = threadIdx.x; j < width; j += THREADS) mx = nan_max(mx, scale * row[j]);
    mx = block_reduce(mx, true, partial);
    real sum = 0;
    for (int j = threadIdx.x; j < width; j += THREADS) sum += exp(scale * row[j] - mx);
    sum = block_reduce(sum, false, partial);
    for (int j = threadIdx.x; j < n; j += THREADS)
        row[j] = j < width ? exp(scale * row[j] - mx) / sum : real(0);
}

// In place: dp[r, j] <- p_rj (dp_rj - sum_j' dp_rj' p_rj') scale, the gradient of the logits
// before scaling; masked entries have p = 0.
extern "C" __global__ void __launch_bounds__(THREADS)
softmax_rows_backward(const real* p, real* dp, int n, real scale)
{
    __shared__ real partial[WARPS];
    const index_t r = blockIdx.x;
    const real* prow = p + r * n;
    real* drow = dp + r * n;
    real dot = 0;
    for (int j = threadIdx.x; j < n; j += THREADS) dot += drow[j] * prow[j];
    dot = block_reduce(dot, false, partial);
    for (int j = threadIdx.x; j < n; j += THREADS) drow[j] = prow[j] * (drow[j] - dot) * scale;
}
