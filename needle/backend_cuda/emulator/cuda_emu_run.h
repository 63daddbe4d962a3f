// The two engines that run a block's CUDA threads, and the launch loop over the grid.
//
// FiberEngine (default): every CUDA thread of a block is a cooperative fiber (ucontext) on the
//   calling OS thread. A fiber runs until it finishes or waits at a barrier / warp operation;
//   the scheduler then runs the next one. Stacks are pooled and reused, so a kernel without
//   barriers touches one hot stack. Deterministic, and fast enough for the test suite.
// ThreadEngine: one OS thread per CUDA thread, meeting under a mutex and condition variable.
//   Slow (~10x), but ThreadSanitizer and AddressSanitizer see every CUDA thread's accesses.
// Blocks run one after another (in a seeded order under full memory checking), which is why one
// static copy of each __shared__ variable is enough (a block's shared memory is uninitialized
// on a GPU too); the threads engine runs blocks side by side only for kernels without any.
#pragma once
#include <pthread.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <memory>
#include <vector>

namespace cuda_emu {

typedef void (*Invoker)(void* fn, void** args);

#if defined(CUDA_EMU_MEMCHECK)
static void check_enter(Thread* t) {
  const Checker* c = static_cast<const Checker*>(t->block->checker);
  if (c->spec->level != CHECK_OFF) tls_check = t;
}
static void check_leave() { tls_check = nullptr; }
#else
static void check_enter(Thread*) {}
static void check_leave() {}
#endif

struct Launch {
  Invoker invoke;
  void* fn;
  void** args;
};

// Run one CUDA thread's kernel body, then account for its exit.
CUDA_EMU_NOCHECK_FN static void run_thread(Thread* t, const Launch* l) {
  Block* b = t->block;
#if defined(CUDA_EMU_MEMCHECK)
  jmp_buf escape;  // a memory error leaves the kernel body here (cuda_emu_check.h)
  t->escape = &escape;
  if (setjmp(escape) != 0) {
    tls_check = nullptr;
    thread_exit(t);
    return;
  }
#endif
  try {
    check_enter(t);
    l->invoke(l->fn, l->args);
    check_leave();
  } catch (KernelAbort&) {
    check_leave();
  } catch (std::exception& e) {
    check_leave();
    Quiet quiet;
    std::unique_lock<std::mutex> lock(b->mu);
    set_error(b, where(b, t) + " threw " + e.what());
  } catch (...) {
    check_leave();
    Quiet quiet;
    std::unique_lock<std::mutex> lock(b->mu);
    set_error(b, where(b, t) + " threw an exception");
  }
  thread_exit(t);
}

// ------------------------------------------------------------------ fibers
static const size_t FIBER_STACK = 256 * 1024;

// mmap'd stacks with a guard page below, reused across blocks and launches.
struct StackPool {
  std::vector<char*> free_;
  char* get() {
    if (!free_.empty()) {
      char* s = free_.back();
      free_.pop_back();
      return s;
    }
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void* m = mmap(nullptr, FIBER_STACK + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    mprotect(m, page, PROT_NONE);  // a stack overflow faults instead of corrupting memory
    return static_cast<char*>(m) + page;
  }
  void put(char* s) { free_.push_back(s); }
};

static thread_local StackPool tls_stacks;
static thread_local const Launch* tls_launch = nullptr;

#if defined(__x86_64__) && !defined(CUDA_EMU_UCONTEXT)
// A context switch is a function call that saves the callee-saved registers and the FP control
// words on the current stack and returns on the other one (~10 ns; glibc's swapcontext also
// makes a sigprocmask system call, ~1 us, and a block of 1024 threads switches thousands of
// times). The symbol is local to this library.
asm(R"(
  .pushsection .text
  .p2align 4
  .type cuda_emu_switch, @function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_emu_switch, .-cuda_emu_switch
  .popsection
)");
extern "C" __attribute__((visibility("hidden"))) void cuda_emu_switch(void** save, void* to);

struct Context {
  void* sp = nullptr;
};
static thread_local Context* tls_sched_ctx = nullptr;

[[noreturn]] static void fiber_main() {
  run_thread(tls_thread, tls_launch);
  Context dead;
  cuda_emu_switch(&dead.sp, tls_sched_ctx->sp);  // never resumed
  __builtin_unreachable();
}

static void make_context(Context* c, char* stack, size_t size) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                                     // fiber_main's return address slot
  *--sp = reinterpret_cast<void*>(&fiber_main);        // where cuda_emu_switch returns to
  for (int i = 0; i < 6; ++i) *--sp = nullptr;         // rbp rbx r12 r13 r14 r15
  uint32_t* cw = reinterpret_cast<uint32_t*>(--sp);
  cw[0] = 0x1F80;                                      // MXCSR default
  cw[1] = 0x037F;                                      // x87 control word default
  c->sp = sp;
}
static void switch_context(Context* from, Context* to) { cuda_emu_switch(&from->sp, to->sp); }
#else
struct Context {
  ucontext_t uc;
};
static thread_local Context* tls_sched_ctx = nullptr;

static void fiber_main() { run_thread(tls_thread, tls_launch); }  // uc_link: the scheduler

static void make_context(Context* c, char* stack, size_t size) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = &tls_sched_ctx->uc;
  makecontext(&c->uc, fiber_main, 0);
}
static void switch_context(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
#endif

struct FiberEngine : Engine {
  Context sched;
  std::vector<Context> ctx;
  std::vector<char*> stack;

  void wait(Thread* t, std::unique_lock<std::mutex>& lock) override {
    lock.unlock();
    switch_context(&ctx[t->linear], &sched);  // back to run(); it resumes us once released
    lock.lock();
  }
  void wake_all() override {}

  bool start(Block* b, Thread* t) {
    char* s = tls_stacks.get();
    if (s == nullptr) {
      set_error(b, "out of memory for fiber stacks");
      return false;
    }
    stack[t->linear] = s;
    t->stack_lo = reinterpret_cast<uintptr_t>(s);
    t->stack_hi = t->stack_lo + FIBER_STACK;
    make_context(&ctx[t->linear], s, FIBER_STACK);
    resume(t);
    return true;
  }
  void resume(Thread* t) {
    t->state = RUNNING;
    tls_thread = t;
    switch_context(&sched, &ctx[t->linear]);
    tls_thread = nullptr;
    if (t->state == DONE) {
      tls_stacks.put(stack[t->linear]);
      stack[t->linear] = nullptr;
    }
  }

  void run(Block* b, const Launch* l) {
    ctx.resize(b->n);
    stack.assign(b->n, nullptr);
    tls_launch = l;
    tls_sched_ctx = &sched;
    for (;;) {
      bool progress = false;
      for (unsigned i = 0; i < b->n && !b->failed; ++i) {
        Thread* t = &b->threads[i];
        if (t->state == NOT_STARTED) {
          progress = start(b, t);
        } else if (t->state == RUNNABLE) {
          resume(t);
          progress = true;
        }
      }
      if (b->done == b->n) return;
      if (b->failed) break;
      if (!progress) {
        set_error(b, "no CUDA thread can run (emulator scheduling error)");
        break;
      }
    }
    for (unsigned i = 0; i < b->n; ++i) {  // unwind the suspended fibers of a failed block
      Thread* t = &b->threads[i];
      if (t->state == WAITING || t->state == RUNNABLE) resume(t);
    }
  }
};

// ------------------------------------------------------------------ OS threads
// Name the OS thread after its CUDA block and thread ("B3 T17", "B1,2,0 T5,1,0"): sanitizer
// reports and debuggers show it beside their own thread numbers. Names are cut at 15 chars.
static void name_os_thread(const Thread* t) {
  const uint3 b = t->block->bidx, i = t->idx;
  char name[64];
  if (b.y == 0 && b.z == 0 && i.y == 0 && i.z == 0)
    std::snprintf(name, sizeof name, "B%u T%u", b.x, i.x);
  else
    std::snprintf(name, sizeof name, "B%u,%u,%u T%u,%u,%u", b.x, b.y, b.z, i.x, i.y, i.z);
  name[15] = 0;
  pthread_setname_np(pthread_self(), name);
}

struct ThreadEngine : Engine {
  std::condition_variable cv;
  const Launch* launch = nullptr;

  void wait(Thread* t, std::unique_lock<std::mutex>& lock) override {
    cv.wait(lock, [&] { return t->state != WAITING || t->block->failed; });
    if (t->state == RUNNABLE) t->state = RUNNING;
  }
  void wake_all() override { cv.notify_all(); }

  struct Arg {
    ThreadEngine* self;
    Thread* t;
  };
  static void* main(void* p) {
    Arg* a = static_cast<Arg*>(p);
    tls_thread = a->t;  // its state stays NOT_STARTED until it first waits (under the lock)
    pthread_attr_t attr;
    void* lo = nullptr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstack(&attr, &lo, &size);
      pthread_attr_destroy(&attr);
    }
    a->t->stack_lo = reinterpret_cast<uintptr_t>(lo);
    a->t->stack_hi = a->t->stack_lo + size;
    name_os_thread(a->t);
    run_thread(a->t, a->self->launch);
    tls_thread = nullptr;
    return nullptr;
  }

  std::vector<pthread_t> ids;
  std::vector<Arg> args;
  unsigned started = 0;

  // Start the block's OS threads; join() waits for them (blocks may run side by side).
  void start(Block* b, const Launch* l) {
    launch = l;
    ids.resize(b->n);
    args.resize(b->n);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    for (started = 0; started < b->n; ++started) {
      args[started] = Arg{this, &b->threads[started]};
      if (pthread_create(&ids[started], &attr, &ThreadEngine::main, &args[started]) != 0) {
        std::unique_lock<std::mutex> lock(b->mu);
        set_error(b, format("could not start OS thread %u of %u (threads engine)", started,
                            b->n));
        b->n = started;  // the others never ran: count only the started ones
        break;
      }
    }
    pthread_attr_destroy(&attr);
  }
  void join() {
    for (unsigned i = 0; i < started; ++i) pthread_join(ids[i], nullptr);
  }
  void run(Block* b, const Launch* l) {
    start(b, l);
    join();
  }
};

