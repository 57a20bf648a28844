/* A small onnxruntime host without Python (deploy test --engine onnxruntime --target arm): loads
 * the engine's library, registers deploy's plugin, runs a model once and writes its outputs.
 *
 *   deploy-ort-host LIBONNXRUNTIME MODEL PLUGIN OUTDIR NAME=ELEM:D0xD1x...:FILE ...
 *
 * Each input is raw little-endian data in FILE, of ONNX element type ELEM and those dims. Output i
 * is written raw to OUTDIR/i.bin, and a line "i ELEM D0xD1x..." printed for it. Errors are one
 * line on stderr (onnxruntime's message where it failed), exit 1; bad arguments exit 2.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnxruntime_c_api.h"

#define HOST_API_VERSION 16
#define HOST_MAX_INPUTS 16
#define HOST_MAX_DIMS 16

static const OrtApi* api;

/* End with onnxruntime's message, on one line, when `status` is an error. */
static void check(OrtStatus* status, const char* what) {
  if (status == NULL) return;
  char message[1024];
  snprintf(message, sizeof message, "%s", api->GetErrorMessage(status));
  for (char* c = message; *c; ++c)
    if (*c == '\n' || *c == '\r') *c = ' ';
  fprintf(stderr, "deploy-ort-host: %s: %s\n", what, message);
  exit(1);
}

static size_t elem_bytes(int elem) {
  switch (elem) {
    case 2: case 3: return 1;              /* uint8, int8 */
    case 4: case 5: case 10: return 2;     /* uint16, int16, float16 */
    case 1: case 6: case 12: return 4;     /* float, int32, uint32 */
    case 7: case 11: case 13: return 8;    /* int64, double, uint64 */
    default: return 0;
  }
}

static void* read_file(const char* path, size_t bytes) {
  FILE* f = fopen(path, "rb");
  void* data = malloc(bytes ? bytes : 1);
  if (f == NULL || data == NULL || fread(data, 1, bytes, f) != bytes || fgetc(f) != EOF) {
    fprintf(stderr, "deploy-ort-host: %s: cannot read exactly %zu bytes\n", path, bytes);
    exit(2);
  }
  fclose(f);
  return data;
}

int main(int argc, char** argv) {
  if (argc < 5 || argc - 5 > HOST_MAX_INPUTS) {
    fprintf(stderr, "usage: deploy-ort-host LIBONNXRUNTIME MODEL PLUGIN OUTDIR NAME=ELEM:DIMS:FILE ...\n");
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  const OrtApiBase* (*get_base)(void) = library ? (const OrtApiBase* (*)(void))dlsym(library, "OrtGetApiBase") : NULL;
  if (get_base == NULL) {
    fprintf(stderr, "deploy-ort-host: %s: %s\n", argv[1], library ? "no OrtGetApiBase" : dlerror());
    return 1;
  }
  api = get_base()->GetApi(HOST_API_VERSION);
  if (api == NULL) {
    fprintf(stderr, "deploy-ort-host: onnxruntime %s is older than 1.16\n", get_base()->GetVersionString());
    return 1;
  }
  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  OrtSession* session = NULL;
  check(api->CreateEnv(ORT_LOGGING_LEVEL_FATAL, "deploy", &env), "creating the environment");
  check(api->CreateSessionOptions(&options), "session options");
  /* Short of layout transforms, as the Python run (onnxruntime.py, run_model): the reference runs
   * each standard node alone, and x86's NCHWc MaxPool treats a window's NaN unlike the plain one. */
  check(api->SetSessionGraphOptimizationLevel(options, ORT_ENABLE_EXTENDED), "optimization level");
  check(api->RegisterCustomOpsLibrary_V2(options, argv[3]), "registering the plugin");
  check(api->CreateSession(env, argv[2], options, &session), "creating the session");

  OrtMemoryInfo* memory = NULL;
  check(api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &memory), "memory info");
  int inputs = argc - 5;
  const char* names[HOST_MAX_INPUTS];
  OrtValue* values[HOST_MAX_INPUTS];
  for (int i = 0; i < inputs; ++i) {
    char* spec = argv[5 + i];
    char* equals = strchr(spec, '=');
    char* colon = equals ? strchr(equals + 1, ':') : NULL;
    char* file = colon ? strchr(colon + 1, ':') : NULL;
    if (file == NULL) {
      fprintf(stderr, "deploy-ort-host: input %s: expected NAME=ELEM:D0xD1x...:FILE\n", spec);
      return 2;
    }
    *equals = *colon = *file = 0;
    int elem = atoi(equals + 1);
    int64_t dims[HOST_MAX_DIMS];
    size_t rank = 0, count = 1;
    for (char* dim = colon + 1; *dim && rank < HOST_MAX_DIMS; ++rank) {
      dims[rank] = strtoll(dim, &dim, 10);
      count *= (size_t)dims[rank];
      if (*dim == 'x') ++dim;
    }
    size_t bytes = count * elem_bytes(elem);
    void* data = read_file(file + 1, bytes);
    names[i] = spec;
    values[i] = NULL;
    check(api->CreateTensorWithDataAsOrtValue(memory, data, bytes, dims, rank,
                                              (ONNXTensorElementDataType)elem, &values[i]),
          spec);
  }

  size_t outputs = 0;
  OrtAllocator* allocator = NULL;
  check(api->GetAllocatorWithDefaultOptions(&allocator), "allocator");
  check(api->SessionGetOutputCount(session, &outputs), "outputs");
  char** output_names = calloc(outputs, sizeof *output_names);
  OrtValue** results = calloc(outputs, sizeof *results);
  for (size_t o = 0; o < outputs; ++o)
    check(api->SessionGetOutputName(session, o, allocator, &output_names[o]), "output names");
  check(api->Run(session, NULL, names, (const OrtValue* const*)values, (size_t)inputs,
                 (const char* const*)output_names, outputs, results),
        "running the model");

  for (size_t o = 0; o < outputs; ++o) {
    OrtTensorTypeAndShapeInfo* shape = NULL;
    ONNXTensorElementDataType elem;
    size_t rank = 0, count = 0;
    int64_t dims[HOST_MAX_DIMS];
    void* data = NULL;
    check(api->GetTensorTypeAndShape(results[o], &shape), "output shape");
    check(api->GetTensorElementType(shape, &elem), "output type");
    check(api->GetDimensionsCount(shape, &rank), "output rank");
    if (rank > HOST_MAX_DIMS) rank = HOST_MAX_DIMS;
    check(api->GetDimensions(shape, dims, rank), "output dims");
    check(api->GetTensorShapeElementCount(shape, &count), "output size");
    check(api->GetTensorMutableData(results[o], &data), "output data");
    char path[4096];
    snprintf(path, sizeof path, "%s/%zu.bin", argv[4], o);
    FILE* f = fopen(path, "wb");
    if (f == NULL || fwrite(data, elem_bytes(elem), count, f) != count || fclose(f) != 0) {
      fprintf(stderr, "deploy-ort-host: cannot write %s\n", path);
      return 1;
    }
    printf("%zu %d ", o, (int)elem);
    for (size_t d = 0; d < rank; ++d) printf(d ? "x%lld" : "%lld", (long long)dims[d]);
    printf("\n");
    api->ReleaseTensorTypeAndShapeInfo(shape);
  }
  return 0;
}
