/* The API of an OpenCL bundle (NAME.h, generated): the launch plan deploy built (cl_plan.h: the
 * kernels in order, each argument a tensor, a scratch buffer or a constant, global and local
 * sizes) run through the device's OpenCL library, loaded at run time (dlopen libOpenCL.so.1):
 * nothing to link, so one bundle serves any vendor's driver (the ICD loader or a driver's own).
 *
 * The kernels' source and the graph's constants are embedded (.incbin of kernels.cl and
 * constants.bin, found beside this file when it is compiled). A program is built once per
 * cl_context and cached with its kernels, scratch and constants buffers (MAX_CONTEXTS, the oldest
 * released first). One lock serialises the calls: kernel objects are shared, clSetKernelArg is
 * not thread-safe. Tensors are checked as a CPU bundle's (bundle_check.h), cl_mem buffers by
 * their context and size; every failure is an error code and a one-line NAME_last_error().
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <pthread.h>

#include "bundle.h"
#include DEPLOY_HEADER

enum { DEPLOY_CL_TENSOR, DEPLOY_CL_SCRATCH, DEPLOY_CL_CONSTANT };                           /* arg roles */
enum { DEPLOY_CL_FLOAT16_NONE, DEPLOY_CL_FLOAT16_STORAGE, DEPLOY_CL_FLOAT16_NATIVE }; /* the plan's */
typedef struct { int role, index; } DeployClArg; /* a tensor by call index, a scratch or a constant */
typedef struct {
  const char* name;
  int first_arg, num_args; /* in deploy_cl_args */
  size_t global[3], local[3];
} DeployClKernel;
typedef struct { uint64_t offset, bytes; } DeployClConstant; /* in the blob */

#include "cl_plan.h"

#include "bundle_names.h"
#define DEPLOY_HOST_ONLY_TEXT "this call takes host memory (" DEPLOY_STRING(DEPLOY_PREFIX) "_cl_enqueue takes cl_mem)"

#include "bundle_check.h"

enum { MAX_CONTEXTS = 8 };

/* The kernels' OpenCL C (NUL-terminated) and the constants' blob, as built. */
#define DEPLOY_BALIGN ".balign " DEPLOY_STRING(DEPLOY_ALIGNMENT) "\n"
__asm__(".section .rodata\n" DEPLOY_BALIGN "deploy_cl_source:\n.incbin \"kernels.cl\"\n.byte 0\n"
        DEPLOY_BALIGN "deploy_cl_blob:\n.incbin \"constants.bin\"\n.previous\n");
extern const char deploy_cl_source[] __attribute__((visibility("hidden")));
extern const unsigned char deploy_cl_blob[] __attribute__((visibility("hidden")));

/* The OpenCL 1.2 functions the bundle calls, looked up in the library at run time. */
#define CL_FUNCTIONS(X)                                                                                \
  X(clGetPlatformIDs) X(clGetDeviceIDs) X(clGetDeviceInfo) X(clCreateContext) X(clCreateCommandQueue) \
  X(clGetContextInfo) X(clGetCommandQueueInfo) X(clGetMemObjectInfo) X(clCreateProgramWithSource)    \
  X(clBuildProgram) X(clGetProgramBuildInfo) X(clCreateKernel) X(clSetKernelArg) X(clCreateBuffer)    \
  X(clEnqueueNDRangeKernel) X(clEnqueueWriteBuffer) X(clEnqueueReadBuffer) X(clFinish)                \
  X(clRetainContext) X(clReleaseContext) X(clReleaseCommandQueue) X(clReleaseProgram)                 \
  X(clReleaseKernel) X(clReleaseMemObject)
#define FIELD(f) __typeof__(&f) f;
static struct { CL_FUNCTIONS(FIELD) } ocl;
static int ocl_loaded;

typedef struct { /* a program and its buffers, built for one context */
  cl_context context; /* retained */
  cl_program program;
  cl_kernel kernels[DEPLOY_CL_NUM_KERNELS];
  cl_mem scratch[DEPLOY_CL_NUM_SCRATCH + 1];
  cl_mem constants[DEPLOY_CL_NUM_CONSTANTS + 1];
} Built;

static Built built[MAX_CONTEXTS];
static int num_built;

static struct { /* the bundle's own device, for NAME() and NAME_run() on host memory */
  cl_context context;
  cl_command_queue queue;
  cl_mem tensors[DEPLOY_NUM_TENSORS];
} own;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Bytes of a tensor of `spec` (no symbolic dims: OpenCL plans have fixed shapes). */
static size_t spec_bytes(const DeployTensorSpec* spec) {
  size_t bytes = (size_t)(spec->dtype.bits + 7) / 8 * spec->dtype.lanes;
  for (int i = 0; i < spec->ndim; ++i) bytes *= (size_t)spec->shape[i];
  return bytes;
}

