/* The checks every bundle's API makes of its tensors, and its one-line errors: compiled once per
 * compiler and linked into every bundle (CPU and OpenCL), each call given the bundle it checks
 * for (DeployBundle, which bundle_check.h makes from bundle_config.h). The printf-heavy code
 * lives here, so that what is compiled per bundle is its tables and a few calls.
 */
#define DEPLOY_NO_BUNDLE_CONFIG
#include "bundle_check.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int deploy_bundle_fail(const DeployBundle* bundle, int code, const char* format, ...) {
  char* text = bundle->error();
  int used = snprintf(text, DEPLOY_ERROR_BYTES, "%s: ", bundle->name);
  if (used < 0 || used >= DEPLOY_ERROR_BYTES) return code;
  va_list args;
  va_start(args, format);
  vsnprintf(text + used, DEPLOY_ERROR_BYTES - (size_t)used, format, args);
  va_end(args);
  return code;
}

#define fail(...) deploy_bundle_fail(bundle, __VA_ARGS__)

void deploy_bundle_dtype_text(DLDataType dtype, char* text, size_t size) {
  const char* kind = dtype.code == kDLFloat ? "float" : dtype.code == kDLInt ? "int"
                     : dtype.code == kDLUInt ? "uint" : dtype.code == kDLBool ? "bool" : "code";
  if (dtype.lanes == 1) snprintf(text, size, "%s%u", kind, (unsigned)dtype.bits);
  else snprintf(text, size, "%s%ux%u", kind, (unsigned)dtype.bits, (unsigned)dtype.lanes);
}

void deploy_bundle_shape_text(const DeployBundle* bundle, const int64_t* shape, int ndim, int symbolic,
                              char* text, size_t size) {
  size_t used = (size_t)snprintf(text, size, "[");
  for (int i = 0; i < ndim && used < size; ++i) {
    const char* comma = i ? ", " : "";
    if (symbolic && shape[i] < 0) {
      used += (size_t)snprintf(text + used, size - used, "%s%s", comma, bundle->symbol_names[-shape[i] - 1]);
    } else {
      used += (size_t)snprintf(text + used, size - used, "%s%" PRId64, comma, shape[i]);
    }
  }
  if (used < size) snprintf(text + used, size - used, "]");
}

/* Check `given` against `spec`, binding the symbolic dims in `symbols` (0: not yet seen, with the
 * tensor that gave each in `giver`); `*folded` is the tensor as the kernels take it: byte_offset
 * folded into data, no strides (C order checked; a size-1 dim may have any stride). */
static int check_tensor(const DeployBundle* bundle, const DLTensor* given, const DeployTensorSpec* spec,
                        int64_t* symbols, const char** giver, DLTensor* folded) {
  char want[256], got[256];
  const char* name = spec->name;
  if (given == NULL) return fail(DEPLOY_ERR_ARGUMENT, "%s is NULL", name);
  if (given->data == NULL) return fail(DEPLOY_ERR_ARGUMENT, "%s.data is NULL", name);
  if (given->device.device_type != kDLCPU || given->device.device_id != 0) {
    return fail(DEPLOY_ERR_ARGUMENT, "%s is on device (type %d, id %d): %s (kDLCPU, id 0)", name,
                (int)given->device.device_type, (int)given->device.device_id, bundle->host_only);
  }
  if (given->dtype.code != spec->dtype.code || given->dtype.bits != spec->dtype.bits ||
      given->dtype.lanes != spec->dtype.lanes) {
    deploy_bundle_dtype_text(given->dtype, got, sizeof(got));
    deploy_bundle_dtype_text(spec->dtype, want, sizeof(want));
    return fail(DEPLOY_ERR_ARGUMENT, "%s is %s, expected %s", name, got, want);
  }
  /* The texts of the messages below, made only for a message: a call that passes costs no printf. */
#define WANT (deploy_bundle_shape_text(bundle, spec->shape, spec->ndim, 1, want, sizeof(want)), want)
#define GOT (deploy_bundle_shape_text(bundle, given->shape, spec->ndim, 0, got, sizeof(got)), got)
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
    const char* symbol_name = bundle->symbol_names[symbol];
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
  if ((uintptr_t)folded->data % (uintptr_t)bundle->alignment != 0) {
    return fail(DEPLOY_ERR_ARGUMENT, "%s.data + byte_offset is not %d-byte aligned", name, bundle->alignment);
  }
  return DEPLOY_OK;
}

int deploy_bundle_check_run_args(const DeployBundle* bundle, DLTensor* const* args, int num_args) {
  bundle->error()[0] = '\0';
  if (args == NULL) return fail(DEPLOY_ERR_ARGUMENT, "args is NULL: expected an array of the inputs and the outputs");
  int tensors = bundle->num_inputs + bundle->num_outputs;
  if (num_args != tensors) {
    return fail(DEPLOY_ERR_ARGUMENT, "expected %d inputs and %d output%s (%d tensors), got %d", bundle->num_inputs,
                bundle->num_outputs, bundle->num_outputs == 1 ? "" : "s", tensors, num_args);
  }
  return DEPLOY_OK;
}

int deploy_bundle_check_all(const DeployBundle* bundle, const DLTensor* const* args, DLTensor* folded,
                            int64_t* symbols, const char** giver) {
  for (int i = 0; i < bundle->num_inputs + bundle->num_outputs; ++i) {
    int status = check_tensor(bundle, args[i], &bundle->tensors[i], symbols, giver, &folded[i]);
    if (status != DEPLOY_OK) return status;
  }
  return DEPLOY_OK;
}
