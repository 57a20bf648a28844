/* An onnxruntime custom-op library over deploy's bundles (deploy build --engine onnxruntime).
 *
 * onnxruntime calls RegisterCustomOps(options, api_base), the library's only global symbol: one
 * OrtCustomOp per (domain, op type) of the table (plugin_table.h, generated), each serving the
 * nodes the library was built for. Nothing of onnxruntime is linked: its API comes from api_base.
 * A node is matched by its first output's name (unique in a graph; NULL in the table: any node,
 * for an --op build), then checked when the session is created: its attributes and, where the
 * model knows them, its input and output types and shapes; a node built for nothing, or for
 * other shapes or attributes, fails session creation with one line naming it. Each run checks
 * the shapes again (a symbolic dim is only known then) and calls the node's bundle on
 * onnxruntime's buffers, wrapped as DLTensors.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlpack/dlpack.h"
#include "onnxruntime_c_api.h"

#define PLUGIN_API_VERSION 16 /* CreateKernelV2/KernelComputeV2: onnxruntime 1.16 and later */
#define PLUGIN_MAX_DIMS 16    /* DEPLOY_MAX_DIMS */
#define PLUGIN_MESSAGE 512

typedef struct {
  int64_t size; /* >= 0: this size; -1: symbolic, equal to input `input`'s dim `axis` */
  int input;
  int axis;
} PluginDim;

typedef struct {
  int elem; /* ONNXTensorElementDataType */
  uint8_t code, bits;
  int rank;
  PluginDim dims[PLUGIN_MAX_DIMS];
} PluginTensor;

enum { PLUGIN_INT, PLUGIN_FLOAT, PLUGIN_INTS, PLUGIN_FLOATS, PLUGIN_STRING };

typedef struct {
  const char* name;
  int kind;
  int absent_ok; /* a node without it means the same (its value is ONNX's default) */
  int count;     /* of a list */
  const int64_t* ints;
  const float* floats;
  const char* text;
} PluginAttr;

/* A bundle's parallel-for hook types (NAME_task, NAME_parallel_for: docs/bundles.md). */
typedef int (*plugin_task)(int index, void* context);
typedef int (*plugin_parallel_for)(void* user, plugin_task task, void* context, int count);

typedef struct {
  const char* output; /* the node's first output, NULL: any node of its type */
  const char* label;  /* how messages name it */
  int (*run)(DLTensor* const* args, int num_args);
  const char* (*last_error)(void);
  plugin_parallel_for (*set_parallel_for)(plugin_parallel_for fn, void* user);
  const PluginTensor* tensors; /* its inputs, then its outputs */
  const PluginAttr* attrs;
  int num_attrs;
} PluginNode;

typedef struct {
  OrtCustomOp op; /* first: onnxruntime's OrtCustomOp* is this type's */
  const char* domain;
  const char* op_type;
  int num_inputs, num_outputs;
  int input_elem, output_elem; /* ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED where nodes differ */
  const PluginNode* nodes;
  int num_nodes;
} PluginType;

typedef struct {
  const OrtApi* api;
  const PluginType* type;
  const PluginNode* node;
} PluginKernel;

#include "plugin_table.h"