static int load_library(void) {
  if (ocl_loaded) return DEPLOY_OK;
  void* library = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) library = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    return fail(DEPLOY_ERR_NO_OPENCL,
                "no OpenCL library (libOpenCL.so.1, libOpenCL.so: %s): install the device's OpenCL driver"
                " (on Debian: ocl-icd-libopencl1 and pocl-opencl-icd)", dlerror());
  }
#define LOOK_UP(f)                                                                              \
  if ((*(void**)&ocl.f = dlsym(library, #f)) == NULL) {                                          \
    dlclose(library);                                                                           \
    return fail(DEPLOY_ERR_NO_OPENCL, "the OpenCL library has no %s: expected an OpenCL 1.2 library", #f); \
  }
  CL_FUNCTIONS(LOOK_UP)
  ocl_loaded = 1;
  return DEPLOY_OK;
}

/* Whether every device of `context` has half arithmetic (cl_khr_fp16), as native float16 needs. */
static int check_fp16(cl_context context) {
  if (DEPLOY_CL_FLOAT16 != DEPLOY_CL_FLOAT16_NATIVE) return DEPLOY_OK;
  cl_device_id devices[16];
  size_t size = 0;
  if (ocl.clGetContextInfo(context, CL_CONTEXT_DEVICES, sizeof(devices), devices, &size) != CL_SUCCESS) {
    return fail(DEPLOY_ERR_ARGUMENT, "cannot list the devices of the cl_context (more than 16?)");
  }
  for (size_t i = 0; i < size / sizeof(cl_device_id); ++i) {
    char extensions[8192] = "", name[128] = "";
    ocl.clGetDeviceInfo(devices[i], CL_DEVICE_EXTENSIONS, sizeof(extensions) - 1, extensions, NULL);
    if (strstr(extensions, "cl_khr_fp16") == NULL) {
      ocl.clGetDeviceInfo(devices[i], CL_DEVICE_NAME, sizeof(name) - 1, name, NULL);
      return fail(DEPLOY_ERR_NO_OPENCL, "the kernels compute in half, which needs cl_khr_fp16 and %s has none: build"
                  " with --fp16 storage for this device", name);
    }
  }
  return DEPLOY_OK;
}

static void release(Built* b) {
  for (int i = 0; i < DEPLOY_CL_NUM_KERNELS; ++i) {
    if (b->kernels[i]) ocl.clReleaseKernel(b->kernels[i]);
  }
  for (int i = 0; i < DEPLOY_CL_NUM_SCRATCH + 1; ++i) {
    if (b->scratch[i]) ocl.clReleaseMemObject(b->scratch[i]);
  }
  for (int i = 0; i < DEPLOY_CL_NUM_CONSTANTS + 1; ++i) {
    if (b->constants[i]) ocl.clReleaseMemObject(b->constants[i]);
  }
  if (b->program) ocl.clReleaseProgram(b->program);
  if (b->context) ocl.clReleaseContext(b->context);
  memset(b, 0, sizeof(*b));
}

/* "build failed" with the compiler log's first lines (of the context's first device). */
static int build_failed(cl_context context, cl_program program, cl_int err) {
  cl_device_id device;
  char log[4096] = "", said[400] = "";
  if (ocl.clGetContextInfo(context, CL_CONTEXT_DEVICES, sizeof(device), &device, NULL) == CL_SUCCESS) {
    ocl.clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, sizeof(log) - 1, log, NULL);
  }
  size_t used = 0; /* the log's lines that are not blank, joined (no strtok: its state is the process's) */
  for (char* line = log; *line != '\0' && used + 4 < sizeof(said);) {
    size_t length = strcspn(line, "\n");
    char* next = line + length + (line[length] == '\n');
    line[length] = '\0';
    if (line[strspn(line, " \t\r")] != '\0') {
      used += (size_t)snprintf(said + used, sizeof(said) - used, "%s%s", used ? " | " : "", line);
    }
    line = next;
  }
  return fail(DEPLOY_ERR_KERNEL, "the kernels failed to build (OpenCL error %d): %s", (int)err,
              said[0] ? said : "no build log");
}

/* A buffer of `bytes` (at least 1: OpenCL has no empty buffer), copied from `data` if given. */
static cl_mem buffer(cl_context context, size_t bytes, const void* data, cl_int* err) {
  cl_mem_flags flags = data != NULL && bytes ? CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR : CL_MEM_READ_WRITE;
  return ocl.clCreateBuffer(context, flags, bytes ? bytes : 1, bytes ? (void*)data : NULL, err);
}

/* The program, kernels and buffers for `context`, built on first use. */
static int built_for(cl_context context, Built** out) {
  for (int i = 0; i < num_built; ++i) {
    if (built[i].context == context) return *out = &built[i], DEPLOY_OK;
  }
  int status = check_fp16(context);
  if (status != DEPLOY_OK) return status;
  if (num_built == MAX_CONTEXTS) { /* the oldest goes */
    release(&built[0]);
    memmove(&built[0], &built[1], sizeof(Built) * (MAX_CONTEXTS - 1));
    memset(&built[--num_built], 0, sizeof(Built));
  }
  Built* b = &built[num_built];
  cl_int err = ocl.clRetainContext(context);
  if (err != CL_SUCCESS) {
    return fail(DEPLOY_ERR_ARGUMENT, "the cl_context is not a context (OpenCL error %d)", (int)err);
  }
  b->context = context;
  const char* source = deploy_cl_source;
  size_t length = DEPLOY_CL_SOURCE_BYTES;
  b->program = ocl.clCreateProgramWithSource(context, 1, &source, &length, &err);
  if (err == CL_SUCCESS) err = ocl.clBuildProgram(b->program, 0, NULL, "", NULL, NULL);
  if (err != CL_SUCCESS) {
    status = b->program ? build_failed(context, b->program, err)
                        : fail(DEPLOY_ERR_KERNEL, "clCreateProgramWithSource failed (OpenCL error %d)", (int)err);
    release(b);
    return status;
  }
  for (int i = 0; i < DEPLOY_CL_NUM_KERNELS && err == CL_SUCCESS; ++i) {
    b->kernels[i] = ocl.clCreateKernel(b->program, deploy_cl_kernels[i].name, &err);
  }
  for (int i = 0; i < DEPLOY_CL_NUM_SCRATCH && err == CL_SUCCESS; ++i) {
    b->scratch[i] = buffer(context, deploy_cl_scratch_bytes[i], NULL, &err);
  }
  for (int i = 0; i < DEPLOY_CL_NUM_CONSTANTS && err == CL_SUCCESS; ++i) {
    const DeployClConstant* c = &deploy_cl_constants[i];
    b->constants[i] = buffer(context, c->bytes, deploy_cl_blob + c->offset, &err);
  }
  if (err != CL_SUCCESS) {
    release(b);
    return fail(DEPLOY_ERR_MEMORY, "cannot make the kernels or their buffers (OpenCL error %d)", (int)err);
  }
  ++num_built;
  return *out = b, DEPLOY_OK;
}

/* Enqueue every kernel of the plan on `queue`, the tensors being `tensors`. */
static int enqueue(Built* b, cl_command_queue queue, const cl_mem* tensors) {
  for (int k = 0; k < DEPLOY_CL_NUM_KERNELS; ++k) {
    const DeployClKernel* kernel = &deploy_cl_kernels[k];
    cl_int err = CL_SUCCESS;
    for (int j = 0; j < kernel->num_args && err == CL_SUCCESS; ++j) {
      const DeployClArg* arg = &deploy_cl_args[kernel->first_arg + j];
      const cl_mem* pool = arg->role == DEPLOY_CL_TENSOR ? tensors
                           : arg->role == DEPLOY_CL_SCRATCH ? b->scratch : b->constants;
      err = ocl.clSetKernelArg(b->kernels[k], (cl_uint)j, sizeof(cl_mem), &pool[arg->index]);
    }
    if (err == CL_SUCCESS) {
      err = ocl.clEnqueueNDRangeKernel(queue, b->kernels[k], 3, NULL, kernel->global, kernel->local, 0, NULL, NULL);
    }
    if (err != CL_SUCCESS) return fail(DEPLOY_ERR_KERNEL, "kernel %s: OpenCL error %d", kernel->name, (int)err);
  }
  return DEPLOY_OK;
}

static void close_own(void) {
  for (int i = 0; i < DEPLOY_NUM_TENSORS; ++i) {
    if (own.tensors[i]) ocl.clReleaseMemObject(own.tensors[i]);
  }
  for (int i = 0; i < num_built; ++i) {
    if (built[i].context == own.context) {
      release(&built[i]);
      memmove(&built[i], &built[i + 1], sizeof(Built) * (size_t)(num_built - i - 1));
      memset(&built[--num_built], 0, sizeof(Built));
      break;
    }
  }
  if (own.queue) ocl.clReleaseCommandQueue(own.queue);
  if (own.context) ocl.clReleaseContext(own.context);
  memset(&own, 0, sizeof(own));
}

/* The bundle's own context and queue on platform:device, and a buffer per tensor. */
static int open_device(int platform, int device) {
  int status = load_library();
  if (status != DEPLOY_OK) return status;
  cl_platform_id platforms[16];
  cl_uint count = 0;
  cl_int err = ocl.clGetPlatformIDs(16, platforms, &count);
  if (err != CL_SUCCESS || count == 0) {
    return fail(DEPLOY_ERR_NO_OPENCL, "no OpenCL platform: install an OpenCL driver (on Debian: pocl-opencl-icd)");
  }
  if (platform < 0 || (cl_uint)platform >= count) {
    return fail(DEPLOY_ERR_ARGUMENT, "no OpenCL platform %d: expected 0 to %u", platform, count - 1);
  }
  cl_device_id devices[16];
  err = ocl.clGetDeviceIDs(platforms[platform], CL_DEVICE_TYPE_ALL, 16, devices, &count);
  if (err != CL_SUCCESS) count = 0;
  if (device < 0 || (cl_uint)device >= count) {
    return fail(DEPLOY_ERR_ARGUMENT, "no OpenCL device %d:%d: platform %d has %u device%s", platform, device, platform,
                count, count == 1 ? "" : "s");
  }
  close_own();
  own.context = ocl.clCreateContext(NULL, 1, &devices[device], NULL, NULL, &err);
  if (err == CL_SUCCESS) own.queue = ocl.clCreateCommandQueue(own.context, devices[device], 0, &err);
  for (int i = 0; i < DEPLOY_NUM_TENSORS && err == CL_SUCCESS; ++i) {
    own.tensors[i] = buffer(own.context, spec_bytes(&deploy_tensors[i]), NULL, &err);
  }
  if (err != CL_SUCCESS) {
    close_own();
    return fail(DEPLOY_ERR_NO_OPENCL, "cannot open OpenCL device %d:%d (OpenCL error %d)", platform, device, (int)err);
  }
  return DEPLOY_OK;
}

/* NAME() on host tensors: upload the inputs, run the plan, download the outputs, wait. */
static int run_host(const DLTensor* const* args) {
  DLTensor folded[DEPLOY_NUM_TENSORS];
  int64_t symbols[DEPLOY_NUM_SYMBOLS + 1] = {0};
  last_error[0] = '\0';
  int status = check_all(args, folded, symbols);
  if (status != DEPLOY_OK) return status;
  pthread_mutex_lock(&lock);
  Built* b = NULL;
  status = own.context != NULL ? DEPLOY_OK : open_device(0, 0);
  if (status == DEPLOY_OK) status = built_for(own.context, &b);
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < DEPLOY_NUM_INPUTS && status == DEPLOY_OK && err == CL_SUCCESS; ++i) {
    size_t bytes = spec_bytes(&deploy_tensors[i]);
    if (bytes) err = ocl.clEnqueueWriteBuffer(own.queue, own.tensors[i], CL_FALSE, 0, bytes, folded[i].data, 0, NULL, NULL);
  }
  if (status == DEPLOY_OK && err == CL_SUCCESS) status = enqueue(b, own.queue, own.tensors);
  for (int i = DEPLOY_NUM_INPUTS; i < DEPLOY_NUM_TENSORS && status == DEPLOY_OK && err == CL_SUCCESS; ++i) {
    size_t bytes = spec_bytes(&deploy_tensors[i]);
    if (bytes) err = ocl.clEnqueueReadBuffer(own.queue, own.tensors[i], CL_FALSE, 0, bytes, folded[i].data, 0, NULL, NULL);
  }
  if (own.queue != NULL) { /* nothing may still read or write the caller's memory */
    cl_int finished = ocl.clFinish(own.queue);
    if (err == CL_SUCCESS) err = finished;
  }
  if (status == DEPLOY_OK && err != CL_SUCCESS) {
    status = fail(DEPLOY_ERR_KERNEL, "the device failed (OpenCL error %d)", (int)err);
  }
  pthread_mutex_unlock(&lock);
  return status;
}

