// Memory checking of kernel code: out-of-bounds accesses, and in full mode uninitialised shared
// memory reads and shared-memory races (compute-sanitizer's memcheck, initcheck, racecheck).
//
// build.py compiles a module with -fsanitize=kernel-address in call mode: g++ then calls
// __asan_loadN_noabort(addr) / __asan_storeN_noabort(addr) before every load and store of the
// translation unit. The emulator defines those functions here (no sanitizer runtime is
// involved). Outside kernel code (tls_check == nullptr: the engine, the scheduler) they return
// at once. Inside, an access is legal when it lies inside an argument buffer of the launch
// (bounds from Python: the whole allocation a pointer points into), the thread's own stack, a
// __shared__ variable or the dynamic shared buffer, or the module's image (constants). Anything
// else fails the launch before the access happens: the thread leaves the kernel by longjmp to
// run_thread, so a bad write never reaches the heap. The message names the kernel, block,
// thread, buffer, index and the code address, which module.py turns into file:line.
//
// Full mode keeps, per byte of shared memory, the last writer and reader (thread and barrier
// interval). A read of a byte this block never wrote is an uninitialised read (reported at the
// next barrier unless a race explains it first); a write and a read or write of the same byte by
// two threads in one barrier interval is a race: a missing __syncthreads().
#pragma once
#include <dlfcn.h>
#include <link.h>
#include <setjmp.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

// The checker's own code is not instrumented (it would call itself).
#define CUDA_EMU_NOCHECK __attribute__((no_sanitize_address))

namespace cuda_emu {

struct SharedVar {
  uintptr_t lo, hi;
  std::string name;
  int kernel;  // the kernel (table index) owning it; -1: a __device__ function, legal anywhere
};
// Past the first and last __shared__ variable, this many bytes are an overrun, not other data.
static const uintptr_t SHARED_GUARD = 256;

// One byte of shared memory in full mode. Epochs count barrier intervals over the module's
// life; a block starts a new one, so stale entries of earlier blocks never match.
struct Cell {
  uint32_t w_epoch = 0, r_epoch = 0;
  uintptr_t w_pc = 0, r_pc = 0, r2_pc = 0;
  uint16_t w_tid = 0, r_tid = 0, r2_tid = 0;  // r2: a second reader (r_many)
  uint8_t r_many = 0;
};

struct Pending {  // the first read of uninitialised shared memory in this barrier interval
  bool set = false;
  unsigned tid = 0;
  uintptr_t pc = 0;
  std::string what;
};

struct Checker {
  const CheckSpec* spec = nullptr;
  int entry = -1;  // the kernel launched
  // bounds mode's fast path: this kernel's __shared__ variables and the dynamic buffer, read
  // through a plain pointer (on_access may call no instrumented code, vector's included)
  std::vector<std::pair<uintptr_t, uintptr_t>> shared_fast;
  const std::pair<uintptr_t, uintptr_t>* fast = nullptr;
  size_t nfast = 0;
  uintptr_t dyn_lo = 0, dyn_hi = 0;
  uint32_t epoch = 1, block_epoch = 1;
  std::vector<Cell> dyn_cells;
  Pending pending;
  std::mutex mu;  // full mode's shadow under the threads engine
};

// Module-wide: the __shared__ variables (from build.py's symbol table), the image, the shadow.
static std::vector<SharedVar> g_shared;
static uintptr_t g_shared_lo = 0, g_shared_hi = 0, g_image_lo = 0, g_image_hi = 0, g_base = 0;
static std::vector<Cell> g_shared_cells;
static uint32_t g_epoch = 1;

// The CUDA thread whose kernel code runs on this OS thread; nullptr in emulator code.
static thread_local Thread* tls_check = nullptr;

static int image_range(struct dl_phdr_info* info, size_t, void* data) {
  uintptr_t* r = static_cast<uintptr_t*>(data);
  if (info->dlpi_addr != r[0]) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& p = info->dlpi_phdr[i];
    if (p.p_type != PT_LOAD) continue;
    r[1] = std::min<uintptr_t>(r[1], info->dlpi_addr + p.p_vaddr);
    r[2] = std::max<uintptr_t>(r[2], info->dlpi_addr + p.p_vaddr + p.p_memsz);
  }
  return 1;
}

