// The rules a block's threads meet at: strict __syncthreads() barriers and warp operations.
//
// A Block counts its threads' arrivals at a barrier and at a warp shuffle/vote. Barriers are
// strict: every thread of the block must reach the same call site (file:line); a thread that
// returns while others wait, or arrives after another returned, and a block whose live threads
// all wait without any group being complete (a deadlock) fail the launch with a message naming
// the kernel, the block, the thread and the lines. The engines (cuda_emu_run.h) decide how a
// waiting thread waits: a fiber switches back to its scheduler, an OS thread sleeps on a
// condition variable.
#pragma once
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>

#if defined(__SANITIZE_THREAD__)
extern "C" {
void AnnotateIgnoreReadsBegin(const char* f, int l);
void AnnotateIgnoreReadsEnd(const char* f, int l);
void AnnotateIgnoreWritesBegin(const char* f, int l);
void AnnotateIgnoreWritesEnd(const char* f, int l);
void AnnotateIgnoreSyncBegin(const char* f, int l);
void AnnotateIgnoreSyncEnd(const char* f, int l);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}
#endif

namespace cuda_emu {

// The emulator's bookkeeping is invisible to ThreadSanitizer: its block mutex would otherwise
// order every CUDA thread after every other and hide the kernel's races. The kernel sees only
// the orderings CUDA gives: __syncthreads() for the block and __syncwarp() for a warp (shuffles
// and votes exchange values but do not order memory).
// Emulator code called from a kernel (barriers, warp operations) is not kernel memory traffic:
// the memory checker (cuda_emu_check.h) is off inside it and back on the way out.
struct Unchecked {
#if defined(CUDA_EMU_MEMCHECK)
  Thread* checking;
  CUDA_EMU_NOCHECK_FN Unchecked();
  CUDA_EMU_NOCHECK_FN ~Unchecked();
#endif
};

struct Quiet : Unchecked {
#if defined(__SANITIZE_THREAD__)
  Quiet() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
  }
  ~Quiet() {
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
#endif
};
static inline void happens_before(void* key) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(key);
#else
  (void)key;
#endif
}
static inline void happens_after(void* key) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(key);
#else
  (void)key;
#endif
}

enum State { NOT_STARTED, RUNNING, WAITING, RUNNABLE, DONE };
enum WaitKind { AT_BARRIER = 1, AT_WARP = 2 };

struct KernelAbort {};  // thrown inside a CUDA thread to unwind it after the launch failed

struct WarpGroup {  // the warp operation the lanes of one warp are gathering at
  unsigned count = 0, mask = 0, gen = 0;
  int kind = 0;
  const char* file = nullptr;
  int line = 0;
  unsigned char vals[2][32][16];
};

struct Engine {
  virtual ~Engine() {}
  // Block the calling CUDA thread until its state leaves WAITING (lock held by the caller).
  virtual void wait(Thread* t, std::unique_lock<std::mutex>& lock) = 0;
  virtual void wake_all() = 0;  // after a release or a failure
};

struct Block {
  const char* kernel = "";
  uint3 bidx;
  dim3 bdim, gdim;
  unsigned n = 0;
  Thread* threads = nullptr;
  WarpGroup* warps = nullptr;
  unsigned bar_count = 0, done = 0, waiting = 0;
  const char* bar_file = nullptr;
  int bar_line = 0;
  bool failed = false;
  std::string error;
  void* checker = nullptr;  // cuda_emu_check.h's Checker of this launch (memory-checked builds)
  std::mutex mu;  // the threads engine's lock; uncontended under fibers
  Engine* engine = nullptr;
  void* dyn_shared = nullptr;
};

static const char* const WARP_OP_NAMES[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                            "__shfl_xor_sync", "__ballot_sync", "__any_sync",
                                            "__all_sync", "__syncwarp"};

static std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

static std::string where(const Block* b, const Thread* t) {
  return format("block (%u, %u, %u) thread (%u, %u, %u)", b->bidx.x, b->bidx.y, b->bidx.z,
                t->idx.x, t->idx.y, t->idx.z);
}