/* Check the engine's cl_mem `mem` for tensor `spec`: a buffer (an image's layout is the
 * driver's) of `context`, at least its bytes, and one the kernels may write if it is an `output`. */
static int check_mem(cl_mem mem, const DeployTensorSpec* spec, cl_context context, int output) {
  cl_context of = NULL;
  cl_mem_object_type type = 0;
  cl_mem_flags flags = 0;
  size_t size = 0, bytes = spec_bytes(spec);
  if (mem == NULL) return fail(DEPLOY_ERR_ARGUMENT, "%s is NULL", spec->name);
  if (ocl.clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof(of), &of, NULL) != CL_SUCCESS ||
      ocl.clGetMemObjectInfo(mem, CL_MEM_TYPE, sizeof(type), &type, NULL) != CL_SUCCESS ||
      ocl.clGetMemObjectInfo(mem, CL_MEM_FLAGS, sizeof(flags), &flags, NULL) != CL_SUCCESS ||
      ocl.clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof(size), &size, NULL) != CL_SUCCESS) {
    return fail(DEPLOY_ERR_ARGUMENT, "%s is not a cl_mem buffer", spec->name);
  }
  if (type != CL_MEM_OBJECT_BUFFER) {
    return fail(DEPLOY_ERR_ARGUMENT, "%s is an image or a pipe (cl_mem type 0x%x): expected a buffer", spec->name,
                (unsigned)type);
  }
  if (output && (flags & CL_MEM_READ_ONLY)) {
    return fail(DEPLOY_ERR_ARGUMENT, "%s is an output and its buffer is CL_MEM_READ_ONLY: expected one the kernels may"
                " write", spec->name);
  }
  if (of != context) {
    return fail(DEPLOY_ERR_ARGUMENT, "%s belongs to another cl_context than the one given", spec->name);
  }
  if (size < bytes) {
    char dtype[32], shape[256];
    dtype_text(spec->dtype, dtype, sizeof(dtype));
    shape_text(spec->shape, spec->ndim, 1, shape, sizeof(shape));
    return fail(DEPLOY_ERR_ARGUMENT, "%s has %zu bytes, expected at least %zu (%s %s)", spec->name, size, bytes,
                dtype, shape);
  }
  return DEPLOY_OK;
}

