/* The constants a bundle's C and deploy's Python share, each spelled here only: the runtime
 * (runtime.c), the API (bundle.c, cl_bundle.c) and the runner (run.cc) include this header;
 * Python reads its #defines (deploy/compiler/runtime/__init__.py) for the plans it lays out and
 * the NAME.h it writes, whose NAME_ERR_* codes have these values. Each value is a plain integer
 * literal (parenthesized when negative), as Python and the assembler's .balign read it.
 */
#ifndef DEPLOY_ABI_H_
#define DEPLOY_ABI_H_

/* Bytes TVM's kernels assume every buffer is aligned to (its kAllocAlignment, which they
 * llvm.assume): the runtime's scratch, a graph's arena and each slot of it, the constants' blob,
 * what the runner allocates, and a target's tensors unless --alignment says less. */
#define DEPLOY_ALIGNMENT 64
/* The most dims a bundle's tensor may have. */
#define DEPLOY_MAX_DIMS 16

/* What a bundle's functions return: 0, or an error with a one-line reason in NAME_last_error(). */
#define DEPLOY_OK 0
#define DEPLOY_ERR_ARGUMENT (-1)  /* a bad tensor or argument: nothing was run */
#define DEPLOY_ERR_KERNEL (-2)    /* a kernel failed (an OpenCL bundle's: to build or to run) */
#define DEPLOY_ERR_MEMORY (-3)    /* no memory for the arena or the device's buffers */
#define DEPLOY_ERR_NO_OPENCL (-4) /* no OpenCL library or platform, or a device without cl_khr_fp16 */

#endif /* DEPLOY_ABI_H_ */
