// Causal linear attention on positive features: Eq. (9)-(12) forward and Eq. (13)-(15)
// backward of Katharopoulos et al. (2020), arXiv:2006.16236, with the normaliser.
// Launched by linattn/cuda/cumulative.py (v1) and linattn/cuda/chunked.py (v2); their oracle
// is the NumPy backend. The scalar type `real` is float or double, chosen at compile time
// with -DLINATTN_REAL=float|double (one compile per dtype).
//
// Shapes, per head h of H (batch x heads flattened), all C-contiguous:
//   q, k (H, N, F) positive features; v, out (H, N, M); chunk states (H, NC, F, M),
//   NC = ceil(N / 64).
//
// Versions
//   v1 naive    scan_product: one thread per (head, output column p) walks all N positions,
//               keeping its running state column in global memory (O(N) steps per thread).
//               Computes the unnormalised "causal product"; the normaliser is an extra value
//               column of ones (linattn/forms/normaliser.py), the backward four scans.
//   v2 chunked  a chunked scan, 64 positions per chunk, normaliser fused:
//               1. chunk_states: each chunk's K_c^T V_c and sum of k (grid: chunk x F-tile
//                                x M-tile)
//               2. chunk_scan:   exclusive prefix of the chunk states over chunks (one thread per
//                                state element, reverse for the backward)
//               3. chunk_forward: out_c = (Q_c S_c + tril(Q_c K_c^T) V_c) / den_c per chunk and
//                                 64-wide M-tile; chunk_backward_qk and chunk_backward_v the same
//                                 for the gradients.
//               Every product is a 64 x 64 output tile per block of 256 threads: thread
//               (ty, tx) = (t / 16, t % 16) owns rows ty*4..ty*4+3 and columns tx*4..tx*4+3;
//               operands stream through shared memory STEP reduction rows at a time.
#ifndef LINATTN_REAL
#define LINATTN_REAL float
#endif
typedef LINATTN_REAL real;
typedef long long index_t;

// ---------------------------------------------------------------------------------------------
// v1: scan_product. out[h, i, p] = sum_r (sum_{j <= i} a[h, j, p] b[h, j, r]) c[h, i, r], or
// sum over j >= i when reverse. a, out (H, N, P); b, c (H, N, R); state (H, P, R) zeros.
//   forward product: a = [v, 1], b = k, c = q      dphi_q: a = k, b = [v, 1], c = dout
//   dphi_k (reverse): a = q, b = dout, c = [v, 1]  dv (reverse): a = dout, b = q, c = k
// Thread idx = h * P + p.
extern "C" __global__ void scan_product(const real* a, const real* b, const real* c,
                                        real* state, real* out, int heads, int n, int p,
                                        int r, int reverse)
{
    const index_t idx = blockIdx.x * (index_t)blockDim.x + threadIdx.x;
    if (idx >= (index_t)heads * p) return;
    const index_t h = idx / p, col = idx % p;
    real* s = state + idx * r;                       // this thread's running sum, length R
    for (int step = 0; step < n; ++step) {
        const index_t i = h * n + (reverse ? n - 1 - step : step);
        const real ai = a[i * p + col];
        real acc = 0;
        for (int x = 0; x < r; ++x) {
            s[x] += ai * b[i * r + x];               // S_i = S_{i-1} + a_i b_i^T, Eq. (10)
            acc += s[x] * c[i * r + x];              // c_i^T S_i, Eq. (12)
        }
        out[i * p + col] = acc;
    }
}

// ---------------------------------------------------------------------------------------------
// v2 building blocks.
constexpr int TILE = 64;                    // chunk length, and the width of F- and M-tiles
constexpr int PAD = TILE + 4;               // shared row length: rows stay 16- (32-) byte aligned
constexpr int THREADS = 256;                // 16 x 16 threads, 4 x 4 outputs each
constexpr int STEP = 64 / (int)sizeof(real);    // reduction rows per stage: 16 float, 8 double
typedef real Shared[PAD];                   // a row of a shared-memory tile

struct alignas(4 * sizeof(real)) Four { real x[4]; };   // one vector load from shared memory

// A row-major matrix block, read as zero outside rows x cols (chunk tails, F and M edges).
struct Matrix {
    const real* p;
    index_t ld;
    int rows, cols;
};

__device__ __forceinline__ real at(const Matrix& a, int row, int col)
{
    return (row < a.rows && col < a.cols) ? a.p[row * a.ld + col] : real(0);
}

