/* The API of a bundle (NAME.h, generated): plain C over the kernels TVM compiled, linked with
 * deploy's runtime (runtime.c) into one object whose only global symbols are these functions.
 *
 * Every tensor is checked against what the bundle was built for (bundle_config.h): dtype, rank,
 * shape (a symbolic dim read from the tensors, the same in all, at least 1), CPU memory, C order,
 * data aligned as the kernels assume (DEPLOY_TENSOR_ALIGNMENT: DEPLOY_ALIGNMENT, or what
 * --alignment said). A bad tensor or a failing kernel returns an error code (abi.h) with a
 * one-line message in NAME_last_error(), never a crash. A graph's kernels run on an arena, the
 * caller's (NAME_with_workspace) or one the call takes from the thread's scratch cache.
 */
#include <inttypes.h>

#include "bundle.h"
#include "runtime.h"
#include DEPLOY_HEADER

#include "bundle_names.h"

#include "bundle_check.h"

/* tvm-ffi's packed calling convention (tvm/ffi/c_api.h): 16-byte values, tensors by pointer. */
typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    void* v_ptr;
  };
} TVMFFIAny;
enum { kTVMFFIDLTensorPtr = 7 };

/* The plan's (or the op's) entry, from the kernel object: main(inputs..., outputs...[, arena]). */
int __tvm_ffi_main(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

/* Call the kernels on checked tensors; with DEPLOY_HAS_ARENA, on `arena` of `bytes` bytes. */
static int call(DLTensor* folded, void* arena, uint64_t bytes) {
  TVMFFIAny packed[DEPLOY_NUM_TENSORS + 1];
  int64_t arena_shape[1] = {(int64_t)bytes};
  DLTensor arena_tensor = {arena, {kDLCPU, 0}, 1, {kDLUInt, 8, 1}, arena_shape, NULL, 0};
  int count = 0;
  for (; count < DEPLOY_NUM_TENSORS; ++count) {
    packed[count].type_index = kTVMFFIDLTensorPtr;
    packed[count].zero_padding = 0;
    packed[count].v_ptr = &folded[count];
  }
  if (DEPLOY_HAS_ARENA) {
    packed[count].type_index = kTVMFFIDLTensorPtr;
    packed[count].zero_padding = 0;
    packed[count++].v_ptr = &arena_tensor;
  }
  TVMFFIAny result = {0};
  deploy_rt1_clear_error();
  if (__tvm_ffi_main(NULL, packed, count, &result) != 0) {
    const char* why = deploy_rt1_kernel_error();
    return fail(DEPLOY_ERR_KERNEL, "%s", why[0] ? why : "a kernel failed");
  }
  return DEPLOY_OK;
}

static int run(const DLTensor* const* args, void* workspace, size_t workspace_bytes, int caller_arena) {
  DLTensor folded[DEPLOY_NUM_TENSORS];
  int64_t symbols[DEPLOY_NUM_SYMBOLS + 1] = {0};
  last_error[0] = '\0';
  int status = check_all(args, folded, symbols);
  if (status != DEPLOY_OK) return status;
  if (!DEPLOY_HAS_ARENA) return call(folded, NULL, 0);
  uint64_t bytes = deploy_arena_bytes(symbols);
  if (bytes == 0 || bytes > SIZE_MAX) return fail(DEPLOY_ERR_ARGUMENT, "the arena for these shapes overflows");
  if (caller_arena) {
    if (workspace == NULL) return fail(DEPLOY_ERR_ARGUMENT, "workspace is NULL: expected %" PRIu64 " bytes", bytes);
    if (workspace_bytes < bytes) {
      return fail(DEPLOY_ERR_ARGUMENT, "workspace has %zu bytes, this call needs %" PRIu64 " (%s_workspace_size)",
                  workspace_bytes, bytes, DEPLOY_STRING(DEPLOY_PREFIX));
    }
    if ((uintptr_t)workspace % DEPLOY_ALIGNMENT != 0) {
      return fail(DEPLOY_ERR_ARGUMENT, "workspace is not %d-byte aligned", DEPLOY_ALIGNMENT);
    }
    return call(folded, workspace, bytes);
  }
  void* arena = deploy_rt1_scratch((size_t)bytes);
  if (arena == NULL) return fail(DEPLOY_ERR_MEMORY, "out of memory for an arena of %" PRIu64 " bytes", bytes);
  status = call(folded, arena, bytes);
  deploy_rt1_release(arena);
  return status;
}

DEPLOY_EXPORT int DEPLOY_PREFIX(DEPLOY_PARAMS) {
  const DLTensor* args[] = {DEPLOY_ARGS};
  return run(args, NULL, 0, 0);
}

DEPLOY_EXPORT int DEPLOY_API(_with_workspace)(DEPLOY_PARAMS, void* workspace, size_t workspace_bytes) {
  const DLTensor* args[] = {DEPLOY_ARGS};
  return run(args, workspace, workspace_bytes, 1);
}

DEPLOY_EXPORT int DEPLOY_API(_run)(DLTensor* const* args, int num_args) {
  int checked = check_run_args(args, num_args);
  if (checked != DEPLOY_OK) return checked;
  return run((const DLTensor* const*)args, NULL, 0, 0);
}

DEPLOY_EXPORT size_t DEPLOY_API(_workspace_size)(DEPLOY_SYMBOL_PARAMS) {
  int64_t symbols[DEPLOY_NUM_SYMBOLS + 1] = {DEPLOY_SYMBOL_ARGS};
  for (int i = 0; i < DEPLOY_NUM_SYMBOLS; ++i) {
    if (symbols[i] < 1 || symbols[i] > INT32_MAX) return 0;
  }
  uint64_t bytes = DEPLOY_HAS_ARENA ? deploy_arena_bytes(symbols) : 0;
  return bytes > SIZE_MAX ? 0 : (size_t)bytes;
}

DEPLOY_EXPORT const char* DEPLOY_API(_last_error)(void) { return last_error; }

DEPLOY_EXPORT int DEPLOY_API(_set_num_threads)(int n) { return deploy_rt1_set_num_threads(n); }

DEPLOY_EXPORT int DEPLOY_API(_num_threads)(void) { return deploy_rt1_num_threads(); }

DEPLOY_EXPORT int DEPLOY_API(_stop_threads)(void) { return deploy_rt1_stop_threads(); }

DEPLOY_EXPORT DEPLOY_API(_parallel_for) DEPLOY_API(_set_parallel_for)(DEPLOY_API(_parallel_for) fn, void* user) {
  return (DEPLOY_API(_parallel_for))deploy_rt1_set_parallel((deploy_rt1_parallel_for)fn, user);
}
