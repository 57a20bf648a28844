/* deploy's C runtime for TVM kernels (see runtime.h): errors, scratch memory, a thread pool, one
 * per process (the DEPLOY_RT_SHARED functions: whichever bundle's definitions the linker binds). */
#define _GNU_SOURCE
#include "runtime.h"

#include "abi.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_THREADS 256
#define SPINS 20000      /* polls of a flag before a thread blocks: about 20-100 us */
#define CACHED_BLOCKS 4  /* freed scratch blocks a thread keeps for its next call */

/* ---- errors: a kernel's message, per thread ----
 * A failure's first reason is set where it happens (a kernel's check, a refused workspace, an
 * engine's hook); what raises later in the same call (a graph's plan naming the kernel that
 * failed) goes in front of it: "kernel 2 of 3 (argmax) failed: workspace allocation ... failed". */

#define ERROR_BYTES 512

static _Thread_local char kernel_error[ERROR_BYTES];

void deploy_rt1_raise(const char* kind, const char** parts, int32_t num_parts) {
  char reason[ERROR_BYTES];
  memcpy(reason, kernel_error, sizeof(reason));
  size_t used = (size_t)snprintf(kernel_error, sizeof(kernel_error), "%s: ", kind ? kind : "Error");
  for (int32_t i = 0; i < num_parts && used < sizeof(kernel_error) - 1; ++i) {
    if (parts[i] == NULL) continue;
    used += (size_t)snprintf(kernel_error + used, sizeof(kernel_error) - used, "%s", parts[i]);
  }
  kernel_error[strcspn(kernel_error, "\n")] = '\0';  /* one line: TVM adds a call trace after it */
  used = strlen(kernel_error);
  if (reason[0]) snprintf(kernel_error + used, sizeof(kernel_error) - used, ": %s", reason);
}

/* What a kernel calls to raise an error: local to each bundle (TVM's runtime, loaded beside it,
 * defines the same name), into the process's runtime. */
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t num_parts) {
  deploy_rt1_raise(kind, parts, num_parts);
}

/* The reason for a failure the runtime sees itself, on this thread. */
static void set_reason(const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(kernel_error, sizeof(kernel_error), format, args);
  va_end(args);
}

/* Keep this thread's reason for a failed task in `first` unless a task failed before. */
static void keep_first(atomic_int* failed, char* first) {
  if (atomic_exchange(failed, 1) == 0) memcpy(first, kernel_error, ERROR_BYTES);
}

/* After a launch whose task failed: its reason on the launching thread. */
static int task_failed(const char* first) {
  if (first[0]) memcpy(kernel_error, first, ERROR_BYTES);
  else set_reason("a parallel task failed");
  return -1;
}

const char* deploy_rt1_kernel_error(void) { return kernel_error; }

void deploy_rt1_clear_error(void) { kernel_error[0] = '\0'; }

/* ---- scratch: aligned blocks with their size in front, a few cached per thread ---- */

typedef struct {
  void* blocks[CACHED_BLOCKS];
  int count;
} Cache;

static _Thread_local Cache cache;
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static size_t block_size(void* block) { return *(size_t*)((char*)block - DEPLOY_ALIGNMENT); }

static void free_cache(void* unused) {
  (void)unused;
  while (cache.count > 0) free((char*)cache.blocks[--cache.count] - DEPLOY_ALIGNMENT);
}

static void make_cache_key(void) { pthread_key_create(&cache_key, free_cache); }

void* deploy_rt1_scratch(size_t bytes) {
  int best = -1;
  for (int i = 0; i < cache.count; ++i) {  /* the smallest cached block that is large enough */
    size_t size = block_size(cache.blocks[i]);
    if (size >= bytes && (best < 0 || size < block_size(cache.blocks[best]))) best = i;
  }
  if (best >= 0) {
    void* block = cache.blocks[best];
    cache.blocks[best] = cache.blocks[--cache.count];
    return block;
  }
  void* base = NULL;
  if (bytes > SIZE_MAX - DEPLOY_ALIGNMENT || posix_memalign(&base, DEPLOY_ALIGNMENT, bytes + DEPLOY_ALIGNMENT) != 0) {
    return NULL;
  }
  *(size_t*)base = bytes;
  return (char*)base + DEPLOY_ALIGNMENT;
}

