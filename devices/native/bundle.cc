// The shim of an op bundle (libOP.so): plain C functions over the TVM FFI, so that C code (an
// inference engine's custom kernel) calls a deploy-built op without knowing TVM.
//
//   int deploy_OP(const DLTensor* in0, ..., DLTensor* out);      0, or -1 and a last error
//   int deploy_OP_run(DLTensor* const* args, int num_args);      inputs, then the output
//   const char* deploy_OP_last_error(void);                      of this thread's last failed call
//
// On the first call it loads module.so from its own directory, after checking the file's sha256
// against the one it was built with (a tampered module is refused on the device). Every tensor is
// checked against the signature it was built for (bundle_signature.h): dtype, shape, CPU memory,
// C order, 64-byte alignment (TVM's kernels use aligned vector loads on that assumption). A bad
// tensor or a failing kernel is a one-line error, never a crash or an exception across the C API.
#include <dlfcn.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include "bundle.h"
#include "sha256.h"
#include DEPLOY_HEADER

namespace {

using tvm::ffi::Function;

constexpr uintptr_t kAlignment = 64;  // tvm::runtime::kAllocAlignment
constexpr int kNumInputs = deploy::kNumTensors - 1;

thread_local std::string last_error;
std::mutex load_mutex;
tvm::ffi::Optional<Function> main_function;  // set once module.so is loaded

int Fail(const std::string& message) {
  last_error = std::string("deploy_") + deploy::kOp + ": " + message;
  return -1;
}

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// module.so beside this library, checked and loaded once; its `main` in `*out`.
bool LoadMain(Function* out, std::string* error) {
  std::lock_guard<std::mutex> lock(load_mutex);
  if (!main_function.has_value()) {
    Dl_info self;
    if (dladdr(reinterpret_cast<void*>(&LoadMain), &self) == 0 || self.dli_fname == nullptr) {
      *error = "cannot find the directory of " + std::string(deploy::kLibrary);
      return false;
    }
    std::string library = self.dli_fname;
    std::string directory = library.substr(0, library.rfind('/') + 1);
    std::string path = directory + "module.so";
    std::string digest = deploy::Sha256File(path);
    if (digest.empty()) {
      *error = "cannot read " + path;
      return false;
    }
    if (digest != deploy::kModuleSha256) {
      *error = path + " has sha256 " + digest.substr(0, 16) + "..., " + deploy::kLibrary +
               " was built for " + std::string(deploy::kModuleSha256).substr(0, 16) +
               "...: the bundle was modified";
      return false;
    }
    // module.so calls into the TVM runtime libraries without linking them (TVM exports modules
    // so): make the ones this shim links visible to it, also where an engine dlopen()ed the shim
    // RTLD_LOCAL, or the first error a kernel raised would be an undefined symbol, and the end.
    for (const char* runtime : deploy::kRuntimeLibraries) {
      dlopen((directory + runtime).c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
    }
    try {
      main_function = tvm::ffi::Module::LoadFromFile(path)->GetFunction("main", false);
    } catch (const std::exception& exc) {
      *error = "cannot load " + path + ": " + FirstLine(exc.what());
      return false;
    }
    if (!main_function.has_value()) {
      *error = path + " has no function main";
      return false;
    }
  }
  *out = main_function.value();
  return true;
}

// Check `given` against `spec`; `*folded` is the same tensor as the kernel wants it: byte_offset
// folded into data, strides dropped (C order checked, size-1 dims may have any stride).
std::string CheckTensor(const DLTensor* given, const deploy::TensorSpec& spec, DLTensor* folded) {
  std::string name = spec.name;
  if (given == nullptr) return name + " is NULL";
  if (given->data == nullptr) return name + ".data is NULL";
  if (given->device.device_type != kDLCPU) {
    return name + " is on device type " + std::to_string(given->device.device_type) +
           ": this bundle runs on the CPU (kDLCPU)";
  }
  if (!deploy::SameDtype(given->dtype, spec.dtype)) {
    return name + " is " + deploy::DtypeText(given->dtype) + ", expected " + deploy::DtypeText(spec.dtype);
  }
  int ndim = static_cast<int>(spec.shape.size());
  std::string expected_shape = ", expected " + deploy::ShapeText(spec.shape.data(), ndim);
  if (given->ndim != ndim) {  // its shape is not read: ndim may be anything, past the array it has
    std::string dims = std::to_string(given->ndim) + (given->ndim == 1 ? " dim" : " dims");
    return name + " has " + dims + expected_shape;
  }
  if (ndim > 0 && given->shape == nullptr) return name + ".shape is NULL" + expected_shape;
  for (int i = 0; i < ndim; ++i) {
    if (given->shape[i] != spec.shape[i]) {
      return name + " has shape " + deploy::ShapeText(given->shape, ndim) + expected_shape;
    }
  }
  if (given->strides != nullptr) {
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (spec.shape[i] != 1 && given->strides[i] != expected) return name + " is not compact (C order)";
      expected *= spec.shape[i];
    }
  }
  *folded = *given;
  folded->data = static_cast<char*>(given->data) + given->byte_offset;
  folded->byte_offset = 0;
  folded->strides = nullptr;
  if (reinterpret_cast<uintptr_t>(folded->data) % kAlignment != 0) {
    return name + ".data + byte_offset is not " + std::to_string(kAlignment) + "-byte aligned";
  }
  return "";
}

int Call(const DLTensor* const* args) {
  try {
    Function main;
    std::string error;
    if (!LoadMain(&main, &error)) return Fail(error);
    DLTensor folded[deploy::kNumTensors];
    std::vector<tvm::ffi::AnyView> packed;
    for (int i = 0; i < deploy::kNumTensors; ++i) {
      error = CheckTensor(args[i], deploy::kTensors[i], &folded[i]);
      if (!error.empty()) return Fail(error);
      packed.emplace_back(&folded[i]);
    }
    tvm::ffi::Any result;
    main.CallPacked(packed.data(), deploy::kNumTensors, &result);
  } catch (const std::exception& exc) {
    return Fail(FirstLine(exc.what()));
  } catch (...) {
    return Fail("unknown exception");
  }
  return 0;
}

}  // namespace

extern "C" {

int DEPLOY_FUNCTION(DEPLOY_PARAMS) {
  const DLTensor* args[] = {DEPLOY_ARGS};
  return Call(args);
}

int DEPLOY_RUN(DLTensor* const* args, int num_args) {
  if (args == nullptr) return Fail("args is NULL: expected an array of the inputs and the output");
  if (num_args != deploy::kNumTensors) {
    return Fail("expected " + std::to_string(kNumInputs) + " inputs and the output (" +
                std::to_string(deploy::kNumTensors) + " tensors), got " + std::to_string(num_args));
  }
  return Call(args);
}

const char* DEPLOY_LAST_ERROR(void) { return last_error.c_str(); }

}  // extern "C"
