// One step of causal linear attention as an RNN, for many sequences at once (batched
// decoding): Eq. (16)-(20) of Katharopoulos et al. (2020), arXiv:2006.16236, on positive
// features. Launched by linattn/cuda/step.py; its oracle is linattn/forms/recurrent.py::step.
// The scalar type `real` is float or double, chosen with -DLINATTN_REAL=float|double.
//
// Shapes, per sequence-head b of B (leading axes flattened), all C-contiguous:
//   q, k (B, F); v, out (B, M); s, s_new (B, F, M); z, z_new (B, F).
//
// Versions
//   v1  rnn_step: one block of 256 threads per sequence-head. Thread t = (g, x) with
//       g = t / 64 a group of rows f = g, g + 4, ... and x = t % 64 a column m = m0 + x of a
//       64-wide column tile, so each warp reads and writes 128 (256) contiguous bytes of S per
//       row: the step is a stream over S, bounded by memory bandwidth.
#ifndef LINATTN_REAL
#define LINATTN_REAL float
#endif
typedef LINATTN_REAL real;
typedef long long index_t;

constexpr int THREADS = 256;
constexpr int LANES = 64;                   // columns per tile
constexpr int GROUPS = THREADS / LANES;     // row groups

// s_new = s + k v^T, z_new = z + k (Eq. 17-18); out = q^T s_new / (q . z_new + eps) (Eq. 19).
extern "C" __global__ void __launch_bounds__(THREADS)
rnn_step(const real* q, const real* k, const real* v, const real* s, const real* z,
         real* s_new, real* z_new, real* out, int f, int m, real eps)
{
    __shared__ real num[GROUPS][LANES], den_part[GROUPS];
    const index_t b = blockIdx.x;
    const int g = threadIdx.x / LANES, x = threadIdx.x % LANES;
    q += b * f; k += b * f; z += b * f; z_new += b * f;
    v += b * m; out += b * m;
    s += b * f * m; s_new += b * f * m;

    real d = 0;                                      // this group's share of q . z_new
    for (int r = g; r < f; r += GROUPS) {
        const real zr = z[r] + k[r];                 // Eq. (18)
        d += q[r] * zr;
        if (x == 0) z_new[r] = zr;
    }
    if (x == 0) den_part[g] = d;
    __syncthreads();
    real den = eps;
    for (int i = 0; i < GROUPS; ++i) den += den_part[i];

    for (int m0 = 0; m0 < m; m0 += LANES) {
        const int col = m0 + x;
        real acc = 0;                                // this group's share of q^T s_new[:, col]
        if (col < m) {
            const real vc = v[col];
#pragma unroll 4
            for (int r = g; r < f; r += GROUPS) {
                const real sn = s[(index_t)r * m + col] + k[r] * vc;    // Eq. (17)
                s_new[(index_t)r * m + col] = sn;
                acc += q[r] * sn;
            }
        }
        num[g][x] = acc;
        __syncthreads();
        if (g == 0 && col < m) {
            real total = 0;
            for (int i = 0; i < GROUPS; ++i) total += num[i][x];
            out[col] = total / den;                  // Eq. (20), attention part
        }
        __syncthreads();
    }
}
