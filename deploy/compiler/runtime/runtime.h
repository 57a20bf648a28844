/* deploy's C runtime: what TVM's compiled kernels call, and the knobs a bundle's API exposes.
 *
 * A kernel object from TVM (`Module.write_to_file("k.o")`) needs, besides libc and libm:
 *   TVMFFIErrorSetRaisedFromCStrParts        an error raised by a kernel's checks
 *   __TVMBackendParallelLaunch  (a pointer)   run a parallel loop's tasks
 *   __TVMBackendParallelBarrier (a pointer)   wait for every task of a launch
 *   __TVMBackendAllocWorkspace / __TVMBackendFreeWorkspace (pointers)   a kernel's scratch
 * The object defines the pointers weak and NULL; runtime.c defines them strongly. A bundle links
 * its kernels, this runtime and its API (bundle.c) into one object whose only global symbols are
 * the API's (`objcopy --keep-global-symbols`), so two bundles in one process each keep their own
 * runtime: nothing here is visible outside the bundle.
 *
 * Threads: one pool per bundle, sized at run time (deploy_rt_set_num_threads; default one thread
 * per online CPU), started by the first parallel loop, woken by a launch, spinning briefly after
 * each before it blocks, stopped by deploy_rt_stop_threads (or when the bundle is unloaded). A
 * launch while another is running (a second application thread) or from inside a task (a nested
 * parallel loop) runs its work on the calling thread. An engine that owns its threads installs
 * a parallel hook (deploy_rt_set_parallel) and our loops run on them instead.
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

/* One task of a parallel loop: index in [0, count). Returns 0, or nonzero when it failed. */
typedef int (*deploy_rt_task)(int index, void* context);
/* An engine's parallel-for: runs task(i, context) for every i in [0, count), on any threads, in
 * any order, and returns when all are done (0, or nonzero when a task failed). */
typedef int (*deploy_rt_parallel_for)(void* user, deploy_rt_task task, void* context, int count);

/* Threads for parallel loops: n >= 1, or 0 for one per online CPU. Returns the previous setting. */
int deploy_rt_set_num_threads(int n);
/* The threads the next parallel loop runs on (the setting, 0 resolved). */
int deploy_rt_num_threads(void);
/* Run parallel loops through `fn` (NULL: the bundle's own pool); returns the previous hook. A
 * loop that started on the previous hook finishes on it: keep it callable until the calls
 * running when it was replaced have returned. */
deploy_rt_parallel_for deploy_rt_set_parallel(deploy_rt_parallel_for fn, void* user);
/* Stop the pool's threads, after the parallel loop in progress (if any) ends; the next parallel
 * loop starts them again. The number of threads stopped; -1 from inside a task (it would wait
 * for its own loop). */
int deploy_rt_stop_threads(void);

/* The message of the last error a kernel raised on this thread ("" after deploy_rt_clear_error). */
const char* deploy_rt_kernel_error(void);
void deploy_rt_clear_error(void);

/* Scratch memory of `bytes` aligned to DEPLOY_ALIGNMENT (abi.h), from this thread's cache of
 * freed blocks (so a call that needs the same arena each time allocates it once per thread);
 * NULL when out of memory. */
void* deploy_rt_scratch(size_t bytes);
void deploy_rt_release(void* block);

#ifdef __cplusplus
}
#endif

#endif /* DEPLOY_RUNTIME_H_ */