void deploy_rt1_release(void* block) {
  if (block == NULL) return;
  pthread_once(&cache_once, make_cache_key);
  pthread_setspecific(cache_key, &cache);  /* frees this thread's cache when it exits */
  if (cache.count == CACHED_BLOCKS) {  /* full: drop the smallest, keep the large ones */
    int smallest = 0;
    for (int i = 1; i < cache.count; ++i) {
      if (block_size(cache.blocks[i]) < block_size(cache.blocks[smallest])) smallest = i;
    }
    if (block_size(block) <= block_size(cache.blocks[smallest])) {
      free((char*)block - DEPLOY_ALIGNMENT);
      return;
    }
    free((char*)cache.blocks[smallest] - DEPLOY_ALIGNMENT);
    cache.blocks[smallest] = cache.blocks[--cache.count];
  }
  cache.blocks[cache.count++] = block;
}

static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int code, int bits) {
  (void)device_type, (void)device_id, (void)code, (void)bits;
  void* block = nbytes > SIZE_MAX ? NULL : deploy_rt1_scratch((size_t)nbytes);
  if (block == NULL) set_reason("workspace allocation of %llu bytes failed", (unsigned long long)nbytes);
  return block;
}

static int free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  deploy_rt1_release(ptr);
  return 0;
}

/* ---- the thread pool ----
 *
 * A launch is published in one atomic word, `state`: the launch's generation and its task
 * count. Task k belongs to thread k first (the caller is thread 0, worker i thread i + 1), so
 * that from one call to the next each core works on the same part of the data, which stays in
 * its own cache (leaky_relu of 1x64x56x56 on two threads: 17 us with the tasks to whoever came
 * first, 13 with TVM's pool, which keeps each task on its thread). A thread then takes whatever
 * task is left, so a worker that the system has not yet run costs nothing: its share is done by
 * whoever is running. A task is taken by writing the launch's generation into its `owner` word,
 * which only succeeds while it holds an earlier one: a launch cannot end (and the next change
 * fn) before each of its tasks is taken, so a worker late to a launch never takes a task of the
 * next one. Generations are 48 bits: they do not wrap.
 *
 * A task at a barrier waits for the launch's other tasks, running nothing meanwhile: a task run
 * inside its wait could not return before its own next barrier, which the waiting one cannot
 * reach (two barriers a task hung). Each task gets a thread of its own: a launch has as many
 * tasks as the pool has threads, each worker is woken for it (`publish`), and a thread takes no
 * other task while one of its waits. */

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

#define GENERATION(state) ((state) >> 16)
#define TASKS(state) ((int)((state)&0xffff))

typedef struct {  /* a barrier over the tasks of one launch */
  atomic_int arrived;
  atomic_int phase;
  int count;
} Barrier;

typedef struct {
  pthread_mutex_t launching;  /* held for a whole launch: one at a time */
  pthread_mutex_t lock;       /* guards sleeping workers */
  pthread_cond_t wake;
  pthread_t threads[MAX_THREADS];
  int workers;                /* started, besides the caller */
  _Atomic uint64_t state;     /* generation << 16 | tasks */
  _Atomic uint64_t owner[MAX_THREADS]; /* per task: the generation of the launch that took it */
  atomic_int sleeping;
  atomic_int done;            /* tasks of the current launch finished */
  atomic_int failed;
  atomic_int stopping;        /* the latest generation is a stop (its state has no tasks) */
  char error[ERROR_BYTES];    /* the reason of the launch's first failed task */
  deploy_rt1_lambda fn;
  void* cdata;
  Barrier barrier;
} Pool;

static Pool pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};
static atomic_int requested_threads;  /* 0: one per online CPU */
static _Thread_local int in_task;     /* this thread runs a task: a launch from it is nested */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the pair below */
static deploy_rt1_parallel_for hook;
static void* hook_user;

/* Take task `index` for launch `generation`: whether this thread is the one to run it. */
static int take(int index, uint64_t generation) {
  uint64_t held = atomic_load_explicit(&pool.owner[index], memory_order_relaxed);
  return held < generation && atomic_compare_exchange_strong_explicit(&pool.owner[index], &held, generation,
                                                                      memory_order_acq_rel, memory_order_relaxed);
}

/* Run every task of the launch `state` names that this thread can take, its own (`first`)
 * first, then the others in turn. */
static void run_tasks(uint64_t state, int first) {
  uint64_t generation = GENERATION(state);
  int tasks = TASKS(state);
  for (int i = 0; i < tasks; ++i) {
    int index = (first + i) % tasks;
    if (!take(index, generation)) continue;
    deploy_rt1_group env = {&pool.barrier, tasks};
    int nested = in_task;
    in_task = 1;
    kernel_error[0] = '\0';
    if (pool.fn(index, &env, pool.cdata) != 0) keep_first(&pool.failed, pool.error);
    in_task = nested;
    atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
  }
}

