/* The checks every bundle's API makes of its tensors (bundle.c, cl_bundle.c) and its one-line
 * error. bundle_check.c, compiled once per compiler, does the work for the bundle it is given;
 * included by the API's source (after bundle.h and bundle_names.h), this header makes that
 * bundle from bundle_config.h, with the names the API calls: fail, check_all, check_run_args,
 * dtype_text, shape_text, last_error. A bundle that takes host memory for a device defines
 * DEPLOY_HOST_ONLY_TEXT to say so.
 */
#ifndef DEPLOY_BUNDLE_CHECK_H_
#define DEPLOY_BUNDLE_CHECK_H_

#include <stddef.h>

#include "bundle.h"

#define DEPLOY_ERROR_BYTES 512 /* NAME_last_error()'s buffer, its terminating NUL included */

typedef struct {
  const char* name; /* the bundle's prefix, which starts every message */
  int num_inputs;
  int num_outputs;
  const char* const* symbol_names;
  const DeployTensorSpec* tensors; /* the inputs, then the outputs */
  int alignment;                   /* what every tensor's data must be aligned to, in bytes */
  const char* host_only;           /* ends the message of a tensor on another device than the CPU */
  char* (*error)(void);            /* the calling thread's last_error of this bundle */
} DeployBundle;

/* Write "NAME: " and the message into the bundle's last_error; returns `code`. */
int deploy_bundle_fail(const DeployBundle* bundle, int code, const char* format, ...)
    __attribute__((format(printf, 3, 4)));
/* "float32", "int8x4". */
void deploy_bundle_dtype_text(DLDataType dtype, char* text, size_t size);
/* "[2, 64, 56, 56]", a symbolic dim by its name where `symbolic` (a spec's shape). */
void deploy_bundle_shape_text(const DeployBundle* bundle, const int64_t* shape, int ndim, int symbolic,
                              char* text, size_t size);
/* NAME_run's array: there, and one tensor per parameter (last_error cleared first). */
int deploy_bundle_check_run_args(const DeployBundle* bundle, DLTensor* const* args, int num_args);
/* Check every tensor, find the symbolic dims (`symbols`, zeroed, and `giver`, a scratch of as
 * many); `*folded` as the kernels take them. */
int deploy_bundle_check_all(const DeployBundle* bundle, const DLTensor* const* args, DLTensor* folded,
                            int64_t* symbols, const char** giver);

#ifndef DEPLOY_NO_BUNDLE_CONFIG

#ifndef DEPLOY_HOST_ONLY_TEXT
#define DEPLOY_HOST_ONLY_TEXT "this bundle runs on the CPU"
#endif

static _Thread_local char last_error[DEPLOY_ERROR_BYTES];

static char* deploy_last_error(void) { return last_error; }

static const DeployBundle deploy_bundle = {
    DEPLOY_STRING(DEPLOY_PREFIX), DEPLOY_NUM_INPUTS,    DEPLOY_NUM_OUTPUTS, deploy_symbol_names,
    deploy_tensors,               DEPLOY_TENSOR_ALIGNMENT, DEPLOY_HOST_ONLY_TEXT, deploy_last_error,
};

#define fail(...) deploy_bundle_fail(&deploy_bundle, __VA_ARGS__)
#define dtype_text deploy_bundle_dtype_text
#define shape_text(...) deploy_bundle_shape_text(&deploy_bundle, __VA_ARGS__)

static int check_run_args(DLTensor* const* args, int num_args) {
  return deploy_bundle_check_run_args(&deploy_bundle, args, num_args);
}

static int check_all(const DLTensor* const* args, DLTensor* folded, int64_t* symbols) {
  const char* giver[DEPLOY_NUM_SYMBOLS + 1] = {NULL};
  return deploy_bundle_check_all(&deploy_bundle, args, folded, symbols, giver);
}

#endif /* DEPLOY_NO_BUNDLE_CONFIG */

#endif /* DEPLOY_BUNDLE_CHECK_H_ */
