// deploy-run: run an op bundle on .npy files, on a device that has only libc and libstdc++.
//
//   deploy-run DIR -i a.npy [-i b.npy ...] -o out.npy
//
// Before loading anything it checks DIR/SHA256SUMS: every file listed must match, and the files it
// loads (libOP.so, module.so, lib/) must match the digests it was built with (bundle_pins.h), so
// a bundle whose SHA256SUMS was rewritten is refused too. Then it reads the inputs (.npy v1-v3,
// little-endian f2/f4/f8/i1/u1/i4/i8, C order), checks them against the op's signature
// (bundle_signature.h), calls deploy_OP_run from DIR/libOP.so and writes the output as .npy v1.
// Errors are one line on stderr: exit 2 for bad input or a modified bundle, 1 when the op fails.
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bundle.h"
#include "sha256.h"

namespace deploy {
struct PinnedFile {
  const char* path;
  const char* sha256;
};
}  // namespace deploy

#include "bundle_pins.h"

namespace {

using deploy::TensorSpec;

constexpr int kBadInput = 2;
constexpr int kFailed = 1;
constexpr int kNumInputs = deploy::kNumTensors - 1;
constexpr size_t kAlignment = 64;  // what the shim demands of tensor data
constexpr uint32_t kMaxHeader = 1 << 20;

[[noreturn]] void Exit(int code, const std::string& message) {
  std::fprintf(stderr, "deploy-run: %s\n", message.c_str());
  std::exit(code);
}

[[noreturn]] void Bad(const std::string& message) { Exit(kBadInput, message); }

struct Options {
  std::string dir;
  std::vector<std::string> inputs;
  std::string output;
};

Options ParseArgs(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-i" && i + 1 < argc) {
      opt.inputs.push_back(argv[++i]);
    } else if (arg == "-o" && i + 1 < argc) {
      opt.output = argv[++i];
    } else if (opt.dir.empty() && !arg.empty() && arg[0] != '-') {
      opt.dir = arg;
    } else {
      Bad("unexpected argument " + arg + " (usage: deploy-run DIR -i IN.npy ... -o OUT.npy)");
    }
  }
  if (opt.dir.empty() || opt.output.empty()) Bad("usage: deploy-run DIR -i IN.npy ... -o OUT.npy");
  return opt;
}

// Every file in DIR/SHA256SUMS matches it, and the pinned files are among them.
void VerifyBundle(const std::string& dir) {
  std::ifstream sums(dir + "/SHA256SUMS");
  if (!sums) Bad("cannot read " + dir + "/SHA256SUMS: not a bundle directory");
  std::map<std::string, std::string> listed;
  std::string line;
  while (std::getline(sums, line)) {
    if (line.size() < 67 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*')) {
      Bad(dir + "/SHA256SUMS has a malformed line: " + line.substr(0, 80));
    }
    std::string digest = line.substr(0, 64), path = line.substr(66);
    if (path[0] == '/' || path.find("..") != std::string::npos) {
      Bad(dir + "/SHA256SUMS names " + path + ", outside the bundle");
    }
    std::string actual = deploy::Sha256File(dir + "/" + path);
    if (actual.empty()) {
      Bad("cannot read " + dir + "/" + path + " as a file: the bundle is incomplete or modified");
    }
    if (actual != digest) Bad(dir + "/" + path + " does not match SHA256SUMS: the bundle was modified");
    listed[path] = digest;
  }
  for (const deploy::PinnedFile& pin : deploy::kPins) {
    auto found = listed.find(pin.path);
    if (found == listed.end()) Bad(dir + "/SHA256SUMS does not list " + pin.path);
    if (found->second != pin.sha256) {
      Bad(dir + "/" + pin.path + " is not the file this deploy-run was built with: the bundle was modified");
    }
  }
}

// numpy's dtype strings ("<f4") that deploy-run reads and writes, as DLPack dtypes.
const std::map<std::string, DLDataType>& Descrs() {
  static const std::map<std::string, DLDataType> descrs = {
      {"<f2", {kDLFloat, 16, 1}}, {"<f4", {kDLFloat, 32, 1}}, {"<f8", {kDLFloat, 64, 1}},
      {"|i1", {kDLInt, 8, 1}},    {"|u1", {kDLUInt, 8, 1}},   {"<i4", {kDLInt, 32, 1}},
      {"<i8", {kDLInt, 64, 1}}};
  return descrs;
}

// An aligned tensor buffer (the shim refuses unaligned data).
struct Buffer {
  std::unique_ptr<void, decltype(&std::free)> data{nullptr, &std::free};
  explicit Buffer(int64_t bytes) {
    size_t rounded = (static_cast<size_t>(bytes) / kAlignment + 1) * kAlignment;  // a multiple, never 0
    data.reset(std::aligned_alloc(kAlignment, rounded));
    if (!data) Exit(kFailed, "out of memory for " + std::to_string(bytes) + " bytes");
  }
};