// ------------------------------------------------------------------ launch
enum EngineKind { ENGINE_FIBER = 0, ENGINE_THREADS = 1 };

static void init_block(Block* b, const char* kernel, unsigned x, unsigned y, unsigned z,
                       const dim3& grid, const dim3& block, Thread* threads, WarpGroup* warps,
                       void* dyn) {
  b->kernel = kernel;
  b->bidx = make_uint3(x, y, z);
  b->gdim = grid;
  b->bdim = block;
  b->n = block.x * block.y * block.z;
  b->threads = threads;
  b->warps = warps;
  b->dyn_shared = dyn;
  for (unsigned i = 0; i < b->n; ++i) {
    Thread& t = threads[i];
    t.idx = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
    t.linear = i;
    t.block = b;
    t.state = NOT_STARTED;
    t.wait_kind = 0;
  }
  for (unsigned w = 0; w < (b->n + 31) / 32; ++w) {
    warps[w].count = 0;
    warps[w].gen = 0;
  }
}

// The order blocks run in: the grid's order, or a permutation seeded by spec.seed (SplitMix64
// and Fisher-Yates), so that a kernel relying on block order fails reproducibly.
static std::vector<unsigned long long> block_order(unsigned long long count,
                                                   unsigned long long seed) {
  std::vector<unsigned long long> order(count);
  for (unsigned long long i = 0; i < count; ++i) order[i] = i;
  unsigned long long s = seed;
  for (unsigned long long i = count; seed && i > 1; --i) {
    unsigned long long z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    std::swap(order[i - 1], order[(z ^ (z >> 31)) % i]);
  }
  return order;
}

