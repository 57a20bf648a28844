/* What a bundle was built for, shared by its API (bundle.c) and its runner (run.cc, runner_glue.c).
 *
 * deploy generates `bundle_config.h` per bundle (found on the include path): the public prefix,
 * one DeployTensorSpec per input and one per output in call order, the symbolic dims, and
 * the arena's slots when it is a graph's plan (deploy/compiler/plan.py lays them out). What is
 * compiled once for every bundle (run.cc, bundle_check.c) defines DEPLOY_NO_BUNDLE_CONFIG first.
 */
#ifndef DEPLOY_BUNDLE_H_
#define DEPLOY_BUNDLE_H_

#include <dlpack/dlpack.h>
#include <stdint.h>

#include "abi.h"

#define DEPLOY_MAX_SLOT_SYMBOLS 4

typedef struct {
  const char* name;
  DLDataType dtype;
  int ndim;
  int64_t shape[DEPLOY_MAX_DIMS]; /* a dim < 0 is the symbolic dim number -(dim + 1) */
} DeployTensorSpec;

typedef struct { /* an arena region: bytes times the product of some symbolic dims */
  uint64_t bytes;
  int num_symbols;
  int symbols[DEPLOY_MAX_SLOT_SYMBOLS];
} DeploySlot;

/* What the runner (run.cc, compiled once per architecture) knows of the bundle it is linked
 * with: runner_glue.c defines `deploy_runner` from bundle_config.h and the bundle's API. */
typedef struct {
  const char* name; /* the bundle's prefix */
  int num_inputs;
  int num_outputs;
  const char* const* symbol_names;
  const DeployTensorSpec* tensors; /* the inputs, then the outputs */
  int (*run)(DLTensor* const* args, int num_args);
  const char* (*last_error)(void);
  int (*set_num_threads)(int n); /* NULL: an OpenCL bundle, whose kernels run on its device */
  int (*select_device)(int platform, int device); /* NAME_cl_open of an OpenCL bundle, else NULL */
} DeployRunner;

#ifndef DEPLOY_NO_BUNDLE_CONFIG
#include "bundle_config.h"

#define DEPLOY_NUM_TENSORS (DEPLOY_NUM_INPUTS + DEPLOY_NUM_OUTPUTS)

/* The arena's size for the symbolic dims `symbols` as the plan's `main` computes it: each slot
 * rounded up to DEPLOY_ALIGNMENT, at least one alignment in all; 0 when it overflows. */
static inline uint64_t deploy_arena_bytes(const int64_t* symbols) {
  uint64_t total = 0;
  for (int i = 0; i < DEPLOY_NUM_SLOTS; ++i) {
    const DeploySlot* slot = &deploy_slots[i];
    uint64_t size = slot->bytes;
    for (int k = 0; k < slot->num_symbols; ++k) {
      if (__builtin_mul_overflow(size, (uint64_t)symbols[slot->symbols[k]], &size)) return 0;
    }
    if (size > UINT64_MAX - 2 * DEPLOY_ALIGNMENT) return 0;
    size = (size + DEPLOY_ALIGNMENT - 1) / DEPLOY_ALIGNMENT * DEPLOY_ALIGNMENT;
    if (__builtin_add_overflow(total, size, &total)) return 0;
  }
  return total < DEPLOY_ALIGNMENT ? DEPLOY_ALIGNMENT : total;
}
#endif /* DEPLOY_NO_BUNDLE_CONFIG */

#endif /* DEPLOY_BUNDLE_H_ */
