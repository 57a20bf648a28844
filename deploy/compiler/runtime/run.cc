// deploy-run: run a bundle's op or graph on .npy files. Linked statically with the bundle's
// library (libNAME.a) and runner_glue.c, which says what the bundle takes (`deploy_runner`): it
// needs nothing on the device, not even a particular libc. Compiled once per architecture.
//
//   deploy-run DIR -i a.npy [-i b.npy ...] -o out.npy [-o out2.npy ...] [--threads N]
//              [--cl-device P:D] [--time NUMBER,REPEAT,MIN_REPEAT_MS]
//
// First it checks DIR/SHA256SUMS: every file listed must match (a modified bundle is refused,
// this runner among its files). It refuses what `deploy run` refuses, in its words: an -i that is
// no regular file (a FIFO would block), an -o naming an input, a file of the bundle, this runner
// or another -o's file. Then it reads the inputs (.npy v1-v3 as numpy reads them, little-endian
// f2/f4/f8/i1/u1/i4/i8, C order), checks them against the bundle's signature (bundle_config.h; a
// symbolic batch is read from them), calls NAME_run and writes each output as .npy v1 (-o once
// per output, in the bundle's order).
// --threads N: the parallel loops' threads (NAME_set_num_threads; default one per online CPU).
// --cl-device P:D: an OpenCL bundle's device, platform P device D (NAME_cl_open; default 0:0).
// --time: after that call (the warm-up), REPEAT timed runs of NUMBER calls each, as TVM's time
// evaluator times: a run shorter than MIN_REPEAT_MS is done again with more calls. Each run's
// seconds per call go to stdout, one line each ("seconds-per-call 1.25e-05"). This is how deploy
// times a device that has only the bundle (deploy/devices/runner.py).
// Errors are one line on stderr: exit 2 for bad input or a modified bundle, 1 when the call fails.
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#define DEPLOY_NO_BUNDLE_CONFIG
#include "bundle.h"
#include "sha256.h"

extern "C" const DeployRunner deploy_runner;  // runner_glue.c

namespace {

constexpr int kBadInput = 2;
constexpr int kFailed = 1;
constexpr size_t kAlignment = DEPLOY_ALIGNMENT;  // what the library demands of tensor data
constexpr uint32_t kMaxHeader = 1 << 20;

std::string DtypeText(DLDataType dtype) {
  const char* kind = dtype.code == kDLFloat ? "float" : dtype.code == kDLInt ? "int"
                     : dtype.code == kDLUInt ? "uint" : dtype.code == kDLBool ? "bool" : "code";
  std::string text = kind + std::to_string(dtype.bits);
  return dtype.lanes == 1 ? text : text + "x" + std::to_string(dtype.lanes);
}

bool SameDtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// "[2, 3]"; a symbolic dim of a spec (< 0) by its name.
std::string ShapeText(const int64_t* shape, int ndim) {
  std::string text = "[";
  for (int i = 0; i < ndim; ++i) {
    text += i ? ", " : "";
    text += shape[i] < 0 ? deploy_runner.symbol_names[-shape[i] - 1] : std::to_string(shape[i]);
  }
  return text + "]";
}

std::string SpecText(const DeployTensorSpec& spec) {
  return DtypeText(spec.dtype) + " " + ShapeText(spec.shape, spec.ndim);
}

// The shape of `spec` with its symbolic dims at `symbols`.
std::vector<int64_t> ShapeAt(const DeployTensorSpec& spec, const int64_t* symbols) {
  std::vector<int64_t> shape;
  for (int i = 0; i < spec.ndim; ++i) shape.push_back(spec.shape[i] < 0 ? symbols[-spec.shape[i] - 1] : spec.shape[i]);
  return shape;
}

int64_t NumBytes(const std::vector<int64_t>& shape, DLDataType dtype) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count * ((dtype.bits * dtype.lanes + 7) / 8);
}

[[noreturn]] void Exit(int code, const std::string& message) {
  std::fprintf(stderr, "deploy-run: %s\n", message.c_str());
  std::exit(code);
}