// The fields of a .npy header dict ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
// padded with spaces to a newline), each value as written: numpy's three keys, each once, and
// nothing else. numpy refuses other keys and takes the last of a repeated one: a reader taking
// the first would read another array than numpy does from the same file.
std::map<std::string, std::string> HeaderFields(const std::string& header, const std::string& path) {
  auto malformed = [&](const std::string& why) { Bad(path + ": malformed .npy header (" + why + ")"); };
  auto skip = [&](size_t at) { return std::min(header.find_first_not_of(' ', at), header.size()); };
  std::map<std::string, std::string> fields;
  size_t at = skip(0);
  if (at == header.size() || header[at] != '{') malformed("no '{'");
  for (at = skip(at + 1); at < header.size() && header[at] != '}'; at = skip(at)) {
    if (header[at] != '\'') malformed("a key is not quoted");
    size_t close = header.find('\'', at + 1);
    if (close == std::string::npos) malformed("a key is not closed");
    std::string key = header.substr(at + 1, close - at - 1);
    if (key != "descr" && key != "fortran_order" && key != "shape") malformed("unexpected key '" + key + "'");
    if (fields.count(key)) malformed("'" + key + "' given twice");
    at = skip(close + 1);
    if (at == header.size() || header[at] != ':') malformed("no ':' after '" + key + "'");
    size_t start = skip(at + 1), end = start;
    int depth = 0;  // a value runs to the comma or brace that closes it: (4, 4) and [('x', '<f4')] are one
    for (bool quoted = false; end < header.size(); ++end) {
      char c = header[end];
      if (c == '\'') quoted = !quoted;
      if (quoted) continue;
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']') && depth > 0) --depth;
      if (depth == 0 && (c == ',' || c == '}')) break;
    }
    if (end == header.size()) malformed("'" + key + "' is not closed");
    size_t last = header.find_last_not_of(' ', end - 1);
    if (end == start || last < start) malformed("'" + key + "' has no value");
    fields[key] = header.substr(start, last + 1 - start);
    at = header[end] == ',' ? end + 1 : end;
  }
  if (at == header.size()) malformed("no '}'");
  if (header.find_first_not_of(" \n", at + 1) != std::string::npos) malformed("bytes after the dict");
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (!fields.count(key)) malformed(std::string("no '") + key + "'");
  }
  return fields;
}

std::vector<int64_t> ParseShape(const std::string& text, const std::string& path) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') {
    Bad(path + ": malformed .npy shape " + text);
  }
  std::vector<int64_t> shape;
  const char* cursor = text.c_str() + 1;  // after '('
  for (;;) {  // "(2, 3)", "(4,)", "()": each dim followed by a comma or the closing parenthesis
    while (*cursor == ' ') ++cursor;
    if (*cursor == ')') break;
    char* end = nullptr;
    errno = 0;
    long long dim = std::strtoll(cursor, &end, 10);
    if (end == cursor || errno != 0 || dim < 0 || shape.size() >= 32) {
      Bad(path + ": malformed .npy shape " + text);
    }
    shape.push_back(dim);
    for (cursor = end; *cursor == ' ';) ++cursor;
    if (*cursor == ',') ++cursor;
    else if (*cursor != ')') Bad(path + ": malformed .npy shape " + text);
  }
  if (cursor + 1 != text.c_str() + text.size()) Bad(path + ": malformed .npy shape " + text);
  return shape;
}

