/* The API of a bundle (NAME.h, generated): plain C over the kernels TVM compiled, linked with
 * deploy's runtime (runtime.c) into one object whose only global symbols are these functions.
 *
 * Every tensor is checked against what the bundle was built for (bundle_config.h): dtype, rank,
 * shape (a symbolic dim read from the tensors, the same in all, at least 1), CPU memory, C order,
 * data aligned as the kernels assume (DEPLOY_TENSOR_ALIGNMENT: 64, or what --alignment said). A
 * bad tensor or a failing kernel returns an error code with a one-line message in
 * NAME_last_error(), never a crash. A graph's kernels run on an arena, the
 * caller's (NAME_with_workspace) or one the call takes from the thread's scratch cache.
 */
#include "bundle.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime.h"
#include DEPLOY_HEADER

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define API(suffix) CAT(DEPLOY_PREFIX, suffix)
#define STRING_(x) #x
#define STRING(x) STRING_(x)
#define EXPORT __attribute__((visibility("default"))) /* the rest is hidden (-fvisibility=hidden) */

enum { OK = 0, BAD_ARGUMENT = -1, KERNEL_FAILED = -2, NO_MEMORY = -3 };

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

static _Thread_local char last_error[512];

static int fail(int code, const char* format, ...) {
  int used = snprintf(last_error, sizeof(last_error), "%s: ", STRING(DEPLOY_PREFIX));
  va_list args;
  va_start(args, format);
  vsnprintf(last_error + used, sizeof(last_error) - (size_t)used, format, args);
  va_end(args);
  return code;
}

static void dtype_text(DLDataType dtype, char* text, size_t size) {
  const char* kind = dtype.code == kDLFloat ? "float" : dtype.code == kDLInt ? "int"
                     : dtype.code == kDLUInt ? "uint" : dtype.code == kDLBool ? "bool" : "code";
  if (dtype.lanes == 1) snprintf(text, size, "%s%u", kind, (unsigned)dtype.bits);
  else snprintf(text, size, "%s%ux%u", kind, (unsigned)dtype.bits, (unsigned)dtype.lanes);
}

/* "[2, 64, 56, 56]", a symbolic dim by its name where `spec` says one. */
static void shape_text(const int64_t* shape, int ndim, int symbolic, char* text, size_t size) {
  size_t used = (size_t)snprintf(text, size, "[");
  for (int i = 0; i < ndim && used < size; ++i) {
    const char* comma = i ? ", " : "";
    if (symbolic && shape[i] < 0) {
      used += (size_t)snprintf(text + used, size - used, "%s%s", comma, deploy_symbol_names[-shape[i] - 1]);
    } else {
      used += (size_t)snprintf(text + used, size - used, "%s%" PRId64, comma, shape[i]);
    }
  }
  if (used < size) snprintf(text + used, size - used, "]");
}

/* Check `given` against `spec`, binding the symbolic dims in `symbols` (0: not yet seen, with the
 * tensor that gave each in `giver`); `*folded` is the tensor as the kernels take it: byte_offset
 * folded into data, no strides (C order checked; a size-1 dim may have any stride). */