// Stage STEP reduction rows k0.. of an operand into s[kk][x], x < TILE:
// s[kk][x] = a[x0 + x][k0 + kk] if TRANS (the reduction runs along a's rows),
// else a[k0 + kk][x0 + x].
template <bool TRANS>
__device__ void stage(Shared* s, const Matrix& a, int k0, int x0)
{
    for (int e = threadIdx.x; e < STEP * TILE; e += THREADS) {
        const int kk = TRANS ? e % STEP : e / TILE, x = TRANS ? e / STEP : e % TILE;
        s[kk][x] = TRANS ? at(a, x0 + x, k0 + kk) : at(a, k0 + kk, x0 + x);
    }
}

// acc[a][b] += sum_kk xs[kk][ty*4 + a] * ys[kk][tx*4 + b] over K staged rows.
template <int K>
__device__ __forceinline__ void mma(real acc[4][4], const Shared* xs, const Shared* ys)
{
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int kk = 0; kk < K; ++kk) {
        const Four x = *reinterpret_cast<const Four*>(&xs[kk][ty * 4]);
        const Four y = *reinterpret_cast<const Four*>(&ys[kk][tx * 4]);
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) acc[a][b] += x.x[a] * y.x[b];
    }
}

// acc(i, j) += sum_{k < kdim} X(k, x0 + i) Y(k, y0 + j), both operands from global memory.
template <bool XT, bool YT>
__device__ void accumulate(real acc[4][4], const Matrix& x, int x0, const Matrix& y, int y0,
                           int kdim, Shared* xs, Shared* ys)
{
    for (int k0 = 0; k0 < kdim; k0 += STEP) {
        stage<XT>(xs, x, k0, x0);
        stage<YT>(ys, y, k0, y0);
        __syncthreads();
        mma<STEP>(acc, xs, ys);
        __syncthreads();
    }
}

// acc(i, j) += sum_{k < TILE} cs[k][i] Y(k, y0 + j): the left operand is a chunk-by-chunk
// matrix already in shared memory, stored k-major.
template <bool YT>
__device__ void accumulate_shared(real acc[4][4], const Shared* cs, const Matrix& y, int y0,
                                  Shared* ys)
{
    for (int k0 = 0; k0 < TILE; k0 += STEP) {
        stage<YT>(ys, y, k0, y0);
        __syncthreads();
        mma<STEP>(acc, cs + k0, ys);
        __syncthreads();
    }
}

// Zero the strictly upper triangle (j > i) of a chunk-by-chunk tile: a select, not a product,
// so a NaN above the diagonal (a future key) stays out of the rows before it.
__device__ __forceinline__ void causal_mask(real acc[4][4])
{
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
            if (tx * 4 + b > ty * 4 + a) acc[a][b] = 0;
}

// cs[i][j] = tile(i, j), or cs[j][i] if TRANS.
template <bool TRANS>
__device__ __forceinline__ void store_shared(Shared* cs, const real acc[4][4])
{
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int i = ty * 4 + a, j = tx * 4 + b;
            if (TRANS) cs[j][i] = acc[a][b]; else cs[i][j] = acc[a][b];
        }
}

// out[row0 + i][col0 + j] = tile(i, j) for rows < rows, columns < cols of a (., ld) array.
__device__ __forceinline__ void store_global(real* out, index_t ld, int rows, int cols,
                                             int col0, const real acc[4][4])
{
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int i = ty * 4 + a, j = col0 + tx * 4 + b;
            if (i < rows && j < cols) out[i * ld + j] = acc[a][b];
        }
}

// The chunk a block works on: blockIdx.x = h * NC + c.
struct Chunk {
    index_t pos;     // global index h * N + c * TILE of its first position
    index_t state;   // index h * NC + c of its state
    int rows;        // positions in the chunk, TILE except at the sequence's end
};

__device__ __forceinline__ Chunk this_chunk(int n)
{
    const int nc = (n + TILE - 1) / TILE, h = blockIdx.x / nc, c = blockIdx.x % nc;
    return {(index_t)h * n + (index_t)c * TILE, (index_t)blockIdx.x, min(TILE, n - c * TILE)};
}