// Record the first error of the launch and wake every waiting thread (they unwind).
static void set_error(Block* b, const std::string& msg) {
  if (!b->failed) {
    b->failed = true;
    b->error = format("kernel '%s': ", b->kernel) + msg;
  }
  b->engine->wake_all();
}

[[noreturn]] static void abort_thread(Block* b, const std::string& msg) {
  set_error(b, msg);
  throw KernelAbort();
}

[[noreturn]] static void fail(const char* what, const char* file, int line) {
  Quiet quiet;
  Thread* t = tls_thread;
  std::unique_lock<std::mutex> lock(t->block->mu);
  abort_thread(t->block, where(t->block, t) + ": " + what + format(" at %s:%d", file, line));
}

static std::string waits_summary(const Block* b) {
  std::string s;
  if (b->bar_count)
    s += format("%u thread(s) at __syncthreads() %s:%d", b->bar_count, b->bar_file, b->bar_line);
  for (unsigned w = 0; w < (b->n + 31) / 32; ++w) {
    const WarpGroup& g = b->warps[w];
    if (g.count)
      s += format("%swarp %u: %u lane(s) at %s %s:%d (mask 0x%08x)", s.empty() ? "" : "; ", w,
                  g.count, WARP_OP_NAMES[g.kind], g.file, g.line, g.mask);
  }
  return s;
}

// Every live thread waits and no group can complete: nothing will ever release them.
static void check_deadlock(Block* b, Thread* t) {
  if (b->waiting > 0 && b->waiting == b->n - b->done)
    abort_thread(b, "deadlock: every live thread waits and none can proceed (" +
                        waits_summary(b) + "); last to arrive: " + where(b, t));
}

static void wait_here(Block* b, Thread* t, int kind, const char* file, int line,
                      std::unique_lock<std::mutex>& lock) {
  t->state = WAITING;
  t->file = file;
  t->line = line;
  t->wait_kind = kind;
  ++b->waiting;
  check_deadlock(b, t);
  b->engine->wait(t, lock);
  if (b->failed) throw KernelAbort();
}

static void release(Block* b, int kind, unsigned first, unsigned last) {
  for (unsigned i = first; i < last; ++i) {
    Thread& u = b->threads[i];
    if (u.state == WAITING && u.wait_kind == kind) {
      u.state = RUNNABLE;
      --b->waiting;
    }
  }
  b->engine->wake_all();
}

static void barrier_arrive(const char* file, int line);
static void check_barrier(Block* b);

static void syncthreads_at(const char* file, int line) {
  Unchecked unchecked;  // not Quiet: TSan must see the happens-before edges below
  Block* b = tls_thread->block;
  happens_before(&b->bar_count);  // everything before the barrier ...
  barrier_arrive(file, line);
  happens_after(&b->bar_count);   // ... is seen by everything after it, in every thread
}

static void barrier_arrive(const char* file, int line) {
  Quiet quiet;
  Thread* t = tls_thread;
  Block* b = t->block;
  std::unique_lock<std::mutex> lock(b->mu);
  if (b->failed) throw KernelAbort();
  if (b->done > 0)
    abort_thread(b, where(b, t) + format(" reached __syncthreads() at %s:%d after %u thread(s) "
                                         "of its block returned (divergent barrier)",
                                         file, line, b->done));
  if (b->bar_count == 0) {
    b->bar_file = file;
    b->bar_line = line;
  } else if (line != b->bar_line || std::strcmp(file, b->bar_file) != 0) {
    abort_thread(b, where(b, t) + format(" reached __syncthreads() at %s:%d while %u thread(s) "
                                         "wait at __syncthreads() at %s:%d (divergent barrier)",
                                         file, line, b->bar_count, b->bar_file, b->bar_line));
  }
  if (++b->bar_count == b->n) {
    b->bar_count = 0;
    check_barrier(b);
    if (b->failed) throw KernelAbort();
    release(b, AT_BARRIER, 0, b->n);
    return;
  }
  wait_here(b, t, AT_BARRIER, file, line, lock);
}

