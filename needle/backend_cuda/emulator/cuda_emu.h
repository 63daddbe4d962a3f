// CUDA's execution model on the host CPU, so that needle's kernels/*.cu compile with g++ unchanged.
//
// Included (by build.py's generated wrapper) before a kernel source. It supplies what NVRTC
// would: the built-in variables threadIdx / blockIdx / blockDim / gridDim (per CUDA thread),
// __shared__ storage (one copy, used by one block at a time: blocks run one after another),
// __syncthreads() as a strict block barrier, warp shuffles and votes, atomics and the device
// math the kernels call. __half and __nv_bfloat16 come from NVIDIA's own cuda_fp16.h /
// cuda_bf16.h (host conversions). The engines that run the threads are in cuda_emu_engine.h.
//
// Everything here has internal linkage (static / anonymous namespace), and the library is built
// with -fvisibility=hidden -fno-gnu-unique: two emulated modules loaded into one process must
// not share the per-thread built-ins.
#pragma once
#define __CUDA_EMULATOR__ 1

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

// A static __shared__ variable is a function-local static: build.py reads each kernel's static
// shared bytes from the symbol table and the launch checks the 48 KiB limit, as a GPU does.
#define __shared__ static __attribute__((aligned(16)))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __constant__ static

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace cuda_emu {

struct Block;

// One CUDA thread: its index and where it waits (engines keep the rest).
struct Thread {
  uint3 idx;           // threadIdx
  unsigned linear;     // x + y * Dx + z * Dx * Dy
  Block* block;
  int state;           // see cuda_emu_engine.h
  int wait_kind;       // barrier or warp operation
  const char* file;    // call site of the barrier / warp op it waits at
  int line;
  void* engine_data;   // fiber or OS thread bookkeeping
  uintptr_t stack_lo, stack_hi;  // its stack: legal memory for the memory checker
  void* escape;        // jmp_buf to leave the kernel body after a memory error
};

// The current CUDA thread of this OS thread (a fiber engine switches it).
static thread_local Thread* tls_thread = nullptr;

#if defined(CUDA_EMU_MEMCHECK)
// Kernel code is instrumented (cuda_emu_check.h); these helpers read emulator state, which is
// not kernel memory, so they are not (and not inlined into kernel code).
#define CUDA_EMU_NOCHECK_FN __attribute__((no_sanitize_address, noinline))
static void atomic_access(const void* a, size_t size, uintptr_t pc);
#define CUDA_EMU_ATOMIC_CHECK(a) \
  ::cuda_emu::atomic_access(a, sizeof(*(a)), (uintptr_t)__builtin_return_address(0))
#else
#define CUDA_EMU_NOCHECK_FN inline
#define CUDA_EMU_ATOMIC_CHECK(a) ((void)0)
#endif

[[noreturn]] static void fail(const char* what, const char* file, int line);
static void syncthreads_at(const char* file, int line);
template <typename T> static T warp_op(int kind, unsigned mask, T v, int arg, int width,
                                       const char* file, int line);
static unsigned vote_op(int kind, unsigned mask, int pred, const char* file, int line);
static void* dynamic_shared();
static uint3 thread_idx();
static uint3 block_idx();
static dim3 block_dim();
static dim3 grid_dim();

enum WarpKind { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR, VOTE_BALLOT, VOTE_ANY, VOTE_ALL, VOTE_SYNC };

template <typename To, typename From> static inline To bit_cast(From f) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  To t;
  std::memcpy(&t, &f, sizeof(To));
  return t;
}

}  // namespace cuda_emu

// ------------------------------------------------------------------ built-in variables
#define threadIdx (::cuda_emu::thread_idx())
#define blockIdx (::cuda_emu::block_idx())
#define blockDim (::cuda_emu::block_dim())
#define gridDim (::cuda_emu::grid_dim())
static constexpr int warpSize = 32;

// ------------------------------------------------------------------ synchronization
#define __syncthreads() ::cuda_emu::syncthreads_at(__FILE__, __LINE__)
#define __syncwarp(...) \
  ((void)::cuda_emu::vote_op(::cuda_emu::VOTE_SYNC, ::cuda_emu::warp_mask(__VA_ARGS__), 1, \
                             __FILE__, __LINE__))