// ---------------------------------------------------------------------------------------------
// v2 step 1: s[h, c] = X_c^T Y_c (P x R) and z[h, c] = X_c^T w_c (P), w = ones when null.
// Forward: X = phi_k, Y = v (S_c, z_c of Eq. 10-11); backward: X = phi_q, Y = dnum, w = dden.
// Grid (H * NC, ceil(P / 64), ceil(R / 64)).
extern "C" __global__ void __launch_bounds__(THREADS)
chunk_states(const real* x, const real* y, const real* w, real* s, real* z, int n, int p, int r)
{
    __shared__ __align__(32) Shared xs[STEP], ys[STEP];
    const Chunk ch = this_chunk(n);
    const int p0 = blockIdx.y * TILE, r0 = blockIdx.z * TILE;
    const Matrix X = {x + ch.pos * p, p, ch.rows, p}, Y = {y + ch.pos * r, r, ch.rows, r};
    real acc[4][4] = {};
    accumulate<false, false>(acc, X, p0, Y, r0, ch.rows, xs, ys);   // sum_j x_j y_j^T
    store_global(s + ch.state * p * r + (index_t)p0 * r, r, p - p0, r, r0, acc);
    const int col = p0 + threadIdx.x;
    if (blockIdx.z == 0 && threadIdx.x < TILE && col < p) {
        real sum = 0;                                               // sum_j x_j w_j
        for (int j = 0; j < ch.rows; ++j)
            sum += X.p[j * X.ld + col] * (w ? w[ch.pos + j] : real(1));
        z[ch.state * p + col] = sum;
    }
}

// v2 step 2: in place, a[h, c, e] = sum_{c' < c} a[h, c', e] (c' > c if reverse): the state
// entering each chunk. One thread per (h, e), BATCH independent loads in flight.
extern "C" __global__ void __launch_bounds__(THREADS)
chunk_scan(real* a, int heads, int nc, index_t e, int reverse)
{
    constexpr int BATCH = 16;
    const index_t idx = blockIdx.x * (index_t)blockDim.x + threadIdx.x;
    if (idx >= heads * e) return;
    real* col = a + (idx / e) * nc * e + idx % e;    // element idx % e of every chunk of head h
    real run = 0;
    for (int c0 = 0; c0 < nc; c0 += BATCH) {
        real val[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int c = reverse ? nc - 1 - (c0 + u) : c0 + u;
            val[u] = (c0 + u < nc) ? col[c * e] : real(0);
        }
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int c = reverse ? nc - 1 - (c0 + u) : c0 + u;
            if (c0 + u < nc) col[c * e] = run;
            run += val[u];
        }
    }
}

// Rows of the chunk-by-chunk matrix A_ij = q_i . k_j, j <= i, in registers.
__device__ void chunk_scores(real acc[4][4], const Matrix& Q, const Matrix& K, int f,
                             Shared* xs, Shared* ys)
{
    accumulate<true, true>(acc, Q, 0, K, 0, f, xs, ys);           // Q_c K_c^T
    causal_mask(acc);
}

// v2 step 3: out_i = (q_i^T S_c + sum_{j <= i in c} A_ij v_j) / den_i with
// den_i = q_i . z_c + sum_{j <= i in c} A_ij + eps (Eq. 9-12), one M-tile per block; den is
// also written (by the blocks of the first M-tile) for the backward.
// Grid (H * NC, ceil(M / 64)).
extern "C" __global__ void __launch_bounds__(THREADS)
chunk_forward(const real* q, const real* k, const real* v, const real* s, const real* z,
              real* out, real* den, int n, int f, int m, real eps)
{
    __shared__ __align__(32) Shared xs[STEP], ys[STEP], cs[TILE];
    __shared__ real rowsum[TILE], qz[TILE];
    const Chunk ch = this_chunk(n);
    const int m0 = blockIdx.y * TILE, t = threadIdx.x, ty = t / 16, tx = t % 16;
    const Matrix Q = {q + ch.pos * f, f, ch.rows, f}, K = {k + ch.pos * f, f, ch.rows, f};
    const Matrix V = {v + ch.pos * m, m, ch.rows, m}, S = {s + ch.state * f * m, m, f, m};
    const real* zc = z + ch.state * f;

    real a[4][4] = {};
    chunk_scores(a, Q, K, f, xs, ys);
#pragma unroll
    for (int i = 0; i < 4; ++i) {                // intra-chunk part of den: row sums of A
        real sum = a[i][0] + a[i][1] + a[i][2] + a[i][3];
        for (int lane = 8; lane > 0; lane /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, lane);
        if (tx == 0) rowsum[ty * 4 + i] = sum;
    }
    {                                            // inter-chunk part: q_i . z_c, 4 threads a row
        real sum = 0;
        for (int x = t % 4; x < f; x += 4) sum += at(Q, t / 4, x) * zc[x];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (t % 4 == 0) qz[t / 4] = sum;
    }
    store_shared<true>(cs, a);                   // cs[j][i] = A_ij

    real o[4][4] = {};
    accumulate_shared<false>(o, cs, V, m0, ys);                  // sum_{j <= i} A_ij v_j
    accumulate<true, false>(o, Q, 0, S, m0, f, xs, ys);          // + q_i^T S_c
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) o[i][j] /= rowsum[ty * 4 + i] + qz[ty * 4 + i] + eps;
    store_global(out + ch.pos * m, m, ch.rows, m, m0, o);
    if (blockIdx.y == 0 && t < ch.rows) den[ch.pos + t] = rowsum[t] + qz[t] + eps;
}