static int check_tensor(const DLTensor* given, const DeployTensorSpec* spec, int64_t* symbols,
                        const char** giver, DLTensor* folded) {
  char want[256], got[256];
  const char* name = spec->name;
  if (given == NULL) return fail(BAD_ARGUMENT, "%s is NULL", name);
  if (given->data == NULL) return fail(BAD_ARGUMENT, "%s.data is NULL", name);
  if (given->device.device_type != kDLCPU || given->device.device_id != 0) {
    return fail(BAD_ARGUMENT, "%s is on device (type %d, id %d): this bundle runs on the CPU (kDLCPU, id 0)",
                name, (int)given->device.device_type, (int)given->device.device_id);
  }
  if (given->dtype.code != spec->dtype.code || given->dtype.bits != spec->dtype.bits ||
      given->dtype.lanes != spec->dtype.lanes) {
    dtype_text(given->dtype, got, sizeof(got));
    dtype_text(spec->dtype, want, sizeof(want));
    return fail(BAD_ARGUMENT, "%s is %s, expected %s", name, got, want);
  }
  /* The texts of the messages below, made only for a message: a call that passes costs no printf. */
#define WANT (shape_text(spec->shape, spec->ndim, 1, want, sizeof(want)), want)
#define GOT (shape_text(given->shape, spec->ndim, 0, got, sizeof(got)), got)
  if (given->ndim != spec->ndim) {  /* its shape is not read: ndim may be anything */
    return fail(BAD_ARGUMENT, "%s has %d dim%s, expected %s", name, (int)given->ndim,
                given->ndim == 1 ? "" : "s", WANT);
  }
  if (spec->ndim > 0 && given->shape == NULL) return fail(BAD_ARGUMENT, "%s.shape is NULL, expected %s", name, WANT);
  for (int i = 0; i < spec->ndim; ++i) {
    int64_t dim = spec->shape[i], size = given->shape[i];
    if (dim >= 0) {
      if (size != dim) return fail(BAD_ARGUMENT, "%s has shape %s, expected %s", name, GOT, WANT);
      continue;
    }
    int symbol = (int)(-dim - 1);
    const char* symbol_name = deploy_symbol_names[symbol];
    if (size < 1 || size > INT32_MAX) {
      return fail(BAD_ARGUMENT, "%s has shape %s: %s = %" PRId64 ", expected 1 <= %s <= %d", name, GOT,
                  symbol_name, size, symbol_name, INT32_MAX);
    }
    if (symbols[symbol] == 0) {
      symbols[symbol] = size;
      giver[symbol] = name;
    } else if (symbols[symbol] != size) {
      return fail(BAD_ARGUMENT, "%s has %s = %" PRId64 " (shape %s), but %s has %s = %" PRId64, name,
                  symbol_name, size, GOT, giver[symbol], symbol_name, symbols[symbol]);
    }
  }
  uint64_t elements = 1;
  for (int i = 0; i < spec->ndim; ++i) {
    if (__builtin_mul_overflow(elements, (uint64_t)given->shape[i], &elements) || elements > INT64_MAX / 8) {
      return fail(BAD_ARGUMENT, "%s has shape %s: more elements than memory holds", name, GOT);
    }
  }
#undef WANT
#undef GOT
  if (given->strides != NULL) {
    int64_t expected = 1;
    for (int i = spec->ndim - 1; i >= 0; --i) {
      if (given->shape[i] != 1 && given->strides[i] != expected) {
        return fail(BAD_ARGUMENT, "%s is not compact (C order)", name);
      }
      expected *= given->shape[i];
    }
  }
  *folded = *given;
  folded->data = (char*)given->data + given->byte_offset;
  folded->byte_offset = 0;
  folded->strides = NULL;
  if ((uintptr_t)folded->data % DEPLOY_TENSOR_ALIGNMENT != 0) {
    return fail(BAD_ARGUMENT, "%s.data + byte_offset is not %d-byte aligned", name, DEPLOY_TENSOR_ALIGNMENT);
  }
  return OK;
}

/* Check every tensor, find the symbolic dims; `*folded` as the kernels take them. */
static int check_all(const DLTensor* const* args, DLTensor* folded, int64_t* symbols) {
  const char* giver[DEPLOY_NUM_SYMBOLS + 1] = {NULL};
  for (int i = 0; i < DEPLOY_NUM_TENSORS; ++i) {
    int status = check_tensor(args[i], &deploy_tensors[i], symbols, giver, &folded[i]);
    if (status != OK) return status;
  }
  return OK;
}

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
  deploy_rt_clear_error();
  if (__tvm_ffi_main(NULL, packed, count, &result) != 0) {
    const char* why = deploy_rt_kernel_error();
    return fail(KERNEL_FAILED, "%s", why[0] ? why : "a kernel failed");
  }
  return OK;
}