// Lanes of the warp that exist (the last warp of a block may be partial).
static unsigned warp_lanes(const Block* b, unsigned w) {
  const unsigned left = b->n - w * 32;
  return left >= 32 ? 0xffffffffu : ((1u << left) - 1u);
}

// Arrive at a warp operation; returns the generation whose slots hold every lane's value.
static unsigned warp_arrive(int kind, unsigned mask, const void* v, size_t size,
                            const char* file, int line) {
  Quiet quiet;
  Thread* t = tls_thread;
  Block* b = t->block;
  std::unique_lock<std::mutex> lock(b->mu);
  if (b->failed) throw KernelAbort();
  const unsigned lane = t->linear & 31, w = t->linear >> 5;
  const char* op = WARP_OP_NAMES[kind];
  WarpGroup& g = b->warps[w];
  if (!((mask >> lane) & 1u))
    abort_thread(b, where(b, t) + format(" (lane %u) calls %s at %s:%d with mask 0x%08x that "
                                         "does not include it", lane, op, file, line, mask));
  if (mask & ~warp_lanes(b, w))
    abort_thread(b, where(b, t) + format(": %s at %s:%d names lanes missing from warp %u "
                                         "(mask 0x%08x, block of %u threads)",
                                         op, file, line, w, mask, b->n));
  for (unsigned l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && b->threads[w * 32 + l].state == DONE)
      abort_thread(b, where(b, t) + format(": %s at %s:%d waits for lane %u, which returned",
                                           op, file, line, l));
  if (g.count == 0) {
    g.mask = mask;
    g.kind = kind;
    g.file = file;
    g.line = line;
  } else if (g.mask != mask || g.kind != kind || g.line != line || std::strcmp(g.file, file)) {
    abort_thread(b, where(b, t) + format(" (lane %u) reached %s at %s:%d (mask 0x%08x) while "
                                         "lanes of its warp wait at %s at %s:%d (mask 0x%08x)",
                                         lane, op, file, line, mask, WARP_OP_NAMES[g.kind],
                                         g.file, g.line, g.mask));
  }
  const unsigned gen = g.gen;
  std::memcpy(g.vals[gen & 1][lane], v, size);
  if (++g.count == (unsigned)__builtin_popcount(mask)) {
    g.count = 0;
    ++g.gen;
    release(b, AT_WARP, w * 32, w * 32 + 32);
    return gen;
  }
  wait_here(b, t, AT_WARP, file, line, lock);
  return gen;
}

template <typename T> static T warp_op(int kind, unsigned mask, T v, int arg, int width,
                                       const char* file, int line) {
  Unchecked unchecked;
  static_assert(sizeof(T) <= 16, "warp shuffles move at most 16 bytes");
  if (width <= 0 || width > 32 || (width & (width - 1)))
    fail("shuffle width must be a power of two in [1, 32]", file, line);
  const unsigned gen = warp_arrive(kind, mask, &v, sizeof(T), file, line);
  Thread* t = tls_thread;
  const int lane = t->linear & 31, base = lane & ~(width - 1);
  int src = lane;
  if (kind == SHFL_IDX) src = base + (arg & (width - 1));
  if (kind == SHFL_UP) src = lane - arg >= base ? lane - arg : lane;
  if (kind == SHFL_DOWN) src = lane + arg < base + width ? lane + arg : lane;
  if (kind == SHFL_XOR) src = (lane ^ arg) < base + width ? (lane ^ arg) : lane;
  if (!((mask >> src) & 1u))
    fail(format("lane %d reads lane %d, which is not in the mask 0x%08x", lane, src, mask)
             .c_str(), file, line);
  T out;
  {
    Quiet quiet;
    std::memcpy(&out, t->block->warps[t->linear >> 5].vals[gen & 1][src], sizeof(T));
  }
  return out;
}