static void init_image() {
  if (g_base) return;
  Dl_info info;
  dladdr(reinterpret_cast<void*>(&image_range), &info);
  uintptr_t r[3] = {reinterpret_cast<uintptr_t>(info.dli_fbase), UINTPTR_MAX, 0};
  dl_iterate_phdr(&image_range, r);
  g_base = r[0];
  g_image_lo = r[1];
  g_image_hi = r[2];
}

static void set_shared(int n, const unsigned long long* offsets, const unsigned long long* sizes,
                       const char* const* names, const int* owners) {
  init_image();
  g_shared.clear();
  for (int i = 0; i < n; ++i)
    g_shared.push_back(SharedVar{g_base + offsets[i], g_base + offsets[i] + sizes[i], names[i],
                                 owners[i]});
  std::sort(g_shared.begin(), g_shared.end(),
            [](const SharedVar& x, const SharedVar& y) { return x.lo < y.lo; });
  g_shared_lo = g_shared.empty() ? 0 : g_shared.front().lo;
  g_shared_hi = g_shared.empty() ? 0 : g_shared.back().hi;
  g_shared_cells.assign(g_shared_hi - g_shared_lo, Cell());
}

static std::string thread_name(const Block* b, unsigned tid) {
  return format("thread (%u, %u, %u)", tid % b->bdim.x, (tid / b->bdim.x) % b->bdim.y,
                tid / (b->bdim.x * b->bdim.y));
}

// "{pc:0x...}": module.py replaces it with file:line (addr2line on the library).
static std::string pc_token(uintptr_t pc) { return format("{pc:0x%zx}", (size_t)(pc - g_base)); }

// Fail the launch from kernel code: record the error, then leave the kernel body.
[[noreturn]] static void check_fail(Thread* t, const std::string& msg) {
  tls_check = nullptr;
  {
    std::unique_lock<std::mutex> lock(t->block->mu);
    set_error(t->block, where(t->block, t) + ": " + msg);
  }
  longjmp(*static_cast<jmp_buf*>(t->escape), 1);
}

static const char* access_kind(bool write) { return write ? "write" : "read"; }

// An address in no legal range: name the nearest buffer, as memcheck does.
[[noreturn]] static void out_of_bounds(Thread* t, const Checker* c, uintptr_t a, size_t size,
                                       bool write, uintptr_t pc) {
  std::string what;
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < c->spec->nregions; ++i) {
    const Region& r = c->spec->regions[i];
    const uint64_t d = a < r.lo ? r.lo - a : (a >= r.hi ? a - r.hi : 0);
    if (d < best) {
      best = d;
      const long long idx = ((long long)a - (long long)r.ptr) / (long long)size;
      what = format("%s at index %lld (%lld elements of %zu bytes from the pointer to the end "
                    "of the allocation)", r.label, idx,
                    ((long long)r.hi - (long long)r.ptr) / (long long)size, size);
    }
  }
  for (const SharedVar& v : g_shared) {
    if (v.kernel != -1 && v.kernel != c->entry) continue;
    const uint64_t d = a < v.lo ? v.lo - a : (a >= v.hi ? a - v.hi : 0);
    if (d < best) {
      best = d;
      what = format("__shared__ %s at index %lld (%zu bytes)", v.name.c_str(),
                    ((long long)a - (long long)v.lo) / (long long)size, (size_t)(v.hi - v.lo));
    }
  }
  if (c->dyn_hi > c->dyn_lo && a >= c->dyn_lo && a < c->dyn_hi + 4096) {
    what = format("extern __shared__ (dynamic, %zu bytes) at byte %zu", (size_t)(c->dyn_hi -
                  c->dyn_lo), (size_t)(a - c->dyn_lo));
  }
  if (what.empty()) what = "an address in no buffer of this launch";
  check_fail(t, format("out-of-bounds %s of %zu bytes: %s, address 0x%zx, at ",
                       access_kind(write), size, what.c_str(), (size_t)a) + pc_token(pc));
}