[[noreturn]] void Bad(const std::string& message) { Exit(kBadInput, message); }

// `text` on one line: a byte a terminal acts on as Python's `printable` writes it (\t, \n, \r,
// else \xNN), and (`quote`) ' and \ escaped.
std::string Escaped(const std::string& text, bool quote) {
  std::string escaped;
  for (char c : text) {
    unsigned char byte = static_cast<unsigned char>(c);
    char hex[8];
    std::snprintf(hex, sizeof(hex), "\\x%02x", byte);
    escaped += c == '\t' ? "\\t" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
               : byte < 0x20 || byte == 0x7f ? hex
               : quote && (c == '\'' || c == '\\') ? std::string("\\") + c
                                                   : std::string(1, c);
  }
  return escaped;
}

// A value read from a file, as a message shows it: on one line, cut to its first 40 bytes when
// longer than 48 (a 5,000-digit shape), saying how long it was.
std::string Shown(const std::string& text) {
  if (text.size() <= 48) return Escaped(text, false);
  return Escaped(text.substr(0, 40), false) + "... (" + std::to_string(text.size()) + " characters)";
}

// A path as `deploy run` quotes it (`base.errors.quoted`): 'a.npy', 'it\'s', on one line.
std::string Quoted(const std::string& path) { return "'" + Escaped(path, true) + "'"; }

struct Options {
  std::string dir;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  int threads = 0;
  int platform = -1, device = -1;  // --cl-device; -1: the bundle's default
  long number = 0, repeat = 0, min_repeat_ms = 0;  // --time; repeat 0: no timing
};

constexpr const char* kUsage =
    "usage: deploy-run DIR -i IN.npy ... -o OUT.npy ... [--threads N] [--cl-device P:D]"
    " [--time NUMBER,REPEAT,MIN_REPEAT_MS]";

// A count from `text` in [low, high], else a bad-input exit naming `what`.
long Count(const std::string& text, const char* what, long low, long high) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < low || value > high) {
    Bad(std::string(what) + " " + Shown(text) + ": expected a whole number from " + std::to_string(low) + " to " +
        std::to_string(high));
  }
  return value;
}

Options ParseArgs(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-i" && i + 1 < argc) {
      opt.inputs.push_back(argv[++i]);
    } else if (arg == "-o" && i + 1 < argc) {
      opt.outputs.push_back(argv[++i]);
    } else if (arg == "--threads" && i + 1 < argc) {
      opt.threads = static_cast<int>(Count(argv[++i], "--threads", 1, 1024));
      if (deploy_runner.set_num_threads == nullptr) Bad("--threads applies to CPU bundles: this one runs on OpenCL");
    } else if (arg == "--cl-device" && i + 1 < argc) {
      std::string spec = argv[++i];
      size_t colon = spec.find(':');
      if (deploy_runner.select_device == nullptr) Bad("--cl-device applies to OpenCL bundles: this one runs on the CPU");
      if (colon == std::string::npos) Bad("--cl-device " + Shown(spec) + ": expected PLATFORM:DEVICE, e.g. 0:0");
      opt.platform = static_cast<int>(Count(spec.substr(0, colon), "--cl-device PLATFORM", 0, 1023));
      opt.device = static_cast<int>(Count(spec.substr(colon + 1), "--cl-device DEVICE", 0, 1023));
    } else if (arg == "--time" && i + 1 < argc) {
      std::string spec = argv[++i];
      size_t first = spec.find(','), second = first == std::string::npos ? first : spec.find(',', first + 1);
      if (second == std::string::npos) Bad("--time " + Shown(spec) + ": expected NUMBER,REPEAT,MIN_REPEAT_MS");
      opt.number = Count(spec.substr(0, first), "--time NUMBER", 1, 1L << 30);
      opt.repeat = Count(spec.substr(first + 1, second - first - 1), "--time REPEAT", 1, 1000);
      opt.min_repeat_ms = Count(spec.substr(second + 1), "--time MIN_REPEAT_MS", 0, 60000);
    } else if (opt.dir.empty() && !arg.empty() && arg[0] != '-') {
      opt.dir = arg;
    } else {
      Bad("unexpected argument " + Shown(arg) + " (" + kUsage + ")");
    }
  }
  if (opt.dir.empty() || opt.outputs.empty()) Bad(kUsage);
  return opt;
}

