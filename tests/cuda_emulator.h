// Runs linattn/cuda/*.cu on the CPU, for the tests on machines without a GPU: each .cu file is
// compiled by g++ with this header forced in front (-include), one std::thread per CUDA
// thread, __syncthreads a barrier of the block, __shfl_xor_sync an exchange within the warp.
// Blocks run one after the other, so __shared__ arrays become function-static arrays.
// Not a model of GPU timing or memory ordering beyond the barriers: a test of the arithmetic
// and the indexing, and a coarse test for a missing barrier.
//
// Barriers are checked: every thread of a block (a warp, for a shuffle) must arrive from its
// n-th call of the same kind (__syncthreads, the end of the block, a shuffle). A thread that
// skips a barrier or leaves the block early makes the launch fail with a message, instead of
// pairing with the wrong phase; a barrier that waits past the timeout (emulate_set_timeout) is
// reported as a deadlock. emulate_launch then returns 1 and emulate_failure() says why.
//
// Two builds (tests/test_cuda_emulated.py): "exact" (-ffp-contract=off: each operator rounds
// once, as NumPy does) and "device" (-ffp-contract=fast with FMA instructions, and with
// LINATTN_EMULATE_FTZ the workers flush subnormals: MXCSR FTZ+DAZ on x86-64, FPCR.FZ on
// AArch64), as CuPy compiles for the GPU (contraction on, -ftz=true). On the CPU the flush
// also applies to double, where CUDA's -ftz touches float only; the tests draw no double
// subnormals.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

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

// ---------------------------------------------------------------------------------------------
// Checked barriers.
struct Broken {};                                // unwinds a worker out of its kernel
static std::atomic<bool> broken{false};
static std::mutex failure_mutex;
static std::string failure;
static double timeout_s = 60.0;
struct Barrier;
static std::vector<Barrier*> all_barriers;       // the launch's block and warp barriers
static void fail(const std::string& why);

// A barrier of `count` threads; each arrival names its kind and its call number, and all
// arrivals of one phase must name the same.
struct Barrier {
    explicit Barrier(unsigned count) : count(count) {}
    std::mutex mu;
    std::condition_variable cv;
    unsigned count, arrived = 0;
    unsigned long long phase = 0;
    char kind = 0;
    long long call = 0;

    void arrive(char my_kind, long long my_call)
    {
        std::unique_lock<std::mutex> lock(mu);
        if (broken) throw Broken{};
        if (arrived == 0) {
            kind = my_kind;
            call = my_call;
        } else if (kind != my_kind || call != my_call) {
            char why[256];
            std::snprintf(why, sizeof why, "thread %u of block %u arrived at %s call %lld while "
                          "%u threads wait at %s call %lld: a thread skipped a barrier",
                          threadIdx.x, blockIdx.x, name(my_kind), my_call, arrived, name(kind),
                          call);
            lock.unlock();
            fail(why);
            throw Broken{};
        }
        if (++arrived == count) {                // the last one releases the phase
            arrived = 0;
            ++phase;
            cv.notify_all();
            return;
        }
        const unsigned long long mine = phase;
        const auto limit = std::chrono::duration<double>(timeout_s);
        if (!cv.wait_for(lock, limit, [&] { return phase != mine || broken; })) {
            char why[256];
            std::snprintf(why, sizeof why, "deadlock: %u of %u threads waited %.1f s at %s call "
                          "%lld of block %u", arrived, count, timeout_s, name(kind), call,
                          blockIdx.x);
            lock.unlock();
            fail(why);
            throw Broken{};
        }
        if (phase == mine) throw Broken{};       // woken by another barrier's failure
    }

    static const char* name(char kind)
    {
        return kind == 's' ? "__syncthreads" : kind == 'e' ? "the end of the block"
                                                           : "a warp shuffle";
    }
};

static void fail(const std::string& why)
{
    {
        std::lock_guard<std::mutex> guard(failure_mutex);
        if (!broken.exchange(true)) failure = why;
    }
    for (Barrier* b : all_barriers) {            // wake every waiter, to unwind
        std::lock_guard<std::mutex> guard(b->mu);
        b->cv.notify_all();
    }
}

static Barrier* block_barrier;
static Barrier* warp_barrier[32];
static double warp_values[32][32];
static thread_local long long sync_calls, shuffle_calls, blocks_done;

inline void __syncthreads() { block_barrier->arrive('s', sync_calls++); }