/* An error status carrying one line, printf-formatted. */
static OrtStatus* fail(const OrtApi* api, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static OrtStatus* fail(const OrtApi* api, const char* fmt, ...) {
  char message[PLUGIN_MESSAGE];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  return api->CreateStatus(ORT_FAIL, message);
}

static const char* op_name(const OrtCustomOp* op) { return ((const PluginType*)op)->op_type; }
static const char* op_provider(const OrtCustomOp* op) {
  (void)op;
  return "CPUExecutionProvider";
}
static ONNXTensorElementDataType input_type(const OrtCustomOp* op, size_t i) {
  (void)i;
  return (ONNXTensorElementDataType)((const PluginType*)op)->input_elem;
}
static size_t input_count(const OrtCustomOp* op) { return (size_t)((const PluginType*)op)->num_inputs; }
static ONNXTensorElementDataType output_type(const OrtCustomOp* op, size_t i) {
  (void)i;
  return (ONNXTensorElementDataType)((const PluginType*)op)->output_elem;
}
static size_t output_count(const OrtCustomOp* op) { return (size_t)((const PluginType*)op)->num_outputs; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp* op, size_t i) {
  (void)op, (void)i;
  return INPUT_OUTPUT_REQUIRED;
}
static OrtMemType cpu_memory(const OrtCustomOp* op, size_t i) {
  (void)op, (void)i;
  return OrtMemTypeDefault;
}
static int one(const OrtCustomOp* op) {
  (void)op;
  return 1;
}
static void destroy(void* kernel) { free(kernel); }

/* Whether the node's attribute `a` has the value the kernel was built with: "" when it does,
 * else why not. */
static const char* attr_problem(const OrtApi* api, const OrtKernelInfo* info, const PluginAttr* a) {
  OrtStatus* status = NULL;
  int same = 1;
  if (a->kind == PLUGIN_INT) {
    int64_t value = 0;
    status = api->KernelInfoGetAttribute_int64(info, a->name, &value);
    same = status == NULL && value == a->ints[0];
  } else if (a->kind == PLUGIN_FLOAT) {
    float value = 0;
    status = api->KernelInfoGetAttribute_float(info, a->name, &value);
    same = status == NULL && memcmp(&value, a->floats, sizeof value) == 0;
  } else if (a->kind == PLUGIN_INTS || a->kind == PLUGIN_FLOATS) {
    size_t count = 0;
    int ints = a->kind == PLUGIN_INTS;
    status = ints ? api->KernelInfoGetAttributeArray_int64(info, a->name, NULL, &count)
                  : api->KernelInfoGetAttributeArray_float(info, a->name, NULL, &count);
    same = status == NULL && count == (size_t)a->count;
    if (same && count > 0) {
      int64_t values[64];
      if (count > 64) return "is a longer list than any deploy op takes";
      status = ints ? api->KernelInfoGetAttributeArray_int64(info, a->name, values, &count)
                    : api->KernelInfoGetAttributeArray_float(info, a->name, (float*)values, &count);
      same = status == NULL && memcmp(values, ints ? (const void*)a->ints : (const void*)a->floats,
                                      count * (ints ? sizeof(int64_t) : sizeof(float))) == 0;
    }
  } else {
    char value[256];
    size_t size = sizeof value;
    status = api->KernelInfoGetAttribute_string(info, a->name, value, &size);
    same = status == NULL && strcmp(value, a->text) == 0;
  }
  if (status != NULL) { /* absent (or of another kind) */
    api->ReleaseStatus(status);
    return a->absent_ok ? "" : "is absent or of another type";
  }
  return same ? "" : "has another value";
}

/* The problem with a tensor of `rank` dims `dims` (-1: unknown) and element type `elem` against
 * `want`, or NULL; `inputs`: the node's input dims where known, for symbolic dims. */
static const char* tensor_problem(const PluginTensor* want, int elem, size_t rank, const int64_t* dims,
                                  const int64_t (*inputs)[PLUGIN_MAX_DIMS]) {
  if (elem != want->elem) return "element type";
  if (rank != (size_t)want->rank) return "rank";
  for (size_t d = 0; d < rank; ++d) {
    const PluginDim* w = &want->dims[d];
    int64_t expect = w->size >= 0 ? w->size : (inputs ? inputs[w->input][w->axis] : -1);
    if (dims[d] >= 0 && expect >= 0 && dims[d] != expect) return "shape";
  }
  return NULL;
}

/* ---- the bundles' parallel loops on onnxruntime's intra-op threads ----
 * Each bundle's hook (NAME_set_parallel_for) is set once to engine_parallel_for, which hands a
 * loop's tasks to KernelContext_ParallelFor (API 17, onnxruntime 1.17) of the node this thread is
 * computing: the session's intra_op_num_threads is the kernels' too, and no thread of deploy's own
 * pool is started. Without API 17, or outside a compute, the tasks run on the calling thread. */

static const OrtApi* parallel_api; /* API 17, or NULL: tasks run serially */
static _Thread_local OrtKernelContext* computing;

typedef struct {
  plugin_task task;
  void* context;
  _Atomic int failed;
} PluginLoop;

static void loop_task(void* data, size_t index) {
  PluginLoop* loop = data;
  if (loop->task((int)index, loop->context) != 0) loop->failed = 1;
}

static int engine_parallel_for(void* user, plugin_task task, void* context, int count) {
  (void)user;
  PluginLoop loop = {task, context, 0};
  OrtStatus* status = NULL;
  if (parallel_api != NULL && computing != NULL)
    status = parallel_api->KernelContext_ParallelFor(computing, loop_task, (size_t)count, 0, &loop);
  else
    for (int i = 0; i < count; ++i) loop_task(&loop, (size_t)i);
  if (status != NULL) {
    parallel_api->ReleaseStatus(status);
    return -1;
  }
  return loop.failed;
}

static OrtStatus* create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                void** kernel) {
  const PluginType* type = (const PluginType*)op;
  char output[256] = "", node_name[256] = "";
  size_t size = sizeof output;
  OrtStatus* status = api->KernelInfo_GetOutputName(info, 0, output, &size);
  if (status != NULL) api->ReleaseStatus(status), output[0] = 0;
  size = sizeof node_name;
  status = api->KernelInfo_GetNodeName(info, node_name, &size);
  if (status != NULL) api->ReleaseStatus(status), node_name[0] = 0;
  const PluginNode* node = NULL;
  for (int i = 0; i < type->num_nodes && node == NULL; ++i)
    if (type->nodes[i].output == NULL || strcmp(type->nodes[i].output, output) == 0) node = &type->nodes[i];
  char who[PLUGIN_MESSAGE]; /* how messages name the node: as onnxruntime knows it */
  snprintf(who, sizeof who, "node '%s' (%s::%s)", node_name, type->domain, type->op_type);
  if (node == NULL)
    return fail(api, "%s: this deploy plugin was not built for it (rebuild it with this model)", who);
  for (int i = 0; i < node->num_attrs; ++i) {
    const char* problem = attr_problem(api, info, &node->attrs[i]);
    if (*problem)
      return fail(api, "%s: attribute %s %s, not what the plugin was built for (rebuild it with this model)",
                  who, node->attrs[i].name, problem);
  }
  for (int i = 0; i < type->num_inputs + type->num_outputs; ++i) {
    OrtTypeInfo* info_type = NULL;
    int is_input = i < type->num_inputs;
    size_t index = (size_t)(is_input ? i : i - type->num_inputs);
    status = is_input ? api->KernelInfo_GetInputTypeInfo(info, index, &info_type)
                      : api->KernelInfo_GetOutputTypeInfo(info, index, &info_type);
    const OrtTensorTypeAndShapeInfo* tensor = NULL;
    if (status == NULL) status = api->CastTypeInfoToTensorInfo(info_type, &tensor);
    ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    size_t rank = 0;
    int64_t dims[PLUGIN_MAX_DIMS];
    if (status == NULL && tensor != NULL) status = api->GetTensorElementType(tensor, &elem);
    if (status == NULL && tensor != NULL) status = api->GetDimensionsCount(tensor, &rank);
    const char* problem = NULL;
    if (status == NULL && tensor != NULL && rank == 0 && node->tensors[i].rank > 0) {
      /* no shape: onnxruntime infers none after a custom node; checked when the node runs */
    } else if (status == NULL && tensor != NULL && rank <= PLUGIN_MAX_DIMS) {
      status = api->GetDimensions(tensor, dims, rank);
      if (status == NULL) problem = tensor_problem(&node->tensors[i], elem, rank, dims, NULL);
    } else if (status == NULL && tensor != NULL) {
      problem = "rank";
    }
    if (status != NULL) api->ReleaseStatus(status), status = NULL; /* not known until it runs */
    if (info_type != NULL) api->ReleaseTypeInfo(info_type);
    if (problem != NULL)
      return fail(api, "%s: the %s of %s %zu is not what the plugin was built for (rebuild it with this model)",
                  who, problem, is_input ? "input" : "output", index);
  }
  PluginKernel* made = malloc(sizeof *made);
  if (made == NULL) return api->CreateStatus(ORT_FAIL, "deploy plugin: out of memory");
  made->api = api, made->type = type, made->node = node;
  *kernel = made;
  return NULL;
}