// Every file in DIR/SHA256SUMS matches it, this runner and the library among them. Returns the
// bundle's files (SHA256SUMS and those it lists), which -o may not name.
std::vector<std::string> VerifyBundle(const std::string& dir) {
  // Opened without blocking and read only as a regular file: a FIFO there would block the open.
  std::string path = dir + "/SHA256SUMS";
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat info {};
  if (fd < 0) Bad("cannot read " + Quoted(path) + ": not a bundle directory");
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || info.st_size > (1 << 20)) {
    close(fd);
    Bad(Quoted(path) + " is not a regular file of SHA-256 sums: the bundle was modified");
  }
  std::unique_ptr<std::FILE, decltype(&std::fclose)> sums(fdopen(fd, "r"), &std::fclose);
  if (!sums) Bad("cannot read " + Quoted(path) + ": " + std::strerror(errno));
  std::map<std::string, std::string> listed;
  std::string line;
  for (int c; (c = std::fgetc(sums.get())) != EOF || !line.empty();) {
    if (c != '\n' && c != EOF) {
      line += static_cast<char>(c);
      continue;
    }
    if (line.size() < 67 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*')) {
      Bad(Quoted(dir + "/SHA256SUMS") + " has a malformed line: " + Shown(line));
    }
    std::string digest = line.substr(0, 64), path = line.substr(66);
    if (path[0] == '/' || path.find("..") != std::string::npos) {
      Bad(Quoted(dir + "/SHA256SUMS") + " names " + Quoted(path) + ", outside the bundle");
    }
    std::string actual = deploy::Sha256File(dir + "/" + path);
    if (actual.empty()) {
      Bad("cannot read " + Quoted(dir + "/" + path) + " as a file: the bundle is incomplete or modified");
    }
    if (actual != digest) Bad(Quoted(dir + "/" + path) + " does not match SHA256SUMS: the bundle was modified");
    listed[path] = digest;
    line.clear();
  }
  std::vector<std::string> files = {path};
  for (const std::string& file : {std::string("deploy-run"), "lib" + std::string(deploy_runner.name) + ".a"}) {
    if (listed.find(file) == listed.end()) Bad(Quoted(dir + "/SHA256SUMS") + " does not list " + file);
  }
  for (const auto& [file, digest] : listed) files.push_back(dir + "/" + file);
  return files;
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "'=' and '|' in a .npy dtype read as '<' here");

