// What nanobert's CUDA kernels (nanobert/model/kernels.cu) need, on the CPU
// (tests/cuda_emulation.py): threadIdx, blockIdx, blockDim, the qualifiers, two bit casts,
// the float16 conversions, __shfl_xor_sync and __syncwarp across the 32 lanes of a warp,
// __syncthreads across a block, __shared__ memory, and the tensor cores' float16 product
// (mma.sync m16n8k16) with its fragments' layout.
//
// Every thread of a block is a fiber (ucontext) on one OS thread. A sweep runs each fiber
// that may go on until its next collective point (a shuffle, __syncwarp, __syncthreads) or
// its end; then a warp whose 32 lanes all wait at the same warp point goes on (a shuffle:
// each lane reads its partner's value), and once every thread of the block waits at the same
// __syncthreads, all go on. Anything else (lanes at different shuffles, some threads at a
// barrier and others finished or elsewhere) is a divergence CUDA would hang on or misread:
// the process aborts naming the block. Blocks run one after another.
//
// Races. Between two collective points a fiber runs alone, and the sweeps alternate their
// order (thread 0 first, then the last thread first, at each barrier), so a thread reading
// shared memory that another writes in the same interval (a missing __syncthreads: read
// before write, or write before the others' read) reads the other's old value in one of the
// two orders; __shared__ memory is filled with 0xFF bytes (a NaN in float16, float and
// double) at each block's start, so reading what no thread wrote gives NaN.
// tests/test_fused_attention.py plants both races and checks they change the result.
//
// Out of bounds. tests/cuda_emulation.py places each array a launch gets between guard pages
// (no access allowed) and registers them (emulation_guard); an access there raises SIGSEGV,
// whose handler (installed for the launch) notes the first one's address, block and thread,
// opens the page and lets the access go on, so the kernel ends and Python reports it
// (emulation_fault): a test failure that names them, not a crash of the test process. A
// fault anywhere else goes to the handler there was before (a crash, as without this).
#include <bit>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
static dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
// every __shared__ array in one section, which the scheduler poisons at each block's start
#define __shared__ static __attribute__((section("nanobert_shared")))
extern char __start_nanobert_shared[] __attribute__((weak));
extern char __stop_nanobert_shared[] __attribute__((weak));

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
constexpr int SLOT = 64;                     // bytes a lane may exchange at a warp point

enum class Wait { none, warp, block, finished };
struct Fiber {
    ucontext_t context;
    Wait wait;
    int kind;                                // a warp point's kind (shuffle, __syncwarp, ...)
    long long warp_points, barriers;         // passed so far
};

static ucontext_t scheduler;
static std::vector<Fiber> fibers;
static std::vector<char> stacks;
// a warp point's values: [warp][round % 2][lane], two rounds so that a lane that has gone
// on to the next point does not overwrite what a slower lane has still to read
static std::vector<unsigned char> slots;
static int current;
static std::function<void()> kernel;

static void run_fiber() {
    kernel();
    fibers[current].wait = Wait::finished;   // uc_link returns to the scheduler
}

static unsigned char* slot(int thread, long long point) {
    const size_t warp = thread / LANES, lane = thread % LANES;
    return &slots[((warp * 2 + point % 2) * LANES + lane) * SLOT];
}

// this fiber waits at a collective point until the scheduler lets it go on
static void wait_at(Wait wait, int kind) {
    Fiber& me = fibers[current];
    me.wait = wait;
    me.kind = kind;
    swapcontext(&me.context, &scheduler);
}

// a warp point: writes `bytes` of `in` for the others and waits until every lane of the warp
// has written -> the point's number, for lane_slot
static long long warp_point(int kind, const void* in, size_t bytes) {
    const int me = current;
    const long long point = fibers[me].warp_points;
    if (bytes) std::memcpy(slot(me, point), in, bytes);
    wait_at(Wait::warp, kind);
    fibers[me].warp_points++;
    return point;
}

// what lane `lane` of this fiber's warp wrote at warp point `point`
static const unsigned char* lane_slot(int lane, long long point) {
    return slot(current / LANES * LANES + lane, point);
}

// a warp point at which each lane reads lane `source`'s `bytes` into `out`
static void exchange(int kind, const void* in, void* out, size_t bytes, int source) {
    std::memcpy(out, lane_slot(source, warp_point(kind, in, bytes)), bytes);
}