// Run one block on the chosen engine.
static void run_block(Block* b, const Launch& l, FiberEngine* fibers, ThreadEngine* oss) {
#if defined(CUDA_EMU_MEMCHECK)
  check_block_begin(b);
#endif
  if (fibers) {
    b->engine = fibers;
    fibers->run(b, &l);
  } else {
    b->engine = oss;
    oss->run(b, &l);
  }
#if defined(CUDA_EMU_MEMCHECK)
  check_block_end(b);
#endif
}

// One block with its own threads, warps and OS-thread engine (blocks that run side by side).
struct BlockRun {
  Block b;
  std::vector<Thread> threads;
  std::vector<WarpGroup> warps;
  ThreadEngine engine;
};

// The threads engine with blocks side by side, spec.concurrent CUDA threads at most at once, so
// that ThreadSanitizer sees races between blocks (only for kernels without __shared__ memory,
// whose one static copy would be shared by the blocks: module.py decides).
static int run_concurrent(int entry, const char* kernel, const Launch& l, const dim3& grid,
                          const dim3& block, const std::vector<unsigned long long>& order,
                          const CheckSpec* spec, char* err, size_t errlen) {
  const unsigned n = block.x * block.y * block.z;
  const size_t per_group = std::max<size_t>(1, (size_t)spec->concurrent / n);
  for (size_t first = 0; first < order.size(); first += per_group) {
    const size_t count = std::min(per_group, order.size() - first);
    std::vector<std::unique_ptr<BlockRun>> runs;
    for (size_t j = 0; j < count; ++j) {
      const unsigned long long id = order[first + j];
      runs.emplace_back(new BlockRun);
      BlockRun& r = *runs.back();
      r.threads.resize(n);
      r.warps.resize((n + 31) / 32);
      init_block(&r.b, kernel, (unsigned)(id % grid.x), (unsigned)(id / grid.x % grid.y),
                 (unsigned)(id / grid.x / grid.y), grid, block, r.threads.data(),
                 r.warps.data(), nullptr);
      r.b.engine = &r.engine;
    }
#if defined(CUDA_EMU_MEMCHECK)
    Checker checker;
    init_checker(&checker, spec, entry, 0, 0);
    for (auto& r : runs) r->b.checker = &checker;
#endif
    for (auto& r : runs) r->engine.start(&r->b, &l);
    for (auto& r : runs) r->engine.join();
    for (auto& r : runs)
      if (r->b.failed) {
        std::snprintf(err, errlen, "%s", r->b.error.c_str());
        return 1;
      }
  }
  return 0;
}