// numpy's type codes ("f4", after the byte order of "<f4") that deploy-run reads and writes.
const std::map<std::string, DLDataType>& Descrs() {
  static const std::map<std::string, DLDataType> descrs = {
      {"f2", {kDLFloat, 16, 1}}, {"f4", {kDLFloat, 32, 1}}, {"f8", {kDLFloat, 64, 1}},
      {"i1", {kDLInt, 8, 1}},    {"u1", {kDLUInt, 8, 1}},   {"i4", {kDLInt, 32, 1}},
      {"i8", {kDLInt, 64, 1}},   {"i2", {kDLInt, 16, 1}},   {"u2", {kDLUInt, 16, 1}},
      {"u4", {kDLUInt, 32, 1}},  {"u8", {kDLUInt, 64, 1}}};
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
  auto malformed = [&](const std::string& why) { Bad(Quoted(path) + ": malformed .npy header (" + why + ")"); };
  auto skip = [&](size_t at) { return std::min(header.find_first_not_of(' ', at), header.size()); };
  std::map<std::string, std::string> fields;
  size_t at = skip(0);
  if (at == header.size() || header[at] != '{') malformed("no '{'");
  for (at = skip(at + 1); at < header.size() && header[at] != '}'; at = skip(at)) {
    if (header[at] != '\'') malformed("a key is not quoted");
    size_t close = header.find('\'', at + 1);
    if (close == std::string::npos) malformed("a key is not closed");
    std::string key = header.substr(at + 1, close - at - 1);
    if (key != "descr" && key != "fortran_order" && key != "shape") malformed("unexpected key '" + Shown(key) + "'");
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
  auto malformed = [&]() { Bad(Quoted(path) + ": malformed .npy shape " + Shown(text)); };
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') malformed();
  std::vector<int64_t> shape;
  const char* cursor = text.c_str() + 1;  // after '('
  for (;;) {  // "(2, 3)", "(4,)", "()": each dim followed by a comma or the closing parenthesis
    while (*cursor == ' ') ++cursor;
    if (*cursor == ')') break;
    char* end = nullptr;
    errno = 0;
    long long dim = std::strtoll(cursor, &end, 10);
    if (end == cursor || errno != 0 || dim < 0 || shape.size() >= 32) malformed();
    shape.push_back(dim);
    for (cursor = end; *cursor == ' ';) ++cursor;
    if (*cursor == ',') ++cursor;
    else if (*cursor != ')') malformed();
  }
  if (cursor + 1 != text.c_str() + text.size()) malformed();
  return shape;
}

// An input opened for reading, refused as `deploy run` refuses it when it is no regular file (a
// FIFO or a device would block the read forever): checked before it is opened, and again on what
// was opened (opened without blocking, should a FIFO take the file's place between the two).
std::FILE* OpenInput(const std::string& path) {
  auto refuse = [&](const std::string& why) { Bad("cannot read input " + Quoted(path) + " as a .npy array: " + why); };
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) refuse(std::strerror(errno));
  if (S_ISDIR(info.st_mode)) refuse("it is a directory");
  if (!S_ISREG(info.st_mode)) refuse("not a regular file");
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) refuse(std::strerror(errno));
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    refuse("not a regular file");
  }
  std::FILE* file = fdopen(fd, "rb");
  if (file == nullptr) refuse(std::strerror(errno));
  return file;
}

// A .npy file's data and shape.
struct Array {
  Buffer buffer;
  std::vector<int64_t> shape;
};

