// deploy's ExecuTorch host: runs a .pte's `forward` on raw input files, writes raw outputs.
//
//   executorch-host MODEL.pte -i IN0 [-i IN1 ...] -o OUT0 [-o OUT1 ...] [--threads T] [--repeat N]
//
// --threads T sizes ExecuTorch's threadpool, which runs the parallel loops of ExecuTorch's kernels
// that have one and all of deploy's kernels' (default: ExecuTorch's own size). --repeat N times N
// `forward` calls after one untimed warm-up call and prints `forward: N runs on T threads: median
// M ms (min A, max B)`.
//
// Each input file holds one input's bytes, C order, of the dtype and shape the program declares
// (checked against its size); each output is written the same way, and described on stdout as
// `output I DTYPE D0xD1...` (ExecuTorch's ScalarType number). Linked with -Wl,--no-as-needed
// against the wheel's libexecutorch (runtime, Module), its kernels and the kernel libraries of
// deploy's ops, whose static registration is what serves their nodes. Errors are one line on
// stderr: exit 2 for a bad command line or file, 1 when loading or running the program fails,
// with the first error ExecuTorch logged (a deploy kernel's own reason where one failed); its
// other log lines are dropped.
#include <executorch/extension/module/module.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/platform/platform.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

// ExecuTorch's threadpool (libexecutorch_threadpool), whose header the wheel does not ship: the
// two members used here, as executorch/extension/threadpool/threadpool.h declares them.
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  size_t get_thread_count() const;
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::extension::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

namespace {

constexpr size_t kAlign = 64;  // the most any bundle asks (DEPLOY_ALIGNMENT)
constexpr long kMostThreads = 1024;
constexpr long kMostRuns = 1000000;

std::string first_error;  // the first error ExecuTorch logged; a deploy kernel's replaces another's

// ExecuTorch's log: errors kept for the one line a failure prints, the rest (CPU probing) dropped.
void on_log(et_timestamp_t, et_pal_log_level_t level, const char*, const char*, size_t, const char* message,
            size_t length) {
  if (level != kError && level != kFatal) return;
  std::string text(message, length);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  bool ours = text.rfind("deploy::", 0) == 0;
  if (first_error.empty() || (ours && first_error.rfind("deploy::", 0) != 0)) first_error = text;
}

// The failure's one line: what failed, then why (ExecuTorch's first error, else its code).
int failed(const char* model, const char* what, Error error) {
  std::string why = first_error.empty() ? "error " + std::to_string(static_cast<unsigned>(error)) : first_error;
  std::fprintf(stderr, "executorch-host: %s: %s failed: %s\n", model, what, why.c_str());
  return 1;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "executorch-host: %s\n", message.c_str());
  return 2;
}

// One input: its bytes (aligned), and the shape arrays its TensorImpl points into.
struct Input {
  std::unique_ptr<void, decltype(&std::free)> data{nullptr, &std::free};
  std::vector<TensorImpl::SizesType> sizes;
  std::vector<TensorImpl::DimOrderType> dim_order;
  std::vector<TensorImpl::StridesType> strides;
  std::unique_ptr<TensorImpl> impl;
};

// Reads `path` into `in`, which must hold exactly `nbytes`; an error message, or "".
std::string read_input(const char* path, size_t nbytes, Input& in) {
  in.data.reset(std::aligned_alloc(kAlign, (nbytes + kAlign - 1) / kAlign * kAlign + kAlign));
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return std::string("cannot open input ") + path;
  size_t got = std::fread(in.data.get(), 1, nbytes + 1, f);
  std::fclose(f);
  if (got != nbytes) {
    std::string held = got > nbytes ? "more than " + std::to_string(nbytes) : std::to_string(got);
    return std::string("input ") + path + " holds " + held + " bytes, expected " + std::to_string(nbytes);
  }
  return "";
}

// The count `text` of option `option`, 1 to `most`; -1 (its one line printed) otherwise.
long count_option(const char* option, const char* text, long most) {
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < 1 || value > most) {
    usage_error(std::string(option) + " " + text + ": expected a count from 1 to " + std::to_string(most));
    return -1;
  }
  return value;
}