// Run every block of the grid; returns 0, or 1 with the error message in err.
static int run_launch(int entry, const char* kernel, const Launch& l, const unsigned* g3,
                      const unsigned* b3, size_t dyn_bytes, int engine, const CheckSpec* spec,
                      char* err, size_t errlen) {
  static std::mutex module_mu;  // one launch at a time: __shared__ storage is per module
  std::lock_guard<std::mutex> guard(module_mu);
  const dim3 grid(g3[0], g3[1], g3[2]), block(b3[0], b3[1], b3[2]);
  const unsigned n = block.x * block.y * block.z;
  std::vector<Thread> threads(n);
  std::vector<WarpGroup> warps((n + 31) / 32);
  void* dyn = dyn_bytes ? std::malloc(dyn_bytes) : nullptr;  // exact size: ASan sees overruns
  std::unique_ptr<FiberEngine> fibers(engine == ENGINE_FIBER ? new FiberEngine : nullptr);
  std::unique_ptr<ThreadEngine> oss(engine == ENGINE_FIBER ? nullptr : new ThreadEngine);
#if defined(CUDA_EMU_MEMCHECK)
  Checker checker;
  init_checker(&checker, spec, entry, reinterpret_cast<uintptr_t>(dyn), dyn_bytes);
#endif
  const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
  const std::vector<unsigned long long> order = block_order(nblocks, spec->seed);
  if (oss && (unsigned long long)spec->concurrent >= 2ull * n && nblocks > 1)
    return run_concurrent(entry, kernel, l, grid, block, order, spec, err, errlen);
  int rc = 0;
  for (unsigned long long id : order) {
    Block b;
    init_block(&b, kernel, (unsigned)(id % grid.x), (unsigned)(id / grid.x % grid.y),
               (unsigned)(id / grid.x / grid.y), grid, block, threads.data(), warps.data(), dyn);
#if defined(CUDA_EMU_MEMCHECK)
    b.checker = &checker;
#endif
    run_block(&b, l, fibers.get(), oss.get());
    if (b.failed) {
      std::snprintf(err, errlen, "%s", b.error.c_str());
      rc = 1;
      break;
    }
  }
  std::free(dyn);
  return rc;
}