DEPLOY_EXPORT int DEPLOY_PREFIX(DEPLOY_PARAMS) {
  const DLTensor* args[] = {DEPLOY_ARGS};
  return run_host(args);
}

DEPLOY_EXPORT int DEPLOY_API(_run)(DLTensor* const* args, int num_args) {
  int checked = check_run_args(args, num_args);
  if (checked != DEPLOY_OK) return checked;
  return run_host((const DLTensor* const*)args);
}

DEPLOY_EXPORT int DEPLOY_API(_cl_open)(int platform, int device) {
  last_error[0] = '\0';
  pthread_mutex_lock(&lock);
  int status = open_device(platform, device);
  pthread_mutex_unlock(&lock);
  return status;
}

DEPLOY_EXPORT void DEPLOY_API(_cl_close)(void) {
  pthread_mutex_lock(&lock);
  if (ocl_loaded) close_own();
  pthread_mutex_unlock(&lock);
}

/* NAME_cl_enqueue on the engine's tensors `mems`, in call order. */
static int run_engine(cl_context context, cl_command_queue queue, const cl_mem* mems) {
  last_error[0] = '\0';
  if (context == NULL || queue == NULL) {
    return fail(DEPLOY_ERR_ARGUMENT, "the cl_context or the cl_command_queue is NULL");
  }
  pthread_mutex_lock(&lock);
  cl_context of = NULL;
  Built* b = NULL;
  int status = load_library();
  if (status == DEPLOY_OK && ocl.clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof(of), &of, NULL) != CL_SUCCESS) {
    status = fail(DEPLOY_ERR_ARGUMENT, "the cl_command_queue is not a command queue");
  } else if (status == DEPLOY_OK && of != context) {
    status = fail(DEPLOY_ERR_ARGUMENT, "the cl_command_queue belongs to another cl_context than the one given");
  }
  for (int i = 0; i < DEPLOY_NUM_TENSORS && status == DEPLOY_OK; ++i) {
    status = check_mem(mems[i], &deploy_tensors[i], context, i >= DEPLOY_NUM_INPUTS);
  }
  if (status == DEPLOY_OK) status = built_for(context, &b);
  if (status == DEPLOY_OK) status = enqueue(b, queue, mems);
  pthread_mutex_unlock(&lock);
  return status;
}

DEPLOY_EXPORT int DEPLOY_API(_cl_enqueue)(cl_context deploy_context, cl_command_queue deploy_queue, DEPLOY_CL_PARAMS) {
  const cl_mem deploy_mems[] = {DEPLOY_ARGS};
  return run_engine(deploy_context, deploy_queue, deploy_mems);
}

DEPLOY_EXPORT const char* DEPLOY_API(_last_error)(void) { return last_error; }