// v2 backward, dphi_q and dphi_k for one F-tile of one chunk. With dnum_i = dout_i / den_i,
// dden_i = -dout_i . out_i / den_i and dA_ij = dnum_i . v_j + dden_i (j <= i in c):
//   dq_i = sum_j dA_ij k_j + S_c dnum_i + z_c dden_i                      Eq. (13)
//   dk_j = sum_i dA_ij q_i + G_c v_j + g_c                                Eq. (14)
// S_c, z_c: forward states entering chunk c; G_c, g_c: backward states leaving it,
// sum over later chunks of q_i dnum_i^T and q_i dden_i. Grid (H * NC, ceil(F / 64)).
extern "C" __global__ void __launch_bounds__(THREADS)
chunk_backward_qk(const real* q, const real* k, const real* v, const real* dnum,
                  const real* dden, const real* s, const real* z, const real* g,
                  const real* gz, real* dq, real* dk, int n, int f, int m)
{
    __shared__ __align__(32) Shared xs[STEP], ys[STEP], cs[TILE];
    const Chunk ch = this_chunk(n);
    const int f0 = blockIdx.y * TILE, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    const Matrix Q = {q + ch.pos * f, f, ch.rows, f}, K = {k + ch.pos * f, f, ch.rows, f};
    const Matrix V = {v + ch.pos * m, m, ch.rows, m}, DN = {dnum + ch.pos * m, m, ch.rows, m};
    const Matrix S = {s + ch.state * f * m, m, f, m}, G = {g + ch.state * f * m, m, f, m};

    real da[4][4] = {};
    accumulate<true, true>(da, DN, 0, V, 0, m, xs, ys);          // dnum_i . v_j
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = ty * 4 + i;
        const real dd = row < ch.rows ? dden[ch.pos + row] : real(0);
#pragma unroll
        for (int j = 0; j < 4; ++j) da[i][j] = (tx * 4 + j <= row) ? da[i][j] + dd : real(0);
    }

    real acc[4][4] = {};
    store_shared<true>(cs, da);                                   // cs[j][i] = dA_ij
    accumulate_shared<false>(acc, cs, K, f0, ys);                 // sum_j dA_ij k_j
    accumulate<true, true>(acc, DN, 0, S, f0, m, xs, ys);         // + S_c dnum_i
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = ty * 4 + i;
        const real dd = row < ch.rows ? dden[ch.pos + row] : real(0);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = f0 + tx * 4 + j;
            if (col < f) acc[i][j] += dd * z[ch.state * f + col];  // + z_c dden_i
        }
    }
    store_global(dq + ch.pos * f, f, ch.rows, f, f0, acc);

    real bcc[4][4] = {};
    store_shared<false>(cs, da);                                  // cs[i][j] = dA_ij
    accumulate_shared<false>(bcc, cs, Q, f0, ys);                 // sum_i dA_ij q_i
    accumulate<true, true>(bcc, V, 0, G, f0, m, xs, ys);          // + G_c v_j
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = f0 + tx * 4 + j;
            if (col < f) bcc[i][j] += gz[ch.state * f + col];      // + g_c
        }
    store_global(dk + ch.pos * f, f, ch.rows, f, f0, bcc);
}

// v2 backward, dv for one M-tile of one chunk: dv_j = sum_{i >= j in c} A_ij dnum_i + G_c^T k_j,
// Eq. (15). Grid (H * NC, ceil(M / 64)).
extern "C" __global__ void __launch_bounds__(THREADS)
chunk_backward_v(const real* q, const real* k, const real* dnum, const real* g, real* dv,
                 int n, int f, int m)
{
    __shared__ __align__(32) Shared xs[STEP], ys[STEP], cs[TILE];
    const Chunk ch = this_chunk(n);
    const int m0 = blockIdx.y * TILE;
    const Matrix Q = {q + ch.pos * f, f, ch.rows, f}, K = {k + ch.pos * f, f, ch.rows, f};
    const Matrix DN = {dnum + ch.pos * m, m, ch.rows, m}, G = {g + ch.state * f * m, m, f, m};

    real a[4][4] = {};
    chunk_scores(a, Q, K, f, xs, ys);
    store_shared<false>(cs, a);                                   // cs[i][j] = A_ij
    real acc[4][4] = {};
    accumulate_shared<false>(acc, cs, DN, m0, ys);                // sum_i A_ij dnum_i
    accumulate<true, false>(acc, K, 0, G, m0, f, xs, ys);         // + G_c^T k_j
    store_global(dv + ch.pos * m, m, ch.rows, m, m0, acc);
}