static void* worker(void* arg) {
  int first = (int)(intptr_t)arg; /* its own task: thread `first` of the pool */
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = atomic_load_explicit(&pool.state, memory_order_acquire);
    for (int spin = 0; GENERATION(now) == seen && spin < SPINS; ++spin) {
      relax();
      now = atomic_load_explicit(&pool.state, memory_order_acquire);
    }
    if (GENERATION(now) == seen) {
      pthread_mutex_lock(&pool.lock);
      atomic_fetch_add(&pool.sleeping, 1);
      while (GENERATION(now = atomic_load(&pool.state)) == seen) pthread_cond_wait(&pool.wake, &pool.lock);
      atomic_fetch_sub(&pool.sleeping, 1);
      pthread_mutex_unlock(&pool.lock);
    }
    seen = GENERATION(now);
    if (atomic_load(&pool.stopping)) return NULL;
    run_tasks(now, first);
  }
}

/* Start launch (or stop: no tasks) number generation + 1 with `tasks` tasks, and wake the
 * workers; the launch's state. The store of the state and the load of `sleeping` are sequentially
 * consistent, as a worker's increment of `sleeping` and its load of the state before it waits:
 * either the worker sees the new state or this sees it sleeping. A release store let the load
 * pass it (x86 compiles both to plain moves), the worker slept through the launch, and a launch
 * with a barrier, or a stop's join, waited for it for ever. */
static uint64_t publish(int tasks) {
  uint64_t state = (GENERATION(atomic_load(&pool.state)) + 1) << 16 | (uint64_t)tasks;
  atomic_store(&pool.state, state);
  if (atomic_load(&pool.sleeping) > 0) {
    pthread_mutex_lock(&pool.lock);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
  }
  return state;
}

static void stop_workers(void) {
  if (pool.workers == 0) return;
  atomic_store(&pool.stopping, 1);
  publish(0);
  for (int i = 0; i < pool.workers; ++i) pthread_join(pool.threads[i], NULL);
  pool.workers = 0;
  atomic_store(&pool.stopping, 0); /* workers started later see the stop's state, and wait on */
}

/* Workers for `threads` threads in all (the caller is one); fewer if the system refuses more. */
static void size_pool(int threads) {
  if (pool.workers == threads - 1) return;
  stop_workers();
  for (int i = 1; i < threads; ++i) {
    if (pthread_create(&pool.threads[i - 1], NULL, worker, (void*)(intptr_t)i) != 0) break;
    pool.workers = i;
  }
}

__attribute__((destructor)) static void end_pool(void) {  /* dlclose or exit: no thread left in us */
  pthread_mutex_lock(&pool.launching);
  stop_workers();
  pthread_mutex_unlock(&pool.launching);
}

int deploy_rt1_set_num_threads(int n) {
  if (n < 0) n = 0;
  if (n > MAX_THREADS) n = MAX_THREADS;
  return atomic_exchange(&requested_threads, n);
}

int deploy_rt1_num_threads(void) {
  int n = atomic_load(&requested_threads);
  if (n == 0) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    n = online < 1 ? 1 : online > MAX_THREADS ? MAX_THREADS : (int)online;
  }
  return n;
}

deploy_rt1_parallel_for deploy_rt1_set_parallel(deploy_rt1_parallel_for fn, void* user) {
  pthread_mutex_lock(&hook_lock);
  deploy_rt1_parallel_for previous = hook;
  hook = fn;
  hook_user = user;
  pthread_mutex_unlock(&hook_lock);
  return previous;
}

int deploy_rt1_stop_threads(void) {
  if (in_task) return -1; /* the launch running this task holds `launching` until it returns */
  pthread_mutex_lock(&pool.launching);
  int stopped = pool.workers;
  stop_workers();
  pthread_mutex_unlock(&pool.launching);
  return stopped;
}

typedef struct {
  deploy_rt1_lambda fn;
  void* cdata;
  int count;
  atomic_int failed;
  char error[ERROR_BYTES];
} HookJob;

static int hooked_task(int index, void* context) {  /* one task on an engine's thread */
  HookJob* job = (HookJob*)context;
  deploy_rt1_group env = {NULL, job->count};  /* no barrier: its tasks need not run at once */
  int nested = in_task;
  in_task = 1;
  kernel_error[0] = '\0';
  int status = job->fn(index, &env, job->cdata);
  if (status != 0) keep_first(&job->failed, job->error);
  in_task = nested;
  return status;
}

static int run_serially(deploy_rt1_lambda fn, void* cdata) {
  deploy_rt1_group env = {NULL, 1};  /* one task: the loop's whole range */
  return fn(0, &env, cdata);
}