static unsigned vote_op(int kind, unsigned mask, int pred, const char* file, int line) {
  Unchecked unchecked;
  Thread* t = tls_thread;
  WarpGroup& g = t->block->warps[t->linear >> 5];
  if (kind == VOTE_SYNC) happens_before(&g);
  const unsigned gen = warp_arrive(kind, mask, &pred, sizeof pred, file, line);
  if (kind == VOTE_SYNC) happens_after(&g);
  Quiet quiet;
  unsigned ballot = 0;
  for (unsigned l = 0; l < 32; ++l) {
    int p = 0;
    if ((mask >> l) & 1u) std::memcpy(&p, g.vals[gen & 1][l], sizeof p);
    ballot |= (p ? 1u : 0u) << l;
  }
  if (kind == VOTE_ANY) return ballot != 0;
  if (kind == VOTE_ALL) return ballot == mask;
  return ballot;
}

// A CUDA thread finished its kernel body.
static void thread_exit(Thread* t) {
  Quiet quiet;
  Block* b = t->block;
  std::unique_lock<std::mutex> lock(b->mu);
  t->state = DONE;
  ++b->done;
  if (b->failed) return;
  const unsigned lane = t->linear & 31;
  const WarpGroup& g = b->warps[t->linear >> 5];
  if (b->bar_count > 0) {
    set_error(b, where(b, t) + format(" returned while %u thread(s) wait at __syncthreads() at "
                                      "%s:%d (divergent barrier)", b->bar_count, b->bar_file,
                                      b->bar_line));
  } else if (g.count > 0 && ((g.mask >> lane) & 1u)) {
    set_error(b, where(b, t) + format(" (lane %u) returned while lanes of its warp wait for it "
                                      "at %s at %s:%d", lane, WARP_OP_NAMES[g.kind], g.file,
                                      g.line));
  } else if (b->waiting > 0 && b->waiting == b->n - b->done) {
    set_error(b, "deadlock: every live thread waits and none can proceed (" + waits_summary(b) +
                     ")");
  }
}

CUDA_EMU_NOCHECK_FN static uint3 thread_idx() { return tls_thread->idx; }
CUDA_EMU_NOCHECK_FN static uint3 block_idx() { return tls_thread->block->bidx; }
CUDA_EMU_NOCHECK_FN static dim3 block_dim() { return tls_thread->block->bdim; }
CUDA_EMU_NOCHECK_FN static dim3 grid_dim() { return tls_thread->block->gdim; }
CUDA_EMU_NOCHECK_FN static void* dynamic_shared() { return tls_thread->block->dyn_shared; }

// What Python asks of a launch: memory checking and block order.
enum CheckLevel { CHECK_OFF = 0, CHECK_BOUNDS = 1, CHECK_FULL = 2 };

// One pointer argument's allocation (module.py's _Region). Layout shared with ctypes.
struct Region {
  uint64_t lo, hi, ptr;  // allocation [lo, hi); the pointer the kernel received
  const char* label;     // "argument 1 'out' (float32, 240 bytes)"
  uint8_t* init;         // full mode, an allocation from cupy.empty: 1 per byte written
};
struct CheckSpec {  // module.py's _CheckSpec
  int32_t level;
  int32_t nregions;
  int32_t unbounded;  // a pointer argument without known bounds (a bare int address)
  int32_t concurrent; // threads engine: up to this many CUDA threads of several blocks at once
  uint64_t seed;      // block order: 0 = in order, else a seeded shuffle
  const Region* regions;
};

}  // namespace cuda_emu

#if defined(CUDA_EMU_MEMCHECK)
#include "cuda_emu_check.h"
namespace cuda_emu {
Unchecked::Unchecked() : checking(tls_check) { tls_check = nullptr; }
Unchecked::~Unchecked() { tls_check = checking; }
}  // namespace cuda_emu
#else
namespace cuda_emu {
static void check_barrier(Block*) {}
}  // namespace cuda_emu
#endif

#include "cuda_emu_run.h"
