/* deploy-cl-probe P:D: what a board's OpenCL device P:D is, before deploy builds for it
 * (deploy/devices/board_opencl.py). Loads the OpenCL library at run time as an OpenCL bundle does
 * (deploy/compiler/runtime/cl_bundle.c), so it answers where the bundles would run. Prints two
 * lines, the device's name and its extensions (cl_khr_fp16 says whether float16 may be computed
 * in half); on failure one line on stderr: exit 1 when there is no OpenCL library or platform, 2
 * when there is no device P:D.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

enum { FAILED = 1, BAD_INPUT = 2, MAX_IDS = 16 };

static int index_of(const char* text, char end, const char** rest) {
  char* stop = NULL;
  long value = strtol(text, &stop, 10);
  if (stop == text || *stop != end || value < 0 || value >= 1024) return -1;
  *rest = stop + 1;
  return (int)value;
}

int main(int argc, char** argv) {
  const char* rest = NULL;
  int platform = argc == 2 ? index_of(argv[1], ':', &rest) : -1;
  int device = platform >= 0 ? index_of(rest, '\0', &rest) : -1;
  if (device < 0) {
    fprintf(stderr, "usage: deploy-cl-probe PLATFORM:DEVICE (e.g. 0:0)\n");
    return BAD_INPUT;
  }
  void* library = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) library = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "no OpenCL library (libOpenCL.so.1, libOpenCL.so): install the device's OpenCL driver\n");
    return FAILED;
  }
  __typeof__(&clGetPlatformIDs) get_platforms = (__typeof__(&clGetPlatformIDs))dlsym(library, "clGetPlatformIDs");
  __typeof__(&clGetDeviceIDs) get_devices = (__typeof__(&clGetDeviceIDs))dlsym(library, "clGetDeviceIDs");
  __typeof__(&clGetDeviceInfo) get_info = (__typeof__(&clGetDeviceInfo))dlsym(library, "clGetDeviceInfo");
  if (get_platforms == NULL || get_devices == NULL || get_info == NULL) {
    fprintf(stderr, "the OpenCL library has no clGetPlatformIDs: expected an OpenCL 1.2 library\n");
    return FAILED;
  }
  cl_platform_id platforms[MAX_IDS];
  cl_uint count = 0;
  if (get_platforms(MAX_IDS, platforms, &count) != CL_SUCCESS || count == 0) {
    fprintf(stderr, "no OpenCL platform: install the device's OpenCL driver (its ICD file in /etc/OpenCL/vendors)\n");
    return FAILED;
  }
  if ((cl_uint)platform >= count) {
    fprintf(stderr, "no OpenCL platform %d: expected 0 to %u\n", platform, count - 1);
    return BAD_INPUT;
  }
  cl_device_id devices[MAX_IDS];
  if (get_devices(platforms[platform], CL_DEVICE_TYPE_ALL, MAX_IDS, devices, &count) != CL_SUCCESS) count = 0;
  if ((cl_uint)device >= count) {
    fprintf(stderr, "no OpenCL device %d:%d: platform %d has %u device%s\n", platform, device, platform, count,
            count == 1 ? "" : "s");
    return BAD_INPUT;
  }
  static char name[256], extensions[16384];
  get_info(devices[device], CL_DEVICE_NAME, sizeof(name) - 1, name, NULL);
  get_info(devices[device], CL_DEVICE_EXTENSIONS, sizeof(extensions) - 1, extensions, NULL);
  printf("%s\n%s\n", name, extensions);
  return fflush(stdout) == 0 ? 0 : FAILED;
}
