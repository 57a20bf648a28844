// What an op bundle was built for, shared by its shim (bundle.cc) and its runner (run.cc).
//
// deploy generates `bundle_signature.h` per bundle (found on the include path): the op's name,
// the sha256 of its module.so and one TensorSpec per input, then the output, in call order.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

namespace deploy {

struct TensorSpec {
  const char* name;
  DLDataType dtype;
  std::vector<int64_t> shape;
};

// "float32", "int8", ... as numpy and the manifest name them.
inline std::string DtypeText(DLDataType dtype) {
  const char* kind = dtype.code == kDLFloat ? "float" : dtype.code == kDLInt ? "int"
                     : dtype.code == kDLUInt ? "uint" : dtype.code == kDLBool ? "bool" : "code";
  std::string text = kind + std::to_string(dtype.bits);
  return dtype.lanes == 1 ? text : text + "x" + std::to_string(dtype.lanes);
}

inline std::string ShapeText(const int64_t* shape, int ndim) {
  std::string text = "[";
  for (int i = 0; i < ndim; ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

inline bool SameDtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

inline int64_t NumBytes(const TensorSpec& spec) {
  int64_t count = 1;
  for (int64_t dim : spec.shape) count *= dim;
  return count * ((spec.dtype.bits * spec.dtype.lanes + 7) / 8);
}

}  // namespace deploy

#include "bundle_signature.h"