// "__shared__ smem (in reduce_rows_block)[3] (byte 12 of 128)" for an access of `size` bytes.
static std::string shared_name(const Checker* c, uintptr_t a, size_t size) {
  if (a >= c->dyn_lo && a < c->dyn_hi)
    return format("extern __shared__ [%zu] (byte %zu of %zu)", (size_t)(a - c->dyn_lo) / size,
                  (size_t)(a - c->dyn_lo), (size_t)(c->dyn_hi - c->dyn_lo));
  for (const SharedVar& v : g_shared)
    if (a >= v.lo && a < v.hi)
      return format("__shared__ %s[%zu] (byte %zu of %zu)", v.name.c_str(),
                    (size_t)(a - v.lo) / size, (size_t)(a - v.lo), (size_t)(v.hi - v.lo));
  return "__shared__ memory";
}

// Full mode: record one byte's access; returns the race it completes ("" if none).
static std::string track_byte(Thread* t, Checker* c, Cell& cell, uintptr_t a, size_t size,
                              bool write, uintptr_t pc) {
  const Block* b = t->block;
  const unsigned me = t->linear;
  const uint32_t e = c->epoch;
  auto race = [&](const char* kind, unsigned other, uintptr_t other_pc, const char* other_did) {
    return format("shared-memory race (%s hazard) on %s: ", kind,
                  shared_name(c, a, size).c_str()) + thread_name(b, me) + " " +
           access_kind(write) + "s it at " + pc_token(pc) + " after " + thread_name(b, other) +
           " " + other_did + " it at " + pc_token(other_pc) +
           " with no __syncthreads() between (missing barrier)";
  };
  if (cell.w_epoch == e && cell.w_tid != me)
    return race(write ? "write-after-write" : "read-after-write", cell.w_tid, cell.w_pc,
                "wrote");
  if (write) {
    if (cell.r_epoch == e && cell.r_tid != me)
      return race("write-after-read", cell.r_tid, cell.r_pc, "read");
    if (cell.r_epoch == e && cell.r_many)  // I read it too, and so did r2
      return race("write-after-read", cell.r2_tid, cell.r2_pc, "read");
    cell.w_epoch = e;
    cell.w_tid = (uint16_t)me;
    cell.w_pc = pc;
    return "";
  }
  if (cell.w_epoch < c->block_epoch && !c->pending.set) {  // never written by this block
    c->pending.set = true;
    c->pending.tid = me;
    c->pending.pc = pc;
    c->pending.what = shared_name(c, a, size);
  }
  if (cell.r_epoch != e) {
    cell.r_epoch = e;
    cell.r_tid = (uint16_t)me;
    cell.r_many = 0;
    cell.r_pc = pc;
  } else if (cell.r_tid != me && !cell.r_many) {
    cell.r_many = 1;
    cell.r2_tid = (uint16_t)me;
    cell.r2_pc = pc;
  }
  return "";
}

static void track_shared(Thread* t, Checker* c, Cell* cells, uintptr_t base, uintptr_t a,
                         size_t size, bool write, uintptr_t pc) {
  std::string err;
  {
    std::unique_lock<std::mutex> lock(c->mu);  // released before check_fail leaves the kernel
    // a race or uninitialised read is reported at the access's first byte
    for (size_t i = 0; i < size && err.empty(); ++i)
      err = track_byte(t, c, cells[a - base + i], a, size, write, pc);
  }
  if (!err.empty()) check_fail(t, err);
}

