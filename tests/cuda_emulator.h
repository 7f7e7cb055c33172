// Runs linattn/cuda/*.cu on the CPU, for the tests on machines without a GPU: each .cu file is
// compiled by g++ with this header forced in front (-include), one std::thread per CUDA
// thread, __syncthreads a barrier of the block, __shfl_xor_sync an exchange within the warp.
// Blocks run one after the other, so __shared__ arrays become function-static arrays.
// Not a model of GPU timing or memory ordering beyond the barriers: a test of the arithmetic
// and the indexing, and a coarse test for a missing barrier.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3_ { unsigned x, y, z; };
static thread_local dim3_ threadIdx, blockIdx;
static dim3_ blockDim, gridDim;
using std::exp;
using std::min;

static std::barrier<>* block_barrier;
static std::barrier<>* warp_barrier[32];
static double warp_values[32][32];

inline void __syncthreads() { block_barrier->arrive_and_wait(); }

// CUDA's explicitly rounded arithmetic: on the CPU each operator rounds once, as long as the
// compiler does not contract a * b + c into an fma (the tests build with -ffp-contract=off)
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }

template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    warp_values[warp][lane] = (double)v;          // float and double both fit exactly
    warp_barrier[warp]->arrive_and_wait();
    const T other = (T)warp_values[warp][lane ^ lane_mask];
    warp_barrier[warp]->arrive_and_wait();
    return other;
}

// Run `kernel` on a (gx, gy, gz) grid of blocks of `threads` threads (a multiple of 32), one
// std::thread per CUDA thread, the blocks one after another. The kernel's integer-class
// arguments (pointers, int, long long) come in `ints`, in order, and its one floating-point
// argument, if any, in `real`: on the x86-64 and AArch64 Linux calling conventions a call
// through the prototype (16 integer slots, one float or double) passes exactly those, since
// integer and floating-point arguments take separate registers and the stack slots are 8 bytes.
constexpr int SLOTS = 16;
typedef long long slots[SLOTS];

extern "C" void emulate_launch(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
                               void* kernel, const long long* ints, double real, int is_float)
{
    typedef void (*with_float)(long long, long long, long long, long long, long long, long long,
                               long long, long long, long long, long long, long long, long long,
                               long long, long long, long long, long long, float);
    typedef void (*with_double)(long long, long long, long long, long long, long long, long long,
                                long long, long long, long long, long long, long long, long long,
                                long long, long long, long long, long long, double);
    const long long* a = ints;
    std::barrier<> block(threads);
    std::vector<std::barrier<>*> warps;
    for (unsigned w = 0; w < threads / 32; ++w) warps.push_back(new std::barrier<>(32));
    block_barrier = &block;
    std::copy(warps.begin(), warps.end(), warp_barrier);
    blockDim = {threads, 1, 1};
    gridDim = {gx, gy, gz};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([=, &block] {
            threadIdx = {t, 0, 0};
            for (unsigned z = 0; z < gz; ++z)
                for (unsigned y = 0; y < gy; ++y)
                    for (unsigned x = 0; x < gx; ++x) {
                        blockIdx = {x, y, z};
                        if (is_float)
                            ((with_float)kernel)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                                                 a[8], a[9], a[10], a[11], a[12], a[13], a[14],
                                                 a[15], (float)real);
                        else
                            ((with_double)kernel)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                                                  a[8], a[9], a[10], a[11], a[12], a[13], a[14],
                                                  a[15], real);
                        block.arrive_and_wait();      // the next block reuses __shared__ arrays
                    }
        });
    for (auto& thread : pool) thread.join();
    for (auto* w : warps) delete w;
}