#define __shfl_sync(mask, v, ...) \
  ::cuda_emu::shfl(::cuda_emu::SHFL_IDX, mask, v, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(mask, v, ...) \
  ::cuda_emu::shfl(::cuda_emu::SHFL_UP, mask, v, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(mask, v, ...) \
  ::cuda_emu::shfl(::cuda_emu::SHFL_DOWN, mask, v, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(mask, v, ...) \
  ::cuda_emu::shfl(::cuda_emu::SHFL_XOR, mask, v, __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, p) \
  ::cuda_emu::vote_op(::cuda_emu::VOTE_BALLOT, mask, (p) != 0, __FILE__, __LINE__)
#define __any_sync(mask, p) \
  ((int)::cuda_emu::vote_op(::cuda_emu::VOTE_ANY, mask, (p) != 0, __FILE__, __LINE__))
#define __all_sync(mask, p) \
  ((int)::cuda_emu::vote_op(::cuda_emu::VOTE_ALL, mask, (p) != 0, __FILE__, __LINE__))

namespace cuda_emu {
static inline unsigned warp_mask() { return 0xffffffffu; }
static inline unsigned warp_mask(unsigned m) { return m; }
template <typename T> static inline T shfl(int kind, unsigned mask, T v, const char* file,
                                           int line, int arg, int width = 32) {
  return warp_op<T>(kind, mask, v, arg, width, file, line);
}
}  // namespace cuda_emu

static inline unsigned __activemask() { return 0xffffffffu; }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T> static inline T __ldg(const T* p) { return *p; }

// ------------------------------------------------------------------ atomics (seq_cst)
template <typename T> CUDA_EMU_NOCHECK_FN static T atomic_rmw(T* addr, T (*f)(T, T), T v) {
  T old = __atomic_load_n(addr, __ATOMIC_SEQ_CST);
  while (!__atomic_compare_exchange_n(addr, &old, f(old, v), false, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST)) {
  }
  return old;
}
template <typename T> CUDA_EMU_NOCHECK_FN static T atomicAdd(T* a, T v) {
  CUDA_EMU_ATOMIC_CHECK(a);
  if constexpr (std::is_integral<T>::value) {
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
  } else {  // floats: compare-and-swap on the bits
    typedef typename std::conditional<sizeof(T) == 8, unsigned long long, unsigned>::type U;
    U* ua = reinterpret_cast<U*>(a);
    U old = __atomic_load_n(ua, __ATOMIC_SEQ_CST);
    U want;
    do {
      want = cuda_emu::bit_cast<U>(T(cuda_emu::bit_cast<T>(old) + v));
    } while (!__atomic_compare_exchange_n(ua, &old, want, false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST));
    return cuda_emu::bit_cast<T>(old);
  }
}
template <typename T> CUDA_EMU_NOCHECK_FN static T atomicSub(T* a, T v) {
  CUDA_EMU_ATOMIC_CHECK(a);
  return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);
}
template <typename T> CUDA_EMU_NOCHECK_FN static T atomicExch(T* a, T v) {
  CUDA_EMU_ATOMIC_CHECK(a);
  return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);
}
template <typename T> CUDA_EMU_NOCHECK_FN static T atomicCAS(T* a, T cmp, T v) {
  CUDA_EMU_ATOMIC_CHECK(a);
  __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
template <typename T> CUDA_EMU_NOCHECK_FN static T atomicMax(T* a, T v) {
  CUDA_EMU_ATOMIC_CHECK(a);
  return atomic_rmw<T>(a, [](T x, T y) { return x > y ? x : y; }, v);
}
template <typename T> CUDA_EMU_NOCHECK_FN static T atomicMin(T* a, T v) {
  CUDA_EMU_ATOMIC_CHECK(a);
  return atomic_rmw<T>(a, [](T x, T y) { return x < y ? x : y; }, v);
}

// ------------------------------------------------------------------ device math
// (glibc already declares __expf, __logf, __sinf, __cosf, __powf and exp10f.)
// min / max as CUDA's overloads: mixed argument types meet in their common type.
template <typename A, typename B>
static inline typename std::common_type<A, B>::type min(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  return (C)a < (C)b ? (C)a : (C)b;
}
template <typename A, typename B>
static inline typename std::common_type<A, B>::type max(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  return (C)a > (C)b ? (C)a : (C)b;
}
static inline float __int_as_float(int x) { return cuda_emu::bit_cast<float>(x); }
static inline int __float_as_int(float x) { return cuda_emu::bit_cast<int>(x); }
static inline unsigned __float_as_uint(float x) { return cuda_emu::bit_cast<unsigned>(x); }
static inline float __uint_as_float(unsigned x) { return cuda_emu::bit_cast<float>(x); }
static inline double __longlong_as_double(long long x) { return cuda_emu::bit_cast<double>(x); }
static inline long long __double_as_longlong(double x) { return cuda_emu::bit_cast<long long>(x); }
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
static inline int __mul24(int a, int b) { return a * b; }
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}
static inline long long clock64() {
  return (long long)std::chrono::steady_clock::now().time_since_epoch().count();
}

#include "cuda_emu_engine.h"