// Inside a __shared__ variable (bounds), and its shadow in full mode.
static bool shared_access(Thread* t, Checker* c, uintptr_t a, size_t size, bool write,
                          uintptr_t pc, bool atomic) {
  const bool track = c->spec->level == CHECK_FULL && !atomic;  // atomics do not race
  if (a >= c->dyn_lo && a < c->dyn_hi) {
    if (a + size > c->dyn_hi) out_of_bounds(t, c, a, size, write, pc);
    if (track) track_shared(t, c, c->dyn_cells.data(), c->dyn_lo, a, size, write, pc);
    return true;
  }
  if (a + SHARED_GUARD < g_shared_lo || a >= g_shared_hi + SHARED_GUARD) return false;
  for (const SharedVar& v : g_shared) {
    // another kernel's variable is not this block's shared memory
    if (a < v.lo || a >= v.hi || (v.kernel != -1 && v.kernel != c->entry)) continue;
    if (a + size > v.hi) out_of_bounds(t, c, a, size, write, pc);
    if (track) track_shared(t, c, g_shared_cells.data(), g_shared_lo, a, size, write, pc);
    return true;
  }
  out_of_bounds(t, c, a, size, write, pc);  // padding, another kernel's, or just outside
}

static void slow_access(Thread* t, Checker* c, uintptr_t a, size_t size, bool write,
                        uintptr_t pc, bool atomic) {
  if (shared_access(t, c, a, size, write, pc, atomic)) return;
  if (a >= g_image_lo && a < g_image_hi) return;  // constants, string literals
  if (c->spec->unbounded) return;  // a bare address argument: its extent is unknown
  out_of_bounds(t, c, a, size, write, pc);
}

// Every load and store of kernel code comes here first; the common cases return at once.
// Full mode, an allocation of cupy.empty: a write initialises its bytes, a read of a byte never
// written (by a kernel or the host) fails the launch (compute-sanitizer's initcheck).
static void device_init(Thread* t, const Region& r, uintptr_t a, size_t size, bool write,
                        uintptr_t pc) {
  uint8_t* init = r.init + (a - r.lo);
  if (write) {
    std::memset(init, 1, size);
    return;
  }
  for (size_t i = 0; i < size; ++i)
    if (!init[i])
      check_fail(t, format("read of uninitialised device memory: %s at index %lld (allocated "
                           "by cupy.empty, written by no kernel and not by the host) at ",
                           r.label, ((long long)a - (long long)r.ptr) / (long long)size) +
                        pc_token(pc));
}

CUDA_EMU_NOCHECK static inline void on_access(uintptr_t a, size_t size, bool write,
                                              uintptr_t pc, bool atomic = false) {
  Thread* t = tls_check;
  if (t == nullptr) return;
  if (a >= t->stack_lo && a < t->stack_hi) return;  // locals (the cheapest test first)
  Checker* c = static_cast<Checker*>(t->block->checker);
  const CheckSpec* s = c->spec;
  for (int i = 0; i < s->nregions; ++i) {
    const Region& r = s->regions[i];
    if (a >= r.lo && a + size <= r.hi) {
      if (r.init == nullptr) return;
      tls_check = nullptr;
      device_init(t, r, a, size, write || atomic, pc);
      tls_check = t;
      return;
    }
  }
  if (s->level == CHECK_BOUNDS)
    for (size_t i = 0; i < c->nfast; ++i)
      if (a >= c->fast[i].first && a + size <= c->fast[i].second) return;
  tls_check = nullptr;  // the slow path's own accesses are the emulator's
  slow_access(t, c, a, size, write, pc, atomic);
  tls_check = t;
}

// An atomic read-modify-write (cuda_emu.h's atomics): bounds checked, never a race.
CUDA_EMU_NOCHECK static void atomic_access(const void* a, size_t size, uintptr_t pc) {
  on_access(reinterpret_cast<uintptr_t>(a), size, true, pc, true);
}