static int run(const DLTensor* const* args, void* workspace, size_t workspace_bytes, int caller_arena) {
  DLTensor folded[DEPLOY_NUM_TENSORS];
  int64_t symbols[DEPLOY_NUM_SYMBOLS + 1] = {0};
  last_error[0] = '\0';
  int status = check_all(args, folded, symbols);
  if (status != OK) return status;
  if (!DEPLOY_HAS_ARENA) return call(folded, NULL, 0);
  uint64_t bytes = deploy_arena_bytes(symbols);
  if (bytes == 0 || bytes > SIZE_MAX) return fail(BAD_ARGUMENT, "the arena for these shapes overflows");
  if (caller_arena) {
    if (workspace == NULL) return fail(BAD_ARGUMENT, "workspace is NULL: expected %" PRIu64 " bytes", bytes);
    if (workspace_bytes < bytes) {
      return fail(BAD_ARGUMENT, "workspace has %zu bytes, this call needs %" PRIu64 " (%s_workspace_size)",
                  workspace_bytes, bytes, STRING(DEPLOY_PREFIX));
    }
    if ((uintptr_t)workspace % DEPLOY_ALIGNMENT != 0) {
      return fail(BAD_ARGUMENT, "workspace is not %d-byte aligned", DEPLOY_ALIGNMENT);
    }
    return call(folded, workspace, bytes);
  }
  void* arena = deploy_rt_scratch((size_t)bytes);
  if (arena == NULL) return fail(NO_MEMORY, "out of memory for an arena of %" PRIu64 " bytes", bytes);
  status = call(folded, arena, bytes);
  deploy_rt_release(arena);
  return status;
}

EXPORT int DEPLOY_PREFIX(DEPLOY_PARAMS) {
  const DLTensor* args[] = {DEPLOY_ARGS};
  return run(args, NULL, 0, 0);
}

EXPORT int API(_with_workspace)(DEPLOY_PARAMS, void* workspace, size_t workspace_bytes) {
  const DLTensor* args[] = {DEPLOY_ARGS};
  return run(args, workspace, workspace_bytes, 1);
}

EXPORT int API(_run)(DLTensor* const* args, int num_args) {
  last_error[0] = '\0';
  if (args == NULL) return fail(BAD_ARGUMENT, "args is NULL: expected an array of the inputs and the outputs");
  if (num_args != DEPLOY_NUM_TENSORS) {
    return fail(BAD_ARGUMENT, "expected %d inputs and %d output%s (%d tensors), got %d", DEPLOY_NUM_INPUTS,
                DEPLOY_NUM_OUTPUTS, DEPLOY_NUM_OUTPUTS == 1 ? "" : "s", DEPLOY_NUM_TENSORS, num_args);
  }
  return run((const DLTensor* const*)args, NULL, 0, 0);
}

EXPORT size_t API(_workspace_size)(DEPLOY_SYMBOL_PARAMS) {
  int64_t symbols[DEPLOY_NUM_SYMBOLS + 1] = {DEPLOY_SYMBOL_ARGS};
  for (int i = 0; i < DEPLOY_NUM_SYMBOLS; ++i) {
    if (symbols[i] < 1 || symbols[i] > INT32_MAX) return 0;
  }
  uint64_t bytes = DEPLOY_HAS_ARENA ? deploy_arena_bytes(symbols) : 0;
  return bytes > SIZE_MAX ? 0 : (size_t)bytes;
}

EXPORT const char* API(_last_error)(void) { return last_error; }

EXPORT int API(_set_num_threads)(int n) { return deploy_rt_set_num_threads(n); }

EXPORT int API(_num_threads)(void) { return deploy_rt_num_threads(); }

EXPORT API(_parallel_for) API(_set_parallel_for)(API(_parallel_for) fn, void* user) {
  return (API(_parallel_for))deploy_rt_set_parallel((deploy_rt_parallel_for)fn, user);
}