static OrtStatus* compute(void* opaque, OrtKernelContext* context) {
  const PluginKernel* kernel = opaque;
  const OrtApi* api = kernel->api;
  const PluginNode* node = kernel->node;
  int inputs = kernel->type->num_inputs, count = inputs + kernel->type->num_outputs;
  int64_t dims[2 * PLUGIN_MAX_DIMS][PLUGIN_MAX_DIMS];
  DLTensor tensors[2 * PLUGIN_MAX_DIMS];
  DLTensor* args[2 * PLUGIN_MAX_DIMS];
  if (count > 2 * PLUGIN_MAX_DIMS) return fail(api, "%s: too many tensors", node->label);
  OrtStatus* status = NULL;
  for (int i = 0; i < count && status == NULL; ++i) {
    const PluginTensor* want = &node->tensors[i];
    OrtValue* value = NULL;
    if (i < inputs) {
      const OrtValue* given = NULL;
      status = api->KernelContext_GetInput(context, (size_t)i, &given);
      value = (OrtValue*)given; /* read only: the kernel takes its inputs as const */
      OrtTensorTypeAndShapeInfo* shape = NULL;
      ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      size_t rank = 0;
      if (status == NULL) status = api->GetTensorTypeAndShape(value, &shape);
      if (status == NULL) status = api->GetTensorElementType(shape, &elem);
      if (status == NULL) status = api->GetDimensionsCount(shape, &rank);
      if (status == NULL && rank > PLUGIN_MAX_DIMS) rank = PLUGIN_MAX_DIMS + 1;
      if (status == NULL && rank <= PLUGIN_MAX_DIMS) status = api->GetDimensions(shape, dims[i], rank);
      if (shape != NULL) api->ReleaseTensorTypeAndShapeInfo(shape);
      const char* problem = status == NULL ? tensor_problem(want, elem, rank, dims[i], dims) : NULL;
      if (problem != NULL)
        return fail(api, "%s: the %s of input %d is not what the plugin was built for", node->label, problem, i);
    } else {
      for (int d = 0; d < want->rank; ++d) {
        const PluginDim* w = &want->dims[d];
        dims[i][d] = w->size >= 0 ? w->size : dims[w->input][w->axis];
      }
      status = api->KernelContext_GetOutput(context, (size_t)(i - inputs), dims[i], (size_t)want->rank, &value);
    }
    void* data = NULL;
    if (status == NULL) status = api->GetTensorMutableData(value, &data);
    DLTensor t = {data, {kDLCPU, 0}, want->rank, {want->code, want->bits, 1}, dims[i], NULL, 0};
    tensors[i] = t;
    args[i] = &tensors[i];
  }
  if (status != NULL) return status;
  computing = context;
  int failed = node->run(args, count);
  computing = NULL;
  if (failed) return fail(api, "%s: %s", node->label, node->last_error());
  return NULL;
}

