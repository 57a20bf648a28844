// An ExecuTorch kernel library over deploy's bundles (deploy build --engine executorch).
//
// Each entry of the table (executorch_table.h, generated: the ops' names as escaped literals,
// their bundles' functions by the prefixes deploy made) is registered at load time as a boxed
// kernel `<namespace>::<op>.out`, whose arguments are the op's input tensors, the attributes its
// schema takes (keyword-only numbers and flags, None: the op's default), then its output tensor
// (`out`). The attributes are checked against those the bundle was built for. A call wraps ExecuTorch's tensors as DLTensors (no copy) and runs the bundle,
// which checks every dtype, shape and alignment against what it was built for. A bad tensor fails
// the kernel through ExecuTorch's error path: one logged line naming the op and the reason, and
// the context's InvalidArgument (Internal for a failing kernel), which Method::execute returns.
// The bundles' parallel loops run on ExecuTorch's threadpool through the parallel_for its own
// kernels call (sized by the application), so the library starts no thread of its own.
#define ET_USE_THREADPOOL  // parallel_for from libexecutorch_threadpool, not the serial fallback
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#include <executorch/runtime/platform/log.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

#include "dlpack/dlpack.h"

namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::Span;

constexpr int kMaxDims = 16;  // DEPLOY_MAX_DIMS
constexpr int kMaxArgs = 16;

enum { kAttrFloat, kAttrInt, kAttrBool };

struct EtAttr {
  const char* name;
  int kind;         // kAttrFloat, kAttrInt or kAttrBool
  double value;     // what the bundle was built for
  double fallback;  // the op's default: what None means
};

typedef int (*EtTask)(int index, void* context);                          // NAME_task
typedef int (*EtParallelFor)(void* user, EtTask task, void* context, int count);  // NAME_parallel_for

struct EtOp {
  const char* name;  // "<namespace>::<op>.out", as ExecuTorch looks it up
  int (*run)(DLTensor* const* args, int num_args);
  const char* (*last_error)(void);
  EtParallelFor (*set_parallel_for)(EtParallelFor fn, void* user);
  int num_inputs;  // tensors; the bundle takes them, then the output
  const EtAttr* attrs;
  int num_attrs;
};

}  // namespace

#include "executorch_table.h"  // kEtOps[], DEPLOY_ET_FOR_EACH(X): X(i) for each entry