int deploy_rt1_parallel_launch(deploy_rt1_lambda fn, void* cdata, int num_task) {
  int threads = deploy_rt1_num_threads();
  if (num_task > 0 && num_task < threads) threads = num_task;
  if (in_task || threads == 1) return run_serially(fn, cdata);
  pthread_mutex_lock(&hook_lock); /* the pair as one: a setter may run on another thread */
  deploy_rt1_parallel_for engine = hook;
  void* user = hook_user;
  pthread_mutex_unlock(&hook_lock);
  if (engine != NULL) {
    HookJob job = {fn, cdata, threads, 0, ""};
    int status = engine(user, hooked_task, &job, threads);
    if (atomic_load(&job.failed)) return task_failed(job.error);  /* even if the hook said 0 */
    if (status != 0) set_reason("the parallel_for hook returned %d", status);
    return status == 0 ? 0 : -1;
  }
  if (pthread_mutex_trylock(&pool.launching) != 0) return run_serially(fn, cdata);
  size_pool(threads);
  threads = pool.workers + 1;
  pool.fn = fn;
  pool.cdata = cdata;
  pool.barrier.count = threads;
  atomic_store(&pool.barrier.arrived, 0);
  atomic_store(&pool.failed, 0);
  pool.error[0] = '\0';
  atomic_store(&pool.done, 0);
  run_tasks(publish(threads), 0);
  for (int spin = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < threads; ++spin) {
    if (spin < SPINS) relax();
    else sched_yield();
  }
  int failed = atomic_load(&pool.failed);
  if (failed) task_failed(pool.error);
  pthread_mutex_unlock(&pool.launching);
  return failed ? -1 : 0;
}

int deploy_rt1_parallel_barrier(int task_id, deploy_rt1_group* penv) {
  (void)task_id;
  Barrier* barrier = (Barrier*)penv->sync_handle;
  if (penv->num_task <= 1) return 0;
  if (barrier == NULL) {
    const char* parts[] = {"a kernel's parallel barrier cannot run under an engine's parallel hook"};
    deploy_rt1_raise("RuntimeError", parts, 1);
    return -1;
  }
  int phase = atomic_load(&barrier->phase);
  if (atomic_fetch_add(&barrier->arrived, 1) == barrier->count - 1) {
    atomic_store(&barrier->arrived, 0);
    atomic_fetch_add(&barrier->phase, 1);
    return 0;
  }
  for (int spin = 0; atomic_load(&barrier->phase) == phase; ++spin) {
    if (spin < SPINS) relax();
    else sched_yield();
  }
  return 0;
}

/* The strong definitions of the pointers the kernel objects define weak and NULL (local to the
 * bundle: TVM's runtime sets its modules' own): the process's runtime, whichever bundle's it is. */
void* __TVMBackendParallelLaunch = (void*)&deploy_rt1_parallel_launch;
void* __TVMBackendParallelBarrier = (void*)&deploy_rt1_parallel_barrier;
void* __TVMBackendAllocWorkspace = (void*)&alloc_workspace;
void* __TVMBackendFreeWorkspace = (void*)&free_workspace;

/* ---- float16 conversions on riscv64 ----
 * Without Zfh, LLVM calls __extendhfsf2 / __truncsfhf2 with the half NaN-boxed in a float
 * register (fa0: the upper 16 bits all ones). The weak helpers TVM puts in each kernel object
 * take it in an integer register, so every float16 result came out 0, and GCC 12's libgcc has
 * none to fall back on: these strong ones win at link time. Round to nearest even, NaN kept
 * NaN, overflow to infinity, subnormals exact. */
#if defined(__riscv)
static uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

static float bits_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

float __extendhfsf2(float boxed) {
  uint32_t half = float_bits(boxed) & 0xFFFFu;
  uint32_t sign = (half & 0x8000u) << 16, exponent = (half >> 10) & 0x1Fu, mantissa = half & 0x3FFu;
  if (exponent == 0x1Fu) return bits_float(sign | 0x7F800000u | (mantissa << 13)); /* inf, NaN */
  if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact in float */
    float magnitude = (float)mantissa * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

float __truncsfhf2(float value) {
  uint32_t bits = float_bits(value), sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7FFFFFFFu, half;
  if (magnitude > 0x7F800000u) {
    half = 0x7E00u | ((magnitude >> 13) & 0x3FFu); /* NaN, quiet */
  } else if (magnitude >= 0x477FF000u) {
    half = 0x7C00u; /* 65520 and up round to infinity */
  } else if (magnitude < 0x38800000u) { /* below 2^-14: a subnormal half (or 2^-14 rounded up) */
    volatile float scaled = bits_float(magnitude) * 0x1p24f + 0x1p23f; /* rounds to an integer, ties even */
    half = float_bits(scaled) - float_bits(0x1p23f);
  } else {
    half = (magnitude + 0xFFFu + ((magnitude >> 13) & 1u) - 0x38000000u) >> 13;
  }
  return bits_float(0xFFFF0000u | sign | half);
}
#endif