// The median, least and most of `ms` (sorted here), as the --repeat line says them.
void print_times(std::vector<double>& ms, size_t threads) {
  std::sort(ms.begin(), ms.end());
  size_t n = ms.size();
  double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  std::printf("forward: %zu runs on %zu threads: median %.4f ms (min %.4f, max %.4f)\n", n, threads, median,
              ms.front(), ms.back());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    return usage_error("usage: executorch-host MODEL.pte -i IN ... -o OUT ... [--threads T] [--repeat N]");
  }
  std::vector<const char*> ins, outs;
  long threads = 0, repeat = 0;  // 0: not given
  for (int i = 2; i < argc; i += 2) {
    bool file = std::strcmp(argv[i], "-i") == 0 || std::strcmp(argv[i], "-o") == 0;
    bool threads_given = std::strcmp(argv[i], "--threads") == 0;
    if (i + 1 >= argc || !(file || threads_given || std::strcmp(argv[i], "--repeat") == 0)) {
      return usage_error(std::string("argument ") + argv[i] +
                         ": expected -i FILE, -o FILE, --threads T or --repeat N");
    }
    if (file) {
      (argv[i][1] == 'i' ? ins : outs).push_back(argv[i + 1]);
      continue;
    }
    long& value = threads_given ? threads : repeat;
    value = count_option(argv[i], argv[i + 1], threads_given ? kMostThreads : kMostRuns);
    if (value < 0) return 2;
  }
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(on_log, __FILE__));
  auto* pool = executorch::extension::threadpool::get_threadpool();
  if (threads > 0 && !pool->_unsafe_reset_threadpool(static_cast<uint32_t>(threads))) {
    std::fprintf(stderr, "executorch-host: cannot make a threadpool of %ld threads\n", threads);
    return 1;
  }
  Module module(argv[1], Module::LoadMode::File);
  auto meta = module.method_meta("forward");
  if (!meta.ok()) return failed(argv[1], "loading its forward method", meta.error());
  if (meta->num_inputs() != ins.size()) {
    return usage_error(std::to_string(ins.size()) + " inputs given, " + argv[1] + "'s forward takes " +
                       std::to_string(meta->num_inputs()));
  }
  std::vector<Input> inputs(ins.size());
  std::vector<EValue> values;
  for (size_t i = 0; i < ins.size(); ++i) {
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) return usage_error("input " + std::to_string(i) + " is no tensor");
    Input& in = inputs[i];
    std::string problem = read_input(ins[i], info->nbytes(), in);
    if (!problem.empty()) return usage_error(problem);
    auto sizes = info->sizes();
    in.sizes.assign(sizes.begin(), sizes.end());
    in.dim_order.resize(sizes.size());
    in.strides.resize(sizes.size());
    for (size_t k = sizes.size(); k-- > 0;) {  // C order
      in.dim_order[k] = static_cast<TensorImpl::DimOrderType>(k);
      in.strides[k] = k + 1 == sizes.size() ? 1 : in.strides[k + 1] * in.sizes[k + 1];
    }
    in.impl = std::make_unique<TensorImpl>(info->scalar_type(), static_cast<ssize_t>(sizes.size()),
                                           in.sizes.data(), in.data.get(), in.dim_order.data(),
                                           in.strides.data());
    values.emplace_back(Tensor(in.impl.get()));
  }
  auto result = module.forward(values);  // the warm-up call when timed
  if (!result.ok()) return failed(argv[1], "forward", result.error());
  std::vector<double> ms;
  for (long r = 0; r < repeat; ++r) {
    auto start = std::chrono::steady_clock::now();
    auto again = module.forward(values);  // into the same planned outputs as the first call's
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (!again.ok()) return failed(argv[1], "forward", again.error());
  }
  if (repeat > 0) print_times(ms, pool->get_thread_count());
  if (result->size() != outs.size()) {
    return usage_error(std::to_string(outs.size()) + " outputs given, forward returned " +
                       std::to_string(result->size()));
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!(*result)[i].isTensor()) return usage_error("output " + std::to_string(i) + " is no tensor");
    const Tensor& t = (*result)[i].toTensor();
    FILE* f = std::fopen(outs[i], "wb");
    bool written = f != nullptr && std::fwrite(t.const_data_ptr(), 1, t.nbytes(), f) == t.nbytes();
    if (f != nullptr && std::fclose(f) != 0) written = false;
    if (!written) {
      std::fprintf(stderr, "executorch-host: cannot write output %s\n", outs[i]);
      return 1;
    }
    std::printf("output %zu %d ", i, static_cast<int>(t.scalar_type()));
    for (ssize_t k = 0; k < t.dim(); ++k) std::printf(k ? "x%d" : "%d", static_cast<int>(t.size(k)));
    std::printf("\n");
  }
  return 0;
}