// CUDA's explicitly rounded arithmetic, never contracted into an fma: the volatile store
// rounds the operation and breaks the chain a contracting compiler would fuse.
template <typename T> inline T rounded(T x) { volatile T r = x; return r; }
inline float __fmul_rn(float a, float b) { return rounded(a * b); }
inline float __fadd_rn(float a, float b) { return rounded(a + b); }
inline float __fsub_rn(float a, float b) { return rounded(a - b); }
inline double __dmul_rn(double a, double b) { return rounded(a * b); }
inline double __dadd_rn(double a, double b) { return rounded(a + b); }
inline double __dsub_rn(double a, double b) { return rounded(a - b); }

template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    warp_values[warp][lane] = (double)v;          // float and double both fit exactly
    warp_barrier[warp]->arrive('w', shuffle_calls++);
    const T other = (T)warp_values[warp][lane ^ lane_mask];
    warp_barrier[warp]->arrive('w', shuffle_calls++);
    return other;
}

// The device's flush-to-zero, for the calling thread (the device build only).
static void flush_subnormals()
{
#if defined(LINATTN_EMULATE_FTZ) && defined(__x86_64__)
    _mm_setcsr(_mm_getcsr() | 0x8040);            // FTZ (bit 15) and DAZ (bit 6)
#elif defined(LINATTN_EMULATE_FTZ) && defined(__aarch64__)
    unsigned long long fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr | (1ull << 24)));   // FZ
#endif
}

extern "C" void emulate_set_timeout(double seconds) { timeout_s = seconds; }
extern "C" const char* emulate_failure() { return failure.c_str(); }

// Run `kernel` on a (gx, gy, gz) grid of blocks of `threads` threads (a multiple of 32), one
// std::thread per CUDA thread, the blocks one after another; 0 when every barrier paired up,
// 1 (and emulate_failure() set) when one did not. The kernel's integer-class arguments
// (pointers, int, long long) come in `ints`, in order, and its one floating-point argument, if
// any, in `real`: on the x86-64 and AArch64 Linux calling conventions a call through the
// prototype (16 integer slots, one float or double) passes exactly those, since integer and
// floating-point arguments take separate registers and the stack slots are 8 bytes.
constexpr int SLOTS = 16;

extern "C" int emulate_launch(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
                              void* kernel, const long long* ints, double real, int is_float)
{
    typedef void (*with_float)(long long, long long, long long, long long, long long, long long,
                               long long, long long, long long, long long, long long, long long,
                               long long, long long, long long, long long, float);
    typedef void (*with_double)(long long, long long, long long, long long, long long, long long,
                                long long, long long, long long, long long, long long, long long,
                                long long, long long, long long, long long, double);
    const long long* a = ints;
    broken = false;
    failure.clear();
    Barrier block(threads);
    std::vector<Barrier*> warps;
    for (unsigned w = 0; w < threads / 32; ++w) warps.push_back(new Barrier(32));
    block_barrier = &block;
    std::copy(warps.begin(), warps.end(), warp_barrier);
    all_barriers = warps;
    all_barriers.push_back(&block);
    blockDim = {threads, 1, 1};
    gridDim = {gx, gy, gz};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([=] {
            flush_subnormals();
            threadIdx = {t, 0, 0};
            blocks_done = 0;
            try {
                for (unsigned z = 0; z < gz; ++z)
                    for (unsigned y = 0; y < gy; ++y)
                        for (unsigned x = 0; x < gx; ++x) {
                            blockIdx = {x, y, z};
                            sync_calls = shuffle_calls = 0;
                            if (is_float)
                                ((with_float)kernel)(a[0], a[1], a[2], a[3], a[4], a[5], a[6],
                                                     a[7], a[8], a[9], a[10], a[11], a[12],
                                                     a[13], a[14], a[15], (float)real);
                            else
                                ((with_double)kernel)(a[0], a[1], a[2], a[3], a[4], a[5], a[6],
                                                      a[7], a[8], a[9], a[10], a[11], a[12],
                                                      a[13], a[14], a[15], real);
                            // the next block reuses the __shared__ arrays
                            block_barrier->arrive('e', blocks_done++);
                        }
            } catch (const Broken&) {
            }
        });
    for (auto& thread : pool) thread.join();
    all_barriers.clear();
    for (auto* w : warps) delete w;
    return broken ? 1 : 0;
}