// A barrier completed (lock of the block held): report an unexplained uninitialised read, then
// start a new barrier interval.
static void check_barrier(Block* b) {
  Checker* c = static_cast<Checker*>(b->checker);
  if (c == nullptr || c->spec->level != CHECK_FULL) return;
  std::unique_lock<std::mutex> lock(c->mu);
  if (c->pending.set && !b->failed)
    set_error(b, thread_name(b, c->pending.tid) + format(" of block (%u, %u, %u)", b->bidx.x,
                                                         b->bidx.y, b->bidx.z) +
                     ": read of uninitialised " + c->pending.what +
                     " (no thread of this block wrote it) at " + pc_token(c->pending.pc));
  c->pending = Pending();
  c->epoch = ++g_epoch;
}

// The launch's legal shared ranges, for the fast path.
static void init_checker(Checker* c, const CheckSpec* spec, int entry, uintptr_t dyn,
                         size_t dyn_bytes) {
  init_image();
  c->spec = spec;
  c->entry = entry;
  c->dyn_lo = dyn;
  c->dyn_hi = dyn + dyn_bytes;
  if (spec->level == CHECK_FULL) c->dyn_cells.resize(dyn_bytes);
  for (const SharedVar& v : g_shared)
    if (v.kernel == -1 || v.kernel == entry) c->shared_fast.emplace_back(v.lo, v.hi);
  if (dyn_bytes) c->shared_fast.emplace_back(c->dyn_lo, c->dyn_hi);
  c->fast = c->shared_fast.data();
  c->nfast = c->shared_fast.size();
}

static void check_block_end(Block* b) {
  Checker* c = static_cast<Checker*>(b->checker);
  if (c->spec->level == CHECK_FULL && !b->failed) check_barrier(b);
}

static void check_block_begin(Block* b) {
  Checker* c = static_cast<Checker*>(b->checker);
  if (c == nullptr) return;
  c->epoch = c->block_epoch = ++g_epoch;
  c->pending = Pending();
}

}  // namespace cuda_emu

// The calls g++ emits under -fsanitize=kernel-address (call mode, -fsanitize-recover).
#define CUDA_EMU_ACCESS(n)                                                                   \
  extern "C" __attribute__((visibility("hidden"), no_sanitize_address)) void                \
      __asan_load##n##_noabort(uintptr_t a) {                                                \
    ::cuda_emu::on_access(a, n, false, (uintptr_t)__builtin_return_address(0));              \
  }                                                                                         \
  extern "C" __attribute__((visibility("hidden"), no_sanitize_address)) void                \
      __asan_store##n##_noabort(uintptr_t a) {                                               \
    ::cuda_emu::on_access(a, n, true, (uintptr_t)__builtin_return_address(0));               \
  }
CUDA_EMU_ACCESS(1)
CUDA_EMU_ACCESS(2)
CUDA_EMU_ACCESS(4)
CUDA_EMU_ACCESS(8)
CUDA_EMU_ACCESS(16)
extern "C" __attribute__((visibility("hidden"), no_sanitize_address)) void
__asan_loadN_noabort(uintptr_t a, size_t n) {
  if (n) ::cuda_emu::on_access(a, n, false, (uintptr_t)__builtin_return_address(0));
}
extern "C" __attribute__((visibility("hidden"), no_sanitize_address)) void
__asan_storeN_noabort(uintptr_t a, size_t n) {
  if (n) ::cuda_emu::on_access(a, n, true, (uintptr_t)__builtin_return_address(0));
}
extern "C" __attribute__((visibility("hidden"))) void __asan_handle_no_return() {}
extern "C" __attribute__((visibility("hidden"))) void __asan_before_dynamic_init(const char*) {}
extern "C" __attribute__((visibility("hidden"))) void __asan_after_dynamic_init() {}