namespace {

// The DLPack dtype of an ExecuTorch scalar type; false for one no bundle takes.
bool dl_dtype(ScalarType type, DLDataType* out) {
  switch (type) {
    case ScalarType::Float: *out = {kDLFloat, 32, 1}; return true;
    case ScalarType::Double: *out = {kDLFloat, 64, 1}; return true;
    case ScalarType::Half: *out = {kDLFloat, 16, 1}; return true;
    case ScalarType::Char: *out = {kDLInt, 8, 1}; return true;
    case ScalarType::Short: *out = {kDLInt, 16, 1}; return true;
    case ScalarType::Int: *out = {kDLInt, 32, 1}; return true;
    case ScalarType::Long: *out = {kDLInt, 64, 1}; return true;
    case ScalarType::Byte: *out = {kDLUInt, 8, 1}; return true;
    case ScalarType::Bool: *out = {kDLBool, 8, 1}; return true;
    default: return false;
  }
}

// Fails the kernel: the reason logged in one line after the op's name, the context's error set.
void fail(KernelRuntimeContext& ctx, const EtOp& op, Error error, const char* reason) {
  ET_LOG(Error, "%s: %s", op.name, reason);
  ctx.fail(error);
}

// Whether the attribute `value` is a number or flag (None: the op's default), set in `got`.
bool attr_value(const EValue& value, const EtAttr& attr, double* got) {
  if (value.isNone()) {
    *got = attr.fallback;
  } else if (value.isDouble()) {
    *got = value.toDouble();
  } else if (value.isInt()) {
    *got = static_cast<double>(value.toInt());
  } else if (value.isBool()) {
    *got = value.toBool() ? 1.0 : 0.0;
  } else {
    return false;
  }
  return true;
}

// Runs entry `op` on the boxed arguments: its input tensors, its attributes, its output tensor,
// then (unused) the slot of the out variant's return value.
void run_op(const EtOp& op, KernelRuntimeContext& ctx, Span<EValue*> stack) {
  char reason[160];
  const int num_args = op.num_inputs + 1;  // the bundle's tensors
  const int expected = op.num_inputs + op.num_attrs + 1;
  if (static_cast<int>(stack.size()) < expected || num_args > kMaxArgs) {
    std::snprintf(reason, sizeof reason, "called with %d arguments, expected %d",
                  static_cast<int>(stack.size()), expected);
    return fail(ctx, op, Error::InvalidArgument, reason);
  }
  for (int j = 0; j < op.num_attrs; ++j) {
    const EtAttr& attr = op.attrs[j];
    double got = 0;
    if (!attr_value(*stack[op.num_inputs + j], attr, &got)) {
      std::snprintf(reason, sizeof reason, "attribute %s is no number", attr.name);
      return fail(ctx, op, Error::InvalidArgument, reason);
    }
    if (got != attr.value) {
      std::snprintf(reason, sizeof reason, "attribute %s is %.17g; the kernel was built for %.17g", attr.name,
                    got, attr.value);
      return fail(ctx, op, Error::InvalidArgument, reason);
    }
  }
  DLTensor tensors[kMaxArgs];
  DLTensor* args[kMaxArgs];
  int64_t shapes[kMaxArgs][kMaxDims];
  for (int i = 0; i < num_args; ++i) {
    const int slot = i < op.num_inputs ? i : op.num_inputs + op.num_attrs;  // the output after the attributes
    if (!stack[slot]->isTensor()) {
      std::snprintf(reason, sizeof reason, "argument %d is no tensor", i);
      return fail(ctx, op, Error::InvalidArgument, reason);
    }
    Tensor& t = stack[slot]->toTensor();
    DLTensor& d = tensors[i];
    if (!dl_dtype(t.scalar_type(), &d.dtype)) {
      std::snprintf(reason, sizeof reason, "argument %d has ExecuTorch dtype %d, which no bundle takes", i,
                    static_cast<int>(t.scalar_type()));
      return fail(ctx, op, Error::InvalidArgument, reason);
    }
    if (t.dim() > kMaxDims) {
      std::snprintf(reason, sizeof reason, "argument %d has %d dims, at most %d", i,
                    static_cast<int>(t.dim()), kMaxDims);
      return fail(ctx, op, Error::InvalidArgument, reason);
    }
    for (ssize_t k = 0; k < t.dim(); ++k) {
      if (t.dim_order()[k] != k) {  // a bundle reads C order only
        std::snprintf(reason, sizeof reason, "argument %d is not contiguous (dim order)", i);
        return fail(ctx, op, Error::InvalidArgument, reason);
      }
      shapes[i][k] = t.sizes()[k];
    }
    d.data = t.mutable_data_ptr();
    d.device = {kDLCPU, 0};
    d.ndim = static_cast<int32_t>(t.dim());
    d.shape = shapes[i];
    d.strides = nullptr;
    d.byte_offset = 0;
    args[i] = &d;
  }
  int code = op.run(args, num_args);
  if (code != 0) {  // the bundle's one-line reason: a bad tensor (-1), else its kernel failed
    return fail(ctx, op, code == -1 ? Error::InvalidArgument : Error::Internal, op.last_error());
  }
}

template <int I>
void boxed(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  run_op(kEtOps[I], ctx, stack);
}

// A bundle's parallel loop on ExecuTorch's threadpool: task(i) for i in [0, count) in a chunk per
// thread, the calling thread taking part (all on it under a NoThreadPoolGuard); nonzero when a
// task failed.
int on_threadpool(void*, EtTask task, void* context, int count) {
  std::atomic<int> failed{0};
  bool ran = executorch::extension::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (task(static_cast<int>(i), context) != 0) failed.store(1, std::memory_order_relaxed);
    }
  });
  return ran ? failed.load() : 1;
}

#define DEPLOY_ET_KERNEL(i) executorch::runtime::Kernel(kEtOps[i].name, boxed<i>),
const executorch::runtime::Kernel kKernels[] = {DEPLOY_ET_FOR_EACH(DEPLOY_ET_KERNEL)};

// The loops of every bundle on ExecuTorch's threads, then the kernels registered.
Error install() {
  for (const EtOp& op : kEtOps) op.set_parallel_for(on_threadpool, nullptr);
  return executorch::runtime::register_kernels({kKernels, sizeof kKernels / sizeof *kKernels});
}

// Done when the library is loaded (link it with -Wl,--no-as-needed, or dlopen it).
const Error kRegistered = install();

}  // namespace