// Read a .npy file that must hold `spec` (dtype, shape, C order); its symbolic dims bind
// `symbols` (0: not yet bound), which earlier inputs may have bound already.
Array ReadNpy(const std::string& path, const DeployTensorSpec& spec, int64_t* symbols) {
  std::unique_ptr<std::FILE, decltype(&std::fclose)> file(OpenInput(path), &std::fclose);
  unsigned char preamble[12];
  if (std::fread(preamble, 1, 8, file.get()) != 8 || std::memcmp(preamble, "\x93NUMPY", 6) != 0) {
    Bad(Quoted(path) + " is not a .npy file");
  }
  int major = preamble[6];
  if (major < 1 || major > 3) Bad(Quoted(path) + ": unknown .npy version " + std::to_string(major));
  size_t width = major == 1 ? 2 : 4;  // v1: 16-bit header length, v2/v3: 32-bit
  if (std::fread(preamble + 8, 1, width, file.get()) != width) Bad(Quoted(path) + " is truncated (header)");
  uint32_t length = 0;
  for (size_t i = 0; i < width; ++i) length |= static_cast<uint32_t>(preamble[8 + i]) << (8 * i);
  if (length > kMaxHeader) Bad(Quoted(path) + ": .npy header of " + std::to_string(length) + " bytes");
  std::string header(length, '\0');
  if (std::fread(header.data(), 1, length, file.get()) != length) Bad(Quoted(path) + " is truncated (header)");

  std::map<std::string, std::string> fields = HeaderFields(header, path);
  std::string descr = fields["descr"];
  if (descr.size() < 2 || descr.front() != '\'' || descr.back() != '\'') {
    Bad(Quoted(path) + " has a structured dtype " + Shown(descr) + ": deploy-run reads plain numeric arrays");
  }
  descr = descr.substr(1, descr.size() - 2);
  if (descr.find('O') != std::string::npos) Bad(Quoted(path) + " has object dtype: deploy-run reads numeric arrays");
  // numpy reads "<f4", "=f4", "|f4" and "f4" alike here (little-endian); ">" of one byte too
  bool ordered = !descr.empty() && std::strchr("<>=|", descr[0]) != nullptr;
  auto known = Descrs().find(ordered ? descr.substr(1) : descr);
  if (known == Descrs().end()) Bad(Quoted(path) + " has dtype " + Shown(descr) + ": not one deploy-run reads");
  if (descr[0] == '>' && known->second.bits > 8) Bad(Quoted(path) + " is big-endian (" + Shown(descr) + "): save it little-endian");
  const std::string& order = fields["fortran_order"];
  if (order == "True") Bad(Quoted(path) + " is Fortran-ordered: save it in C order (np.ascontiguousarray)");
  if (order != "False") Bad(Quoted(path) + ": malformed .npy header ('fortran_order' is " + Shown(order) + ", expected False)");
  std::vector<int64_t> shape = ParseShape(fields["shape"], path);
  std::string is = "input " + std::string(spec.name) + " (" + Quoted(path) + ") is " + DtypeText(known->second) + " " +
                   ShapeText(shape.data(), static_cast<int>(shape.size()));
  bool fits = SameDtype(known->second, spec.dtype) && static_cast<int>(shape.size()) == spec.ndim;
  for (int i = 0; fits && i < spec.ndim; ++i) fits = spec.shape[i] < 0 || shape[i] == spec.shape[i];
  if (!fits) Bad(is + ", expected " + SpecText(spec));
  for (int i = 0; i < spec.ndim; ++i) {
    if (spec.shape[i] >= 0) continue;
    int64_t& bound = symbols[-spec.shape[i] - 1];
    const char* symbol = deploy_runner.symbol_names[-spec.shape[i] - 1];
    if (shape[i] < 1 || shape[i] > INT32_MAX) Bad(is + ": " + symbol + " must be 1 to " + std::to_string(INT32_MAX));
    if (bound != 0 && bound != shape[i]) {
      Bad(is + ": its " + symbol + " is " + std::to_string(shape[i]) + ", an earlier input's " + std::to_string(bound));
    }
    bound = shape[i];
  }
  int64_t total = 1;
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(total, dim, &total) || total > (INT64_MAX >> 4)) total = INT64_MAX >> 4;
  }
  // The data's size against the file's before anything is allocated: a forged header is no
  // allocation of terabytes.
  uint64_t bytes = static_cast<uint64_t>(total) * ((spec.dtype.bits * spec.dtype.lanes + 7) / 8);
  struct stat info {};
  long at = std::ftell(file.get());
  uint64_t held = fstat(fileno(file.get()), &info) == 0 && at >= 0 && info.st_size >= at ? info.st_size - at : 0;
  if (held < bytes) {
    Bad(Quoted(path) + " is truncated: " + std::to_string(held) + " of " + std::to_string(bytes) + " data bytes");
  }
  if (held > bytes) Bad(Quoted(path) + " has bytes after its data");
  if (total > INT32_MAX) {
    Bad(is + ": " + std::to_string(total) + " elements, more than the " + std::to_string(INT32_MAX) +
        " (2**31 - 1) one tensor may hold");
  }
  Buffer buffer(static_cast<int64_t>(bytes));
  size_t got = std::fread(buffer.data.get(), 1, static_cast<size_t>(bytes), file.get());
  if (got != bytes) {
    Bad(Quoted(path) + " is truncated: " + std::to_string(got) + " of " + std::to_string(bytes) + " data bytes");
  }
  if (std::fgetc(file.get()) != EOF) Bad(Quoted(path) + " has bytes after its data");
  return Array{std::move(buffer), shape};
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

