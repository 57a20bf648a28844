/* The checks every bundle's API makes of its tensors (bundle.c, cl_bundle.c) and its one-line
 * error: included once by the API's source, after bundle.h and bundle_names.h. A bundle
 * that takes host memory for a device defines DEPLOY_HOST_ONLY_TEXT to say so.
 */
#ifndef DEPLOY_BUNDLE_CHECK_H_
#define DEPLOY_BUNDLE_CHECK_H_

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#ifndef DEPLOY_HOST_ONLY_TEXT
#define DEPLOY_HOST_ONLY_TEXT "this bundle runs on the CPU"
#endif

static _Thread_local char last_error[512];

static int fail(int code, const char* format, ...) {
  int used = snprintf(last_error, sizeof(last_error), "%s: ", DEPLOY_STRING(DEPLOY_PREFIX));
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
  if (given == NULL) return fail(DEPLOY_ERR_ARGUMENT, "%s is NULL", name);
  if (given->data == NULL) return fail(DEPLOY_ERR_ARGUMENT, "%s.data is NULL", name);
  if (given->device.device_type != kDLCPU || given->device.device_id != 0) {
    return fail(DEPLOY_ERR_ARGUMENT, "%s is on device (type %d, id %d): " DEPLOY_HOST_ONLY_TEXT " (kDLCPU, id 0)",
                name, (int)given->device.device_type, (int)given->device.device_id);
  }
  if (given->dtype.code != spec->dtype.code || given->dtype.bits != spec->dtype.bits ||
      given->dtype.lanes != spec->dtype.lanes) {
    dtype_text(given->dtype, got, sizeof(got));
    dtype_text(spec->dtype, want, sizeof(want));
    return fail(DEPLOY_ERR_ARGUMENT, "%s is %s, expected %s", name, got, want);
  }
  /* The texts of the messages below, made only for a message: a call that passes costs no printf. */
#define WANT (shape_text(spec->shape, spec->ndim, 1, want, sizeof(want)), want)
#define GOT (shape_text(given->shape, spec->ndim, 0, got, sizeof(got)), got)
  if (given->ndim != spec->ndim) {  /* its shape is not read: ndim may be anything */
    return fail(DEPLOY_ERR_ARGUMENT, "%s has %d dim%s, expected %s", name, (int)given->ndim,
                given->ndim == 1 ? "" : "s", WANT);
  }
  if (spec->ndim > 0 && given->shape == NULL) {
    return fail(DEPLOY_ERR_ARGUMENT, "%s.shape is NULL, expected %s", name, WANT);
  }
  for (int i = 0; i < spec->ndim; ++i) {
    int64_t dim = spec->shape[i], size = given->shape[i];
    if (dim >= 0) {
      if (size != dim) return fail(DEPLOY_ERR_ARGUMENT, "%s has shape %s, expected %s", name, GOT, WANT);
      continue;
    }
    int symbol = (int)(-dim - 1);
    const char* symbol_name = deploy_symbol_names[symbol];
    if (size < 1 || size > INT32_MAX) {
      return fail(DEPLOY_ERR_ARGUMENT, "%s has shape %s: %s = %" PRId64 ", expected 1 <= %s <= %d", name, GOT,
                  symbol_name, size, symbol_name, INT32_MAX);
    }
    if (symbols[symbol] == 0) {
      symbols[symbol] = size;
      giver[symbol] = name;
    } else if (symbols[symbol] != size) {
      return fail(DEPLOY_ERR_ARGUMENT, "%s has %s = %" PRId64 " (shape %s), but %s has %s = %" PRId64, name,
                  symbol_name, size, GOT, giver[symbol], symbol_name, symbols[symbol]);
    }
  }
  uint64_t elements = 1;
  for (int i = 0; i < spec->ndim; ++i) {
    if (__builtin_mul_overflow(elements, (uint64_t)given->shape[i], &elements) || elements > INT64_MAX / 8) {
      return fail(DEPLOY_ERR_ARGUMENT, "%s has shape %s: more elements than memory holds", name, GOT);
    }
  }
  if (elements > INT32_MAX) { /* the kernels index with int32: a symbolic batch can pass the cap */
    return fail(DEPLOY_ERR_ARGUMENT,
                "%s has shape %s: %" PRIu64 " elements, more than the %d (2**31 - 1) one tensor may hold", name, GOT,
                elements, INT32_MAX);
  }
  /* data + byte_offset must address the whole tensor without wrapping: a "negative" offset
   * (-64 as uint64) would otherwise pass the alignment check and read before the buffer. */
  uint64_t bytes = elements * ((spec->dtype.bits * spec->dtype.lanes + 7u) / 8u);
  uintptr_t start = 0;
  if ((uint64_t)(uintptr_t)given->byte_offset != given->byte_offset ||
      __builtin_add_overflow((uintptr_t)given->data, (uintptr_t)given->byte_offset, &start) ||
      bytes > UINTPTR_MAX - start) {
    return fail(DEPLOY_ERR_ARGUMENT,
                "%s.byte_offset %" PRIu64 " wraps past the end of memory: expected the offset of the tensor in data",
                name, (uint64_t)given->byte_offset);
  }
#undef WANT
#undef GOT
  if (given->strides != NULL) {
    int64_t expected = 1;
    for (int i = spec->ndim - 1; i >= 0; --i) {
      if (given->shape[i] != 1 && given->strides[i] != expected) {
        return fail(DEPLOY_ERR_ARGUMENT, "%s is not compact (C order)", name);
      }
      expected *= given->shape[i];
    }
  }
  *folded = *given;
  folded->data = (char*)given->data + given->byte_offset;
  folded->byte_offset = 0;
  folded->strides = NULL;
  if ((uintptr_t)folded->data % DEPLOY_TENSOR_ALIGNMENT != 0) {
    return fail(DEPLOY_ERR_ARGUMENT, "%s.data + byte_offset is not %d-byte aligned", name, DEPLOY_TENSOR_ALIGNMENT);
  }
  return DEPLOY_OK;
}

/* Check every tensor, find the symbolic dims; `*folded` as the kernels take them. */
/* NAME_run's array: there, and one tensor per parameter (last_error cleared first). */
static int check_run_args(DLTensor* const* args, int num_args) {
  last_error[0] = '\0';
  if (args == NULL) return fail(DEPLOY_ERR_ARGUMENT, "args is NULL: expected an array of the inputs and the outputs");
  if (num_args != DEPLOY_NUM_TENSORS) {
    return fail(DEPLOY_ERR_ARGUMENT, "expected %d inputs and %d output%s (%d tensors), got %d", DEPLOY_NUM_INPUTS,
                DEPLOY_NUM_OUTPUTS, DEPLOY_NUM_OUTPUTS == 1 ? "" : "s", DEPLOY_NUM_TENSORS, num_args);
  }
  return DEPLOY_OK;
}

static int check_all(const DLTensor* const* args, DLTensor* folded, int64_t* symbols) {
  const char* giver[DEPLOY_NUM_SYMBOLS + 1] = {NULL};
  for (int i = 0; i < DEPLOY_NUM_TENSORS; ++i) {
    int status = check_tensor(args[i], &deploy_tensors[i], symbols, giver, &folded[i]);
    if (status != DEPLOY_OK) return status;
  }
  return DEPLOY_OK;
}

#endif /* DEPLOY_BUNDLE_CHECK_H_ */
