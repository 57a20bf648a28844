/* deploy's C runtime: what TVM's compiled kernels call, and the knobs a bundle's API exposes.
 *
 * A kernel object from TVM (`Module.write_to_file("k.o")`) needs, besides libc and libm:
 *   TVMFFIErrorSetRaisedFromCStrParts        an error raised by a kernel's checks
 *   __TVMBackendParallelLaunch  (a pointer)   run a parallel loop's tasks
 *   __TVMBackendParallelBarrier (a pointer)   wait for every task of a launch
 *   __TVMBackendAllocWorkspace / __TVMBackendFreeWorkspace (pointers)   a kernel's scratch
 * The object defines the pointers weak and NULL; runtime.c defines them strongly. A bundle links
 * its kernels, this runtime and its API (bundle.c) into one object whose global symbols are the
 * API's and the DEPLOY_RT_SHARED functions below (`objcopy --keep-global-symbols`).
 *
 * One runtime per process: the DEPLOY_RT_SHARED functions are weak and exported, so where several
 * bundles are linked into one program (their libNAME.a), or loaded where each sees the others'
 * symbols (libNAME.so linked by the program, or dlopen()ed RTLD_GLOBAL), the linker binds every
 * bundle's calls to one bundle's definitions: one pool, one thread count, one hook, one error and
 * scratch store, as Halide's runtime shares one work queue per process. Everything else here is
 * static and runs behind those functions, so the winner's state is the one used. A library
 * dlopen()ed RTLD_LOCAL keeps its own runtime. Their names carry the runtime's ABI version
 * (deploy_rt1_): a deploy whose runtime differs renames them, and its bundles keep their own.
 *
 * Threads: one pool, sized at run time (deploy_rt1_set_num_threads; default one thread per online
 * CPU), started by the first parallel loop, woken by a launch (task k on thread k first, so each
 * core keeps its part of the data cached from one call to the next), spinning briefly after each
 * before it blocks, stopped by deploy_rt1_stop_threads (or when the library is unloaded). A launch while
 * another is running (a second application thread) or from inside a task (a nested parallel
 * loop) runs its work on the calling thread. An engine that owns its threads installs a parallel
 * hook (deploy_rt1_set_parallel) and our loops run on them instead.
 *
 * Every setter may be called at any time from any thread, calls running included: a parallel
 * loop reads the settings once, when it starts, and runs on what it read.
 */
#ifndef DEPLOY_RUNTIME_H_
#define DEPLOY_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DEPLOY_RT_SHARED __attribute__((weak, visibility("default")))

/* One task of a parallel loop: index in [0, count). Returns 0, or nonzero when it failed. */
typedef int (*deploy_rt1_task)(int index, void* context);
/* An engine's parallel-for: runs task(i, context) for every i in [0, count), on any threads, in
 * any order, and returns when all are done (0, or nonzero when a task failed). */
typedef int (*deploy_rt1_parallel_for)(void* user, deploy_rt1_task task, void* context, int count);

/* Threads for parallel loops: n >= 1, or 0 for one per online CPU. Returns the previous setting. */
DEPLOY_RT_SHARED int deploy_rt1_set_num_threads(int n);
/* The threads the next parallel loop runs on (the setting, 0 resolved). */
DEPLOY_RT_SHARED int deploy_rt1_num_threads(void);
/* Run parallel loops through `fn` (NULL: the bundle's own pool); returns the previous hook. A
 * loop that started on the previous hook finishes on it: keep it callable until the calls
 * running when it was replaced have returned. */
DEPLOY_RT_SHARED deploy_rt1_parallel_for deploy_rt1_set_parallel(deploy_rt1_parallel_for fn, void* user);
/* Stop the pool's threads, after the parallel loop in progress (if any) ends; the next parallel
 * loop starts them again. The number of threads stopped; -1 from inside a task (it would wait
 * for its own loop). */
DEPLOY_RT_SHARED int deploy_rt1_stop_threads(void);

/* The message of the last error a kernel raised on this thread ("" after deploy_rt1_clear_error). */
DEPLOY_RT_SHARED const char* deploy_rt1_kernel_error(void);
DEPLOY_RT_SHARED void deploy_rt1_clear_error(void);

/* Scratch memory of `bytes` aligned to DEPLOY_ALIGNMENT (abi.h), from this thread's cache of
 * freed blocks (so a call that needs the same arena each time allocates it once per thread);
 * NULL when out of memory. */
DEPLOY_RT_SHARED void* deploy_rt1_scratch(size_t bytes);
DEPLOY_RT_SHARED void deploy_rt1_release(void* block);

/* What the kernels reach through the runtime's local entries, TVMFFIErrorSetRaisedFromCStrParts
 * and the __TVMBackend pointers (tvm/runtime/c_backend_api.h, its types under our names). */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} deploy_rt1_group; /* TVMParallelGroupEnv */
typedef int (*deploy_rt1_lambda)(int task_id, deploy_rt1_group* group, void* cdata); /* FTVMParallelLambda */
DEPLOY_RT_SHARED void deploy_rt1_raise(const char* kind, const char** parts, int32_t num_parts);
DEPLOY_RT_SHARED int deploy_rt1_parallel_launch(deploy_rt1_lambda fn, void* cdata, int num_task);
DEPLOY_RT_SHARED int deploy_rt1_parallel_barrier(int task_id, deploy_rt1_group* group);

#ifdef __cplusplus
}
#endif

#endif /* DEPLOY_RUNTIME_H_ */