// Where a path that names nothing yet is created: its directory resolved and its last name, or
// through a symlink to nothing, the file the link names (`named`: what it says), created there
// as for a live link; "" where no file can be made: a link into a missing directory or to another
// dangling link (bad input before the op runs). One where no file can be made, such as
// /proc/self/fd/1 with stdout closed, fails when the output is written, and the link stays.
std::string CreatedAt(const std::string& path, std::string& named) {
  named = path;
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char target[PATH_MAX];
    ssize_t size = readlink(path.c_str(), target, sizeof(target) - 1);
    if (size <= 0) return "";
    named.assign(target, static_cast<size_t>(size));
    if (named[0] != '/') named = path.substr(0, path.rfind('/') + 1) + named;
    if (lstat(named.c_str(), &st) == 0) return "";
  }
  size_t slash = named.rfind('/');
  std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : named.substr(0, slash);
  std::string name = slash == std::string::npos ? named : named.substr(slash + 1);
  char resolved[PATH_MAX];
  if (name.empty() || realpath(parent.c_str(), resolved) == nullptr) return "";
  return std::string(resolved) + "/" + name;
}

Output OutputFile(const std::string& path) {
  Output out;
  char resolved[PATH_MAX];
  struct stat link {};
  std::string named;
  if (realpath(path.c_str(), resolved) != nullptr) {
    out.file = resolved;
  } else if (lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    out.file = CreatedAt(path, named);
    if (out.file.empty()) {
      Bad("cannot write output " + Quoted(path) + ": it links to " + Quoted(named) + ", which no file can be written as");
    }
  } else {
    out.file = path;
  }
  struct stat st {}, ours {};
  bool exists = stat(out.file.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) Bad("output " + Quoted(path) + " is a directory; expected a .npy file path");
  if (exists && fstat(1, &ours) == 0 && st.st_dev == ours.st_dev && st.st_ino == ours.st_ino) out.to_stdout = true;
  out.in_place = exists && (out.to_stdout || !S_ISREG(st.st_mode));
  mode_t mask = umask(0);
  umask(mask);
  out.mode = exists ? (st.st_mode & 07777) : (0666 & ~mask);
  std::string parent = out.file.substr(0, out.file.rfind('/') + 1);
  struct stat dir {};
  if (!exists && stat(parent.empty() ? "." : parent.c_str(), &dir) != 0) {
    Bad("cannot write output " + Quoted(path) + ": " + std::strerror(errno));
  }
  return out;
}

// What a path names, to tell whether two paths are one file: the file's device and inode through
// any links (`./a.npy`, a link, a hard link), or for a path that names nothing yet, where it
// would be created (`CreatedAt`: a dangling link's file); and where it is, resolved.
struct Identity {
  bool exists = false;
  bool device = false;  // a character device (/dev/null): any number of -o may write it
  dev_t dev = 0;
  ino_t ino = 0;
  std::string where;

  explicit Identity(const std::string& path) {
    struct stat info {};
    char resolved[PATH_MAX];
    if (stat(path.c_str(), &info) == 0) {
      exists = true, device = S_ISCHR(info.st_mode), dev = info.st_dev, ino = info.st_ino;
      where = realpath(path.c_str(), resolved) ? resolved : path;
      return;
    }
    std::string named;
    where = CreatedAt(path, named);
    if (where.empty()) where = path;
  }
  bool operator==(const Identity& other) const {
    return exists == other.exists && (exists ? dev == other.dev && ino == other.ino : where == other.where);
  }
};