[[noreturn]] static void diverged(const char* what) {
    std::fprintf(stderr, "cuda emulation: threads of block %u %s; where each thread waits:\n",
                 blockIdx.x, what);
    for (size_t t = 0; t < fibers.size(); t += LANES) {
        std::fprintf(stderr, "  warp %zu:", t / LANES);
        for (size_t lane = t; lane < t + LANES; lane++) {
            const Fiber& f = fibers[lane];
            const char* name[] = {"run", "warp", "barrier", "end"};
            std::fprintf(stderr, " %s%lld", name[(int)f.wait],
                         f.wait == Wait::warp ? f.warp_points : f.barriers);
        }
        std::fprintf(stderr, "\n");
    }
    std::abort();
}

// lets go the warps whose lanes all wait at the same warp point -> whether any went on
static bool release_warps() {
    bool released = false;
    for (size_t w = 0; w < fibers.size(); w += LANES) {
        const Fiber& first = fibers[w];
        if (first.wait != Wait::warp) continue;
        bool together = true;
        for (size_t lane = w; lane < w + LANES; lane++) {
            const Fiber& f = fibers[lane];
            together &= f.wait == Wait::warp && f.warp_points == first.warp_points &&
                        f.kind == first.kind;
        }
        if (!together)             // after a sweep no thread runs: these never meet
            diverged("diverge at a warp point (a shuffle or __syncwarp some lanes skip)");
        for (size_t lane = w; lane < w + LANES; lane++) fibers[lane].wait = Wait::none;
        released = true;
    }
    return released;
}

// lets the block go on when every thread waits at the same __syncthreads
static bool release_block() {
    for (const Fiber& f : fibers)
        if (f.wait != Wait::block || f.barriers != fibers[0].barriers) return false;
    for (Fiber& f : fibers) {
        f.wait = Wait::none;
        f.barriers++;
    }
    return true;
}

static void run_block() {
    const size_t threads = blockDim.x;
    fibers.assign(threads, Fiber{});
    if (stacks.size() < threads * STACK) stacks.resize(threads * STACK);
    slots.assign(threads / LANES * 2 * LANES * SLOT, 0);
    if (__start_nanobert_shared != nullptr)
        std::memset(__start_nanobert_shared, 0xFF,
                    __stop_nanobert_shared - __start_nanobert_shared);
    for (size_t t = 0; t < threads; t++) {
        Fiber& f = fibers[t];
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = &stacks[t * STACK];
        f.context.uc_stack.ss_size = STACK;
        f.context.uc_link = &scheduler;
        makecontext(&f.context, run_fiber, 0);
        f.wait = Wait::none;
    }
    bool backwards = false;
    for (;;) {
        for (size_t i = 0; i < threads; i++) {
            const int t = backwards ? (int)(threads - 1 - i) : (int)i;
            if (fibers[t].wait != Wait::none) continue;
            current = t;
            threadIdx.x = t;
            swapcontext(&scheduler, &fibers[t].context);
        }
        bool finished = true;
        for (const Fiber& f : fibers) finished &= f.wait == Wait::finished;
        if (finished) return;
        if (release_warps()) continue;
        if (release_block()) {
            backwards = !backwards;
            continue;
        }
        bool any_finished = false;
        for (const Fiber& f : fibers) any_finished |= f.wait == Wait::finished;
        diverged(any_finished ? "wait at a __syncthreads that others have left (ended)"
                              : "wait at different collective points");
    }
}
}  // namespace emulation

// every lane's v, read back from lane ^ lane_mask's (the mask is the full warp's here)
template <typename V>
static V __shfl_xor_sync(unsigned, V v, int lane_mask) {
    static_assert(sizeof(V) <= emulation::SLOT);
    V other;
    emulation::exchange(1, &v, &other, sizeof v, (emulation::current % emulation::LANES)
                                                 ^ lane_mask);
    return other;
}

// every lane's v, read back from lane `source`'s
template <typename V>
static V __shfl_sync(unsigned, V v, int source) {
    static_assert(sizeof(V) <= emulation::SLOT);
    V other;
    emulation::exchange(2, &v, &other, sizeof v, source % emulation::LANES);
    return other;
}

static inline void __syncwarp(unsigned = 0xffffffffu) { emulation::warp_point(3, nullptr, 0); }

