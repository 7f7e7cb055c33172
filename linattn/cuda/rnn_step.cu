// One step of causal linear attention as an RNN, for many sequences at once (batched
// decoding): Eq. (16)-(20) of Katharopoulos et al. (2020), arXiv:2006.16236, on positive
// features. Launched by linattn/cuda/step.py; its oracles are linattn/forms/recurrent.py::step
// and ::step_into. The scalar type `real` is float or double, chosen with
// -DLINATTN_REAL=float|double.
//
// Shapes, per sequence-head b of B (leading axes flattened), all C-contiguous:
//   q, k (B, F); v, out (B, M); s, s_new, s_c (B, F, M); z, z_new, z_c (B, F).
//
// Versions
//   v1  rnn_step: one block of 256 threads per sequence-head. Thread t = (g, x) with
//       g = t / 64 a group of rows f = g, g + 4, ... and x = t % 64 a column m = m0 + x of a
//       64-wide column tile, so each warp reads and writes 128 (256) contiguous bytes of S per
//       row: the step is a stream over S, bounded by memory bandwidth. It may run in place
//       (s_new == s, z_new == z; linattn.Recurrence does): each entry of S is read, then
//       written, by the one thread (g, x) that owns its row and column, and each entry of z by
//       the one thread x == 0 of its row's group; no thread reads an entry another writes.
//   v2  rnn_step_compensated: v1 in place with Kahan's compensated summation, s_c and z_c
//       the rounding each sum has lost so far (negated), as forms/recurrent.py::kahan_add_.
//       Every operation of the compensation is an explicitly rounded intrinsic (__fmul_rn,
//       __fadd_rn, __fsub_rn, or the double ones), which nvcc never contracts or reorders,
//       even under --use_fast_math. Without fast-math nvcc does not reassociate t - s, but it
//       does contract a * b + c into one fma by default: y = k v - c would become
//       fma(k, v, -c), harmless to the algorithm (the term is then the exact product) but
//       not what NumPy computes, which rounds k v first. Spelled out, the compensated state
//       equals NumPy's bit for bit in float64. In float32 it does too unless a value is
//       subnormal (below 2^-126): CuPy compiles with -ftz=true, so each of these operations
//       (mul.rn.ftz.f32, ...) flushes subnormal operands and results to zero where NumPy
//       keeps them (tests/test_cuda.py holds it to NumPy's operations flushed so). The
//       readout uses the sums s and z as they are, with contracted multiply-adds.
#ifndef LINATTN_REAL
#define LINATTN_REAL float
#endif
typedef LINATTN_REAL real;
typedef long long index_t;

constexpr int THREADS = 256;
constexpr int LANES = 64;                   // columns per tile
constexpr int GROUPS = THREADS / LANES;     // row groups

// Rounded arithmetic that nvcc neither contracts nor reorders, for float and double.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }

// *total_new = *total + k v, returned; COMPENSATED: Kahan's addition of the term k v with
// compensation *lost, in place (total_new is total), as forms/recurrent.py::kahan_add_.
template <bool COMPENSATED>
__device__ __forceinline__ real add_term(const real* total, real* total_new, real* lost,
                                         real k, real v)
{
    if (!COMPENSATED) {
        const real t = *total + k * v;
        *total_new = t;
        return t;
    }
    const real y = sub_rn(mul_rn(k, v), *lost);      // the term, less what was lost before
    const real t = add_rn(*total, y);                // the new sum, rounded
    *lost = sub_rn(sub_rn(t, *total), y);            // what this rounding lost, negated
    *total_new = t;
    return t;
}

// One sequence-head b = blockIdx.x: s_new = s + k v^T, z_new = z + k (Eq. 18-19, with
// compensation s_c, z_c when COMPENSATED), out = q^T s_new / (q . z_new + eps) (Eq. 20).
template <bool COMPENSATED>
__device__ __forceinline__ void step(const real* q, const real* k, const real* v,
                                     const real* s, const real* z, real* s_new, real* z_new,
                                     real* s_c, real* z_c, real* out, int f, int m, real eps)
{
    __shared__ real num[GROUPS][LANES], den_part[GROUPS];
    const index_t b = blockIdx.x;
    const int g = threadIdx.x / LANES, x = threadIdx.x % LANES;
    q += b * f; k += b * f; z += b * f; z_new += b * f;
    v += b * m; out += b * m;
    s += b * f * m; s_new += b * f * m;
    if (COMPENSATED) { s_c += b * f * m; z_c += b * f; }   // else null, never used

    if (x == 0) {                                    // one thread a group: z's rows g, g + 4, ...
        real d = 0;                                  // this group's share of q . z_new
        for (int r = g; r < f; r += GROUPS) {
            real* lost = COMPENSATED ? z_c + r : nullptr;
            d += q[r] * add_term<COMPENSATED>(z + r, z_new + r, lost, k[r], 1);   // Eq. (19)
        }
        den_part[g] = d;
    }
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
                const index_t i = (index_t)r * m + col;
                real* lost = COMPENSATED ? s_c + i : nullptr;
                acc += q[r] * add_term<COMPENSATED>(s + i, s_new + i, lost, k[r], vc);  // (18)
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

// v1: s_new = s + k v^T, z_new = z + k, out = q^T s_new / (q . z_new + eps); may run in place.
extern "C" __global__ void __launch_bounds__(THREADS)
rnn_step(const real* q, const real* k, const real* v, const real* s, const real* z,
         real* s_new, real* z_new, real* out, int f, int m, real eps)
{
    step<false>(q, k, v, s, z, s_new, z_new, nullptr, nullptr, out, f, m, eps);
}

// v2: v1 in place with Kahan's compensation s_c, z_c.
extern "C" __global__ void __launch_bounds__(THREADS)
rnn_step_compensated(const real* q, const real* k, const real* v, real* s, real* z,
                     real* s_c, real* z_c, real* out, int f, int m, real eps)
{
    step<true>(q, k, v, s, z, s, z, s_c, z_c, out, f, m, eps);
}