// -o may not name what `deploy run -o` may not: a file this command reads (an input, a file of
// the bundle, this runner) or what another -o writes; either would be lost. Nor anything in the
// bundle's directory (manifest.json, which SHA256SUMS leaves out, or a file added later). A
// character device (-o /dev/null, to discard outputs while timing) may be any of them.
void CheckOutputs(const Options& opt, const std::vector<std::string>& bundle_files) {
  std::vector<std::pair<std::string, std::string>> taken;  // a path, and what it is to this command
  for (const std::string& input : opt.inputs) taken.emplace_back(input, "which this command reads");
  for (const std::string& file : bundle_files) taken.emplace_back(file, "a file of the bundle");
  taken.emplace_back("/proc/self/exe", "which this command runs");  // this runner, wherever it was started from
  char resolved[PATH_MAX];
  std::string bundle = realpath(opt.dir.c_str(), resolved) ? std::string(resolved) + "/" : opt.dir;
  for (size_t k = 0; k < opt.outputs.size(); ++k) {
    const std::string& output = opt.outputs[k];
    Identity out(output);
    if (out.device) continue;
    for (const auto& [path, what] : taken) {
      if (!out.exists || !(Identity(path) == out)) continue;
      std::string shown = path == "/proc/self/exe" ? "this deploy-run" : Quoted(path);
      Bad("-o " + Quoted(output) + " is " + shown + ", " + what + "; expected another file");
    }
    if (out.where.compare(0, bundle.size(), bundle) == 0) {
      Bad("-o " + Quoted(output) + " is in the bundle " + Quoted(opt.dir) + ", which this command reads; expected another file");
    }
    for (size_t j = 0; j < k; ++j) {
      if (Identity(opt.outputs[j]) == out) {
        Bad("-o " + Quoted(output) + " is " + Quoted(opt.outputs[j]) + ", which another -o writes; expected another file");
      }
    }
  }
}

// Write `data` as `spec` to a .npy v1 file at `out` (OutputFile): a regular file through a fresh
// temporary name beside it (never half a file at the path, never another file of that name
// touched, the temporary removed on every failure), anything else in place.
void WriteNpy(const std::string& path, const Output& out, DLDataType dtype, const std::vector<int64_t>& shape,
              const void* data) {
  std::string descr;
  for (const auto& [code, known] : Descrs()) {
    if (SameDtype(known, dtype)) descr = (known.bits == 8 ? "|" : "<") + code;
  }
  std::string dims;
  for (int64_t dim : shape) dims += std::to_string(dim) + (shape.size() == 1 ? "," : ", ");
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');  // numpy pads to 64 bytes with the newline
  header += '\n';
  // The temporary's name is short whatever the output's: a 254-byte name plus a suffix is too long.
  std::string::size_type slash = out.file.rfind('/');
  std::string temporary = out.file.substr(0, slash == std::string::npos ? 0 : slash + 1) + ".deploy-run-XXXXXX";
  int fd = out.to_stdout    ? dup(1)
           : out.in_place   ? open(out.file.c_str(), O_WRONLY | O_TRUNC)
                            : mkstemp(temporary.data());
  if (fd < 0) Bad("cannot write output " + Quoted(path) + ": " + std::strerror(errno));
  auto fail = [&](int error) {
    if (!out.in_place) std::remove(temporary.c_str());
    Exit(kFailed, "cannot write output " + Quoted(path) + ": " + std::strerror(error));
  };
  if (!out.in_place && fchmod(fd, out.mode) != 0) fail(errno);
  std::unique_ptr<std::FILE, decltype(&std::fclose)> file(fdopen(fd, "wb"), &std::fclose);
  if (!file) fail(errno);
  unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  preamble[8] = static_cast<unsigned char>(header.size());
  preamble[9] = static_cast<unsigned char>(header.size() >> 8);
  size_t bytes = static_cast<size_t>(NumBytes(shape, dtype));
  bool ok = std::fwrite(preamble, 1, 10, file.get()) == 10 &&
            std::fwrite(header.data(), 1, header.size(), file.get()) == header.size() &&
            std::fwrite(data, 1, bytes, file.get()) == bytes;
  ok = std::fclose(file.release()) == 0 && ok;
  if (!ok || (!out.in_place && std::rename(temporary.c_str(), out.file.c_str()) != 0)) fail(errno);
}