// ------------------------------------------------------------------ the kernel table
struct Entry {
  const char* name;
  const char* signature;  // parameter type codes, e.g. "p,p,i8,i8"
  void* fn;
  Invoker invoke;
};

template <typename T> static void type_code(std::string& s) {
  if (!s.empty()) s += ",";
  if (std::is_pointer<T>::value) s += "p";
  else if (std::is_same<T, bool>::value) s += "?";
  else if (std::is_same<T, __half>::value) s += "f2";
  else if (std::is_same<T, __nv_bfloat16>::value) s += "bf2";
  else if (std::is_floating_point<T>::value) s += format("f%zu", sizeof(T));
  else if (std::is_integral<T>::value && std::is_signed<T>::value) s += format("i%zu", sizeof(T));
  else if (std::is_integral<T>::value) s += format("u%zu", sizeof(T));
  else s += format("V%zu", sizeof(T));
}

template <typename... A> static const char* signature() {
  static const std::string s = [] {
    std::string r;
    (type_code<A>(r), ...);
    return r;
  }();
  return s.c_str();
}

template <typename... A, size_t... I>
CUDA_EMU_NOCHECK_FN static void invoke_impl(void* fn, void** args, std::index_sequence<I...>) {
  (void)args;
  reinterpret_cast<void (*)(A...)>(fn)(*static_cast<A*>(args[I])...);
}

template <typename... A> static void invoke(void* fn, void** args) {
  invoke_impl<A...>(fn, args, std::index_sequence_for<A...>{});
}

template <typename... A> static Entry entry(const char* name, void (*f)(A...)) {
  return Entry{name, signature<A...>(), reinterpret_cast<void*>(f), &invoke<A...>};
}

}  // namespace cuda_emu

#if defined(CUDA_EMU_MEMCHECK)
// Where the module's __shared__ variables are (offsets from the library's base, from build.py's
// symbol table): the checker's legal shared ranges and their names in messages.
#define CUDA_EMU_SHARED_API                                                                   \
  extern "C" __attribute__((visibility("default"))) void cuda_emu_set_shared(                 \
      int n, const unsigned long long* offsets, const unsigned long long* sizes,               \
      const char* const* names, const int* owners) {                                          \
    ::cuda_emu::set_shared(n, offsets, sizes, names, owners);                                 \
  }
#else
#define CUDA_EMU_SHARED_API
#endif

// The C API build.py's wrapper exports after its table `cuda_emu_entries`.
#define CUDA_EMU_API(entries)                                                                 \
  extern "C" __attribute__((visibility("default"))) int cuda_emu_count() {                    \
    return (int)(sizeof(entries) / sizeof(entries[0]));                                       \
  }                                                                                           \
  extern "C" __attribute__((visibility("default"))) const char* cuda_emu_name(int i) {        \
    return entries[i].name;                                                                   \
  }                                                                                           \
  extern "C" __attribute__((visibility("default"))) const char* cuda_emu_signature(int i) {   \
    return entries[i].signature;                                                              \
  }                                                                                           \
  extern "C" __attribute__((visibility("default"))) void* cuda_emu_address(int i) {           \
    return entries[i].fn;                                                                     \
  }                                                                                           \
  extern "C" __attribute__((visibility("default"))) int cuda_emu_launch(                      \
      int i, const unsigned* grid, const unsigned* block, size_t dyn_shared, void** args,      \
      int engine, const ::cuda_emu::CheckSpec* spec, char* err, size_t errlen) {              \
    const ::cuda_emu::Launch l{entries[i].invoke, entries[i].fn, args};                       \
    return ::cuda_emu::run_launch(i, entries[i].name, l, grid, block, dyn_shared, engine,     \
                                  spec, err, errlen);                                         \
  }                                                                                           \
  CUDA_EMU_SHARED_API