// Read a .npy file that must hold exactly `spec` (dtype, shape, C order).
Buffer ReadNpy(const std::string& path, const TensorSpec& spec) {
  std::unique_ptr<std::FILE, decltype(&std::fclose)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) Bad("cannot read input " + path + ": " + std::strerror(errno));
  unsigned char preamble[12];
  if (std::fread(preamble, 1, 8, file.get()) != 8 || std::memcmp(preamble, "\x93NUMPY", 6) != 0) {
    Bad(path + " is not a .npy file");
  }
  int major = preamble[6];
  if (major < 1 || major > 3) Bad(path + ": unknown .npy version " + std::to_string(major));
  size_t width = major == 1 ? 2 : 4;  // v1: 16-bit header length, v2/v3: 32-bit
  if (std::fread(preamble + 8, 1, width, file.get()) != width) Bad(path + " is truncated (header)");
  uint32_t length = 0;
  for (size_t i = 0; i < width; ++i) length |= static_cast<uint32_t>(preamble[8 + i]) << (8 * i);
  if (length > kMaxHeader) Bad(path + ": .npy header of " + std::to_string(length) + " bytes");
  std::string header(length, '\0');
  if (std::fread(header.data(), 1, length, file.get()) != length) Bad(path + " is truncated (header)");

  std::map<std::string, std::string> fields = HeaderFields(header, path);
  std::string descr = fields["descr"];
  if (descr.size() < 2 || descr.front() != '\'' || descr.back() != '\'') {
    Bad(path + " has a structured dtype " + descr + ": deploy-run reads plain numeric arrays");
  }
  descr = descr.substr(1, descr.size() - 2);
  if (descr.find('O') != std::string::npos) Bad(path + " has object dtype: deploy-run reads numeric arrays");
  if (descr[0] == '>') Bad(path + " is big-endian (" + descr + "): save it little-endian");
  auto known = Descrs().find(descr);
  if (known == Descrs().end()) Bad(path + " has dtype " + descr + ": not one deploy-run reads");
  if (fields["fortran_order"] != "False") {
    Bad(path + " is Fortran-ordered: save it in C order (np.ascontiguousarray)");
  }
  std::vector<int64_t> shape = ParseShape(fields["shape"], path);
  if (!deploy::SameDtype(known->second, spec.dtype) || shape != spec.shape) {
    Bad("input " + std::string(spec.name) + " (" + path + ") is " + deploy::DtypeText(known->second) + " " +
        deploy::ShapeText(shape.data(), static_cast<int>(shape.size())) + ", expected " +
        deploy::DtypeText(spec.dtype) + " " +
        deploy::ShapeText(spec.shape.data(), static_cast<int>(spec.shape.size())));
  }
  size_t bytes = static_cast<size_t>(deploy::NumBytes(spec));
  Buffer buffer(deploy::NumBytes(spec));
  size_t got = std::fread(buffer.data.get(), 1, bytes, file.get());
  if (got != bytes) {
    Bad(path + " is truncated: " + std::to_string(got) + " of " + std::to_string(bytes) + " data bytes");
  }
  if (std::fgetc(file.get()) != EOF) Bad(path + " has bytes after its data");
  return buffer;
}

// Where -o's file goes, as `deploy run -o` writes it: this process's stdout (`-o /dev/stdout`,
// whatever it is redirected to: `to_stdout`) and a FIFO or a device are written in place; a
// symlink stays and the file it names is written; a regular file is replaced in one rename,
// keeping its mode (`mode`; a new file gets 0666 less the umask); a directory or a missing
// parent is bad input. Checked before the op runs.
struct Output {
  std::string file;
  bool in_place = false;
  bool to_stdout = false;
  mode_t mode = 0;
};

// The file a symlink to nothing yet names, in a directory that exists (a link into a missing
// directory or to another dangling link is bad input, before the op runs; one where no file can
// be made, such as /proc/self/fd/1 with stdout closed, fails when the output is written, and the
// link stays): the file is created there and the link stays, as for a live link.
std::string DanglingTarget(const std::string& path) {
  char target[PATH_MAX];
  ssize_t size = readlink(path.c_str(), target, sizeof(target) - 1);
  if (size < 0) Bad("cannot write output " + path + ": " + std::strerror(errno));
  std::string named(target, static_cast<size_t>(size));
  if (named[0] != '/') named = path.substr(0, path.rfind('/') + 1) + named;
  size_t slash = named.rfind('/');
  std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : named.substr(0, slash);
  std::string name = slash == std::string::npos ? named : named.substr(slash + 1);
  char resolved[PATH_MAX];
  struct stat st {};
  if (name.empty() || realpath(parent.c_str(), resolved) == nullptr ||
      lstat(named.c_str(), &st) == 0) {
    Bad("cannot write output " + path + ": it links to " + named + ", which no file can be written as");
  }
  return std::string(resolved) + "/" + name;
}

Output OutputFile(const std::string& path) {
  Output out;
  char resolved[PATH_MAX];
  struct stat link {};
  out.file = realpath(path.c_str(), resolved) != nullptr                      ? resolved
             : lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode) ? DanglingTarget(path)
                                                                               : path;
  struct stat st {}, ours {};
  bool exists = stat(out.file.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) Bad("output " + path + " is a directory: expected a .npy file path");
  if (exists && fstat(1, &ours) == 0 && st.st_dev == ours.st_dev && st.st_ino == ours.st_ino) out.to_stdout = true;
  out.in_place = exists && (out.to_stdout || !S_ISREG(st.st_mode));
  mode_t mask = umask(0);
  umask(mask);
  out.mode = exists ? (st.st_mode & 07777) : (0666 & ~mask);
  std::string parent = out.file.substr(0, out.file.rfind('/') + 1);
  struct stat dir {};
  if (!exists && stat(parent.empty() ? "." : parent.c_str(), &dir) != 0) {
    Bad("cannot write output " + path + ": " + std::strerror(errno));
  }
  return out;
}

