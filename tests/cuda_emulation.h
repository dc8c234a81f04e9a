// What nanobert's CUDA kernels (nanobert/model/kernels.cu) need, on the CPU
// (tests/cuda_emulation.py): threadIdx, blockIdx, blockDim, the qualifiers, two bit casts,
// the float16 conversions, and __shfl_xor_sync across the 32 lanes of a warp. A warp's lanes
// are 32 fibers (ucontext) on one thread: each runs until its next shuffle, writes its value,
// and yields; when all 32 have, each reads its partner's. Blocks and their warps run one
// after another. Only what the kernels use: no __syncthreads, no shared memory (a kernel
// using them does not compile here).
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <ucontext.h>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
static dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline

static inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
static inline double __longlong_as_double(long long i) { return std::bit_cast<double>(i); }

// kernels.cu's float16 conversions are PTX; here C++'s _Float16, which rounds to nearest even
// as cvt.rn does
#define NANOBERT_CPU_EMULATION
typedef unsigned short half16;
static inline float widen(half16 h) { return (float)std::bit_cast<_Float16>(h); }
static inline void store(half16* p, float v) { *p = std::bit_cast<half16>((_Float16)v); }

namespace emulation {
constexpr int LANES = 32;
constexpr size_t STACK = 1 << 16;
static ucontext_t scheduler, lanes[LANES];
static char stacks[LANES][STACK];
static unsigned char slots[2][LANES][8];     // one value a lane, two rounds of shuffles
static int round_of[LANES];                  // each lane's shuffles so far, mod 2
static int shuffles[LANES];                  // and in all
static bool finished[LANES];
static int current;
static std::function<void()> kernel;

static void run_lane() {
    kernel();
    finished[current] = true;                // uc_link returns to the scheduler
}

static void run_warp(unsigned warp) {
    for (int lane = 0; lane < LANES; lane++) {
        getcontext(&lanes[lane]);
        lanes[lane].uc_stack.ss_sp = stacks[lane];
        lanes[lane].uc_stack.ss_size = STACK;
        lanes[lane].uc_link = &scheduler;
        makecontext(&lanes[lane], run_lane, 0);
        finished[lane] = false;
        round_of[lane] = shuffles[lane] = 0;
    }
    for (bool running = true; running;) {
        running = false;
        for (int lane = 0; lane < LANES; lane++) {
            if (finished[lane]) continue;
            current = lane;
            threadIdx.x = warp * LANES + lane;
            swapcontext(&scheduler, &lanes[lane]);
            running = true;
        }
        for (int lane = 1; lane < LANES; lane++) {
            if (finished[lane] != finished[0] || shuffles[lane] != shuffles[0]) {
                std::fprintf(stderr, "cuda emulation: lanes of warp %u diverge at a shuffle "
                                     "(block %u)\n", warp, blockIdx.x);
                std::abort();
            }
        }
    }
}
}  // namespace emulation

// every lane's v, read back from lane ^ lane_mask's (the mask is the full warp's here)
template <typename V>
static V __shfl_xor_sync(unsigned, V v, int lane_mask) {
    using namespace emulation;
    static_assert(sizeof(V) <= 8);
    const int me = current, slot = round_of[me];
    std::memcpy(slots[slot][me], &v, sizeof v);
    round_of[me] ^= 1;
    shuffles[me]++;
    swapcontext(&lanes[me], &scheduler);     // every lane writes before any reads
    V other;
    std::memcpy(&other, slots[slot][me ^ lane_mask], sizeof other);
    return other;
}

// the launch <<<grid, block>>> of a kernel call, block a whole number of warps
static void emulate_launch(unsigned grid, unsigned block, std::function<void()> call) {
    if (block == 0 || block % emulation::LANES) {
        std::fprintf(stderr, "cuda emulation: a block of %u threads is not whole warps\n",
                     block);
        std::abort();
    }
    emulation::kernel = call;
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < grid; b++) {
        blockIdx.x = b;
        for (unsigned warp = 0; warp < block / emulation::LANES; warp++)
            emulation::run_warp(warp);
    }
}