DLTensor Tensor(const DeployTensorSpec& spec, std::vector<int64_t>& shape, void* data) {
  DLTensor tensor{};
  tensor.data = data;
  tensor.device = {kDLCPU, 0};
  tensor.ndim = spec.ndim;
  tensor.dtype = spec.dtype;
  tensor.shape = shape.data();
  return tensor;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = ParseArgs(argc, argv);
  std::vector<std::string> bundle_files = VerifyBundle(opt.dir);
  const int inputs = deploy_runner.num_inputs, outputs = deploy_runner.num_outputs;
  auto names = [](int from, int count) {
    std::string text;
    for (int i = from; i < from + count; ++i) text += (i > from ? ", " : "") + std::string(deploy_runner.tensors[i].name);
    return text;
  };
  if (static_cast<int>(opt.outputs.size()) != outputs) {
    Bad(std::string(deploy_runner.name) + " writes " + std::to_string(outputs) + " output(s) (" +
        names(inputs, outputs) + "): give -o once for each, got " + std::to_string(opt.outputs.size()));
  }
  CheckOutputs(opt, bundle_files);
  std::vector<Output> files;
  for (const std::string& path : opt.outputs) files.push_back(OutputFile(path));  // before any work
  if (static_cast<int>(opt.inputs.size()) != inputs) {
    Bad(std::string(deploy_runner.name) + " takes " + std::to_string(inputs) + " inputs (" + names(0, inputs) +
        "), got " + std::to_string(opt.inputs.size()));
  }
  std::vector<int64_t> symbols(inputs * DEPLOY_MAX_DIMS + 1, 0);  // more than the symbolic dims
  std::vector<Array> arrays;
  for (int i = 0; i < inputs; ++i) arrays.push_back(ReadNpy(opt.inputs[i], deploy_runner.tensors[i], symbols.data()));
  for (int k = 0; k < outputs; ++k) {
    std::vector<int64_t> shape = ShapeAt(deploy_runner.tensors[inputs + k], symbols.data());
    arrays.push_back(Array{Buffer(NumBytes(shape, deploy_runner.tensors[inputs + k].dtype)), shape});
  }

  std::vector<DLTensor> tensors;
  for (int i = 0; i < inputs + outputs; ++i) {
    tensors.push_back(Tensor(deploy_runner.tensors[i], arrays[i].shape, arrays[i].buffer.data.get()));
  }
  std::vector<DLTensor*> args;
  for (DLTensor& tensor : tensors) args.push_back(&tensor);
  if (opt.threads > 0) deploy_runner.set_num_threads(opt.threads);
  if (opt.platform >= 0) {  // NAME_ERR_ARGUMENT: no such device, bad input; else no OpenCL
    int status = deploy_runner.select_device(opt.platform, opt.device);
    if (status != 0) Exit(status == DEPLOY_ERR_ARGUMENT ? kBadInput : kFailed, deploy_runner.last_error());
  }
  const int count = inputs + outputs;
  if (deploy_runner.run(args.data(), count) != 0) Exit(kFailed, deploy_runner.last_error());
  for (int k = 0; k < outputs; ++k) {
    const Array& out = arrays[inputs + k];
    WriteNpy(opt.outputs[k], files[k], deploy_runner.tensors[inputs + k].dtype, out.shape, out.buffer.data.get());
  }
  for (long run = 0, number = opt.number; run < opt.repeat;) {
    auto start = std::chrono::steady_clock::now();
    for (long call = 0; call < number; ++call) {
      if (deploy_runner.run(args.data(), count) != 0) Exit(kFailed, deploy_runner.last_error());
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds * 1e3 < opt.min_repeat_ms && number < (1L << 30)) {  // too short to tell: more calls
      number = std::min(1L << 30, std::max(number * 2, static_cast<long>(number * opt.min_repeat_ms / 1e3 /
                                                                          std::max(seconds, 1e-9) * 1.1)));
      continue;
    }
    std::printf("seconds-per-call %.9g\n", seconds / number);
    ++run;
  }
  return std::fflush(stdout) == 0 ? 0 : kFailed;
}