// Write `data` as `spec` to a .npy v1 file at `out` (OutputFile): a regular file through a fresh
// temporary name beside it (never half a file at the path, never another file of that name
// touched, the temporary removed on every failure), anything else in place.
void WriteNpy(const std::string& path, const Output& out, const TensorSpec& spec, const void* data) {
  std::string descr;
  for (const auto& [text, dtype] : Descrs()) {
    if (deploy::SameDtype(dtype, spec.dtype)) descr = text;
  }
  std::string dims;
  for (int64_t dim : spec.shape) dims += std::to_string(dim) + (spec.shape.size() == 1 ? "," : ", ");
  if (spec.shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');  // numpy pads to 64 bytes with the newline
  header += '\n';
  std::string temporary = out.file + ".XXXXXX";
  int fd = out.to_stdout    ? dup(1)
           : out.in_place   ? open(out.file.c_str(), O_WRONLY | O_TRUNC)
                            : mkstemp(temporary.data());
  if (fd < 0) Bad("cannot write output " + path + ": " + std::strerror(errno));
  auto fail = [&](int error) {
    if (!out.in_place) std::remove(temporary.c_str());
    Exit(kFailed, "cannot write output " + path + ": " + std::strerror(error));
  };
  if (!out.in_place && fchmod(fd, out.mode) != 0) fail(errno);
  std::unique_ptr<std::FILE, decltype(&std::fclose)> file(fdopen(fd, "wb"), &std::fclose);
  if (!file) fail(errno);
  unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  preamble[8] = static_cast<unsigned char>(header.size());
  preamble[9] = static_cast<unsigned char>(header.size() >> 8);
  size_t bytes = static_cast<size_t>(deploy::NumBytes(spec));
  bool ok = std::fwrite(preamble, 1, 10, file.get()) == 10 &&
            std::fwrite(header.data(), 1, header.size(), file.get()) == header.size() &&
            std::fwrite(data, 1, bytes, file.get()) == bytes;
  ok = std::fclose(file.release()) == 0 && ok;
  if (!ok || (!out.in_place && std::rename(temporary.c_str(), out.file.c_str()) != 0)) fail(errno);
}

DLTensor Tensor(const TensorSpec& spec, void* data) {
  DLTensor tensor{};
  tensor.data = data;
  tensor.device = {kDLCPU, 0};
  tensor.ndim = static_cast<int32_t>(spec.shape.size());
  tensor.dtype = spec.dtype;
  tensor.shape = const_cast<int64_t*>(spec.shape.data());
  return tensor;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = ParseArgs(argc, argv);
  VerifyBundle(opt.dir);
  Output output = OutputFile(opt.output);  // before any work, as `deploy run` checks it
  if (static_cast<int>(opt.inputs.size()) != kNumInputs) {
    std::string names;
    for (int i = 0; i < kNumInputs; ++i) names += (i ? ", " : "") + std::string(deploy::kTensors[i].name);
    Bad(std::string(deploy::kOp) + " takes " + std::to_string(kNumInputs) + " inputs (" + names + "), got " +
        std::to_string(opt.inputs.size()));
  }
  std::vector<Buffer> buffers;
  for (int i = 0; i < kNumInputs; ++i) buffers.push_back(ReadNpy(opt.inputs[i], deploy::kTensors[i]));
  const TensorSpec& out = deploy::kTensors[kNumInputs];
  buffers.emplace_back(deploy::NumBytes(out));

  std::string library = opt.dir + "/" + deploy::kLibrary;
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) Exit(kFailed, std::string("cannot load ") + dlerror());
  std::string prefix = std::string("deploy_") + deploy::kOp;
  auto run = reinterpret_cast<int (*)(DLTensor* const*, int)>(dlsym(handle, (prefix + "_run").c_str()));
  auto last_error = reinterpret_cast<const char* (*)()>(dlsym(handle, (prefix + "_last_error").c_str()));
  if (run == nullptr || last_error == nullptr) Exit(kFailed, library + " does not export " + prefix + "_*");

  std::vector<DLTensor> tensors;
  for (int i = 0; i < deploy::kNumTensors; ++i) {
    tensors.push_back(Tensor(deploy::kTensors[i], buffers[i].data.get()));
  }
  std::vector<DLTensor*> args;
  for (DLTensor& tensor : tensors) args.push_back(&tensor);
  if (run(args.data(), deploy::kNumTensors) != 0) Exit(kFailed, last_error());
  WriteNpy(opt.output, output, out, buffers.back().data.get());
  return 0;
}