// kernels.cu's tensor-core product, PTX's
//     mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 d, a, b, c   (here d = c, in place)
// d [16 x 8] += a [16 x 16] b [16 x 8], float16 operands, float32 accumulators, one warp. Each
// lane holds a fragment of each matrix (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
// floating point type"), with g = lane >> 2 (groupID) and t = lane % 4 (threadID_in_group),
// a register's two float16 elements low half first:
//     a: 4 registers, elements a0..a7: row g for a0, a1, a4, a5, g + 8 for the others;
//        column 2t + (i & 1) for i < 4, 2t + (i & 1) + 8 for i >= 4
//     b: 2 registers, elements b0..b3: row 2t + (i & 1) for i < 2, 2t + (i & 1) + 8 for
//        i >= 2; column g
//     c, d: 4 floats c0..c3: row g for c0, c1, g + 8 for c2, c3; column 2t + (i & 1)
// The warp's lanes meet (a warp point): each writes its fragments, then each reads all 32
// lanes' to compute its own four sums. Each sum of 16 products is taken in double (the
// products of float16 are exact there, their sum nearly so) and added to c, rounded once to
// float: the tensor cores' own order and rounding inside a product PTX does not specify.
static inline void nanobert_mma_m16n8k16(float* d, const unsigned int* a,
                                         const unsigned int* b) {
    struct Fragments {
        unsigned int a[4], b[2];
    } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
    static_assert(sizeof mine <= emulation::SLOT);
    const long long point = emulation::warp_point(4, &mine, sizeof mine);
    float A[16][16], B[16][8];
    auto element = [](unsigned int reg, int high) {
        return widen((half16)(high ? reg >> 16 : reg & 0xffffu));
    };
    for (int lane = 0; lane < emulation::LANES; lane++) {
        Fragments f;
        std::memcpy(&f, emulation::lane_slot(lane, point), sizeof f);
        const int g = lane >> 2, t = lane % 4;
        for (int i = 0; i < 8; i++) {
            const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            const int column = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][column] = element(f.a[i / 2], i % 2);
        }
        for (int i = 0; i < 4; i++)
            B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g] = element(f.b[i / 2], i % 2);
    }
    const int lane = emulation::current % emulation::LANES, g = lane >> 2, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = i < 2 ? g : g + 8, column = 2 * t + (i & 1);
        double sum = 0;
        for (int k = 0; k < 16; k++) sum += (double)A[row][k] * (double)B[k][column];
        d[i] = (float)((double)d[i] + sum);
    }
}

static inline void __syncthreads() { emulation::wait_at(emulation::Wait::block, 0); }

namespace emulation {
struct Guard {
    char* start;
    size_t bytes;
};
static std::vector<Guard> guards;
struct Fault {
    uintptr_t address;
    unsigned block;
    int thread;
    long long count;                         // accesses into guards (pages opened)
};
static Fault fault;
static struct sigaction before;

static void on_fault(int, siginfo_t* info, void*) {
    char* at = (char*)info->si_addr;
    for (const Guard& g : guards) {
        if (at < g.start || at >= g.start + g.bytes) continue;
        if (fault.count++ == 0) {
            fault.address = (uintptr_t)at;
            fault.block = blockIdx.x;
            fault.thread = current;
        }
        const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        mprotect((void*)((uintptr_t)at & ~(page - 1)), page, PROT_READ | PROT_WRITE);
        return;                              // the access runs again, on the opened page
    }
    sigaction(SIGSEGV, &before, nullptr);    // not ours: it faults again, as it would have
}

static void watch_guards(bool on) {
    if (!on) {
        sigaction(SIGSEGV, &before, nullptr);
        return;
    }
    struct sigaction mine = {};
    mine.sa_sigaction = on_fault;
    mine.sa_flags = SA_SIGINFO;
    sigemptyset(&mine.sa_mask);
    sigaction(SIGSEGV, &mine, &before);
}
}  // namespace emulation

// bytes from `start` that no kernel may touch (tests/cuda_emulation.py's guard pages)
extern "C" void emulation_guard(void* start, size_t bytes) {
    emulation::guards.push_back({(char*)start, bytes});
}

// the first access into a guard since the last call (address, block, thread) -> how many
// pages were touched (0: none); the guards are forgotten
extern "C" long long emulation_fault(unsigned long long* address, unsigned* block,
                                     int* thread) {
    const long long count = emulation::fault.count;
    *address = emulation::fault.address;
    *block = emulation::fault.block;
    *thread = emulation::fault.thread;
    emulation::fault = {};
    emulation::guards.clear();
    return count;
}

// the launch <<<grid, block>>> of a kernel call, block a whole number of warps
static void emulate_launch(unsigned grid, unsigned block, std::function<void()> call) {
    if (block == 0 || block % emulation::LANES || block > 1024) {
        std::fprintf(stderr, "cuda emulation: a block of %u threads is not 1 to 32 whole "
                             "warps\n", block);
        std::abort();
    }
    emulation::kernel = call;
    gridDim.x = grid;
    blockDim.x = block;
    emulation::watch_guards(true);
    for (unsigned b = 0; b < grid; b++) {
        blockIdx.x = b;
        emulation::run_block();
    }
    emulation::watch_guards(false);
}