/* Each type's OrtCustomOp, filled once per process (onnxruntime reads them while sessions live). */
static pthread_once_t plugin_filled = PTHREAD_ONCE_INIT;

static void fill_ops(void) {
  for (int t = 0; t < PLUGIN_NUM_TYPES; ++t) {
    for (int n = 0; n < plugin_types[t].num_nodes; ++n) {
      plugin_types[t].nodes[n].set_parallel_for(engine_parallel_for, NULL);
    }
    OrtCustomOp* op = &plugin_types[t].op;
    memset(op, 0, sizeof *op);
    op->version = PLUGIN_API_VERSION;
    op->GetName = op_name;
    op->GetExecutionProviderType = op_provider;
    op->GetInputType = input_type;
    op->GetInputTypeCount = input_count;
    op->GetOutputType = output_type;
    op->GetOutputTypeCount = output_count;
    op->KernelDestroy = destroy;
    op->GetInputCharacteristic = required;
    op->GetOutputCharacteristic = required;
    op->GetInputMemoryType = cpu_memory;
    op->GetVariadicInputMinArity = one;
    op->GetVariadicOutputMinArity = one;
    op->CreateKernelV2 = create_kernel;
    op->KernelComputeV2 = compute;
  }
}

/* A custom-op domain per domain of the table, made for these session options (onnxruntime keeps
 * a pointer to each, not a copy: they stay for the process). */
__attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                   const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(PLUGIN_API_VERSION);
  if (api == NULL) { /* API 1 has CreateStatus: say it through that */
    const OrtApi* first = api_base->GetApi(1);
    char message[PLUGIN_MESSAGE];
    snprintf(message, sizeof message, "deploy plugin: onnxruntime %s is older than the 1.16 it needs",
             api_base->GetVersionString());
    return first ? first->CreateStatus(ORT_FAIL, message) : NULL;
  }
  parallel_api = api_base->GetApi(17);
  pthread_once(&plugin_filled, fill_ops);
  OrtCustomOpDomain* domains[PLUGIN_NUM_TYPES];
  for (int t = 0; t < PLUGIN_NUM_TYPES; ++t) {
    const PluginType* type = &plugin_types[t];
    OrtCustomOpDomain* domain = NULL;
    for (int u = 0; u < t && domain == NULL; ++u)
      if (strcmp(plugin_types[u].domain, type->domain) == 0) domain = domains[u];
    OrtStatus* status = NULL;
    if (domain == NULL) {
      status = api->CreateCustomOpDomain(type->domain, &domain);
      if (status == NULL) status = api->AddCustomOpDomain(options, domain);
    }
    if (status == NULL) status = api->CustomOpDomain_Add(domain, &type->op);
    if (status != NULL) return status;
    domains[t] = domain;
  }
  return NULL;
}
