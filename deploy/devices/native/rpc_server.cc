// deploy-rpc-server: TVM's RPC server without Python, for devices that only have libc and libstdc++.
//
// A drop-in for `python -m tvm.exec.rpc_server` as deploy uses it: it listens on a loopback port,
// answers TVM's handshake (magic number, "client:KEY [-timeout=S]", reply "server:deploy"), and
// forks one child per session that hands the socket to libtvm_runtime's `rpc.ServerLoop`. Sessions
// run one at a time, each in a fresh work directory that is removed afterwards. A session that
// outlives the timeout its client asked for is killed and the client is told so.
//
//   deploy-rpc-server --port P [--port-end E] [--host 127.0.0.1] [--key-file F] [--work-dir D]
//                     [--parent PID]
//
// --parent: the pid of the process that started us; once it is gone (we are reparented) the
// server stops as on SIGTERM. A server deploy starts for one command goes with it even when the
// command is killed with SIGKILL, which leaves it no chance to stop the server itself.
// --key-file: the session key clients must send ("client:" + the file's first line); without it
// the key is empty, as with the Python server. Stdout gets one line per event, for whoever started
// us: "bind to HOST:PORT" once listening, then "session start" / "session end" around each session
// and "load_module NAME" for each module loaded.
#include <arpa/inet.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

namespace {

using tvm::ffi::Function;

constexpr int32_t kRpcMagic = 0xff271;  // tvm/rpc/base.py: RPC_MAGIC, RPC_CODE_SUCCESS
constexpr int32_t kRpcMismatch = kRpcMagic + 2;
constexpr int32_t kMaxKeyBytes = 4096;

struct Options {
  std::string host = "127.0.0.1";
  int port = 9090;
  int port_end = 0;
  std::string key;
  std::string work_dir = "/tmp";
  pid_t parent = 0;  // 0: outlive whoever started us
};

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "deploy-rpc-server: %s\n", message.c_str());
  std::exit(2);
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

Options ParseArgs(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) Fail("missing value for " + flag);
    std::string value = argv[++i];
    if (flag == "--host") {
      opt.host = value;
    } else if (flag == "--port") {
      opt.port = std::atoi(value.c_str());
    } else if (flag == "--port-end") {
      opt.port_end = std::atoi(value.c_str());
    } else if (flag == "--work-dir") {
      opt.work_dir = value;
    } else if (flag == "--parent") {
      opt.parent = static_cast<pid_t>(std::atoi(value.c_str()));
      if (opt.parent <= 0) Fail("--parent " + value + ": expected a process id");
    } else if (flag == "--key-file") {
      std::ifstream in(value);
      if (!in || !std::getline(in, opt.key)) Fail("cannot read key file " + value);
    } else {
      Fail("unknown option " + flag);
    }
  }
  if (opt.host.rfind("127.", 0) != 0) Fail("--host " + opt.host + ": only loopback addresses (127.x.x.x)");
  if (opt.port_end <= opt.port) opt.port_end = opt.port + 1;
  if (opt.port <= 0 || opt.port_end > 65536) Fail("--port " + std::to_string(opt.port) + ": out of range");
  return opt;
}

bool ReadAll(int fd, void* data, size_t size) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    ssize_t got = recv(fd, bytes, size, 0);
    if (got <= 0) return false;
    bytes += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

void WriteAll(int fd, const void* data, size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t sent = send(fd, bytes, size, MSG_NOSIGNAL);
    if (sent <= 0) return;
    bytes += sent;
    size -= static_cast<size_t>(sent);
  }
}

// The client's handshake. Returns whether it may start a session; sets the timeout it asked for.
bool Handshake(int fd, const std::string& key, double* timeout_s) {
  int32_t magic = 0, length = 0;
  if (!ReadAll(fd, &magic, 4) || magic != kRpcMagic) return false;
  if (!ReadAll(fd, &length, 4) || length < 0 || length > kMaxKeyBytes) return false;
  std::string words(static_cast<size_t>(length), '\0');
  if (!ReadAll(fd, words.data(), words.size())) return false;
  std::string first = words.substr(0, words.find(' '));
  if (first != "client:" + key) {
    WriteAll(fd, &kRpcMismatch, 4);
    return false;
  }
  size_t at = words.find(" -timeout=");
  *timeout_s = at == std::string::npos ? 0 : std::atof(words.c_str() + at + 10);
  const std::string reply = "server:deploy";
  int32_t size = static_cast<int32_t>(reply.size());
  WriteAll(fd, &kRpcMagic, 4);
  WriteAll(fd, &size, 4);
  WriteAll(fd, reply.data(), reply.size());
  return true;
}

// The functions TVM's RPC client calls that the runtime leaves to the server: where uploaded files
// go, and loading one as a module. Names with ".." or a leading "/" are refused.
void RegisterSessionFunctions(const std::string& dir) {
  using tvm::ffi::String;
  auto workpath = [dir](const String& name) -> String {
    std::string path = name;
    if (path.empty() || path[0] == '/' || path.find("..") != std::string::npos) {
      TVM_FFI_THROW(ValueError) << "file name " << path << " must stay in the session directory";
    }
    return dir + "/" + path;
  };
  Function::SetGlobal("tvm.rpc.server.workpath", Function::FromTyped(workpath), true);
  Function::SetGlobal("tvm.rpc.server.load_module",
                      Function::FromTyped([workpath](const String& name) {
                        String path = workpath(name);
                        Say("load_module " + std::string(path));
                        return tvm::ffi::Module::LoadFromFile(path);
                      }),
                      true);
}

[[noreturn]] void ServeSession(int fd, const std::string& dir) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the server
  if (chdir(dir.c_str()) != 0) _exit(3);
  RegisterSessionFunctions(dir);
  try {
    Function loop = Function::GetGlobalRequired("rpc.ServerLoop");
    loop(fd);
  } catch (const std::exception& exc) {
    std::fprintf(stderr, "deploy-rpc-server: session failed: %s\n", exc.what());
    _exit(1);
  }
  _exit(0);
}

// Set by SIGTERM, SIGINT or SIGHUP (deploy stops its server's process group with SIGTERM): the
// server ends the session in progress, removes its directory and exits, instead of dying with
// the directory left behind.
volatile sig_atomic_t g_stop = 0;

void OnStop(int) { g_stop = 1; }

// --parent: stop as on SIGTERM once this pid is no longer our parent. Polled (the loop below
// waits for a client 200 ms at a time), not watched by a thread: qemu-user aborts a fork made
// after the guest started a thread ("cpu == current_cpu").
pid_t g_parent = 0;

bool Stopping() { return g_stop || (g_parent > 0 && getppid() != g_parent); }

void CatchStops() {
  struct sigaction action = {};
  action.sa_handler = OnStop;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a blocked accept or read returns, and the loop sees it
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &action, nullptr);
}

// Wait for the session's child; kill it when it outlives `timeout_s` (0: no limit) or the server
// is told to stop.
void AwaitSession(pid_t child, int fd, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (Stopping()) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      return;
    }
    if (timeout_s > 0 && std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      auto notify = Function::GetGlobal("rpc.ReturnException");
      if (notify) {
        (*notify)(fd, "RPCSessionTimeoutError: Your " + std::to_string(timeout_s) +
                          "s session has expired, try to increase the \"session_timeout\" value.");
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) { return remove(path); }

int Listen(Options* opt) {
  for (int port = opt->port; port < opt->port_end; ++port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, opt->host.c_str(), &addr.sin_addr) != 1) Fail("bad --host " + opt->host);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd, 8) == 0) {
      opt->port = port;
      return fd;
    }
    close(fd);
  }
  Fail("no free port in " + std::to_string(opt->port) + ".." + std::to_string(opt->port_end - 1));
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = ParseArgs(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  CatchStops();
  g_parent = opt.parent;
  int listener = Listen(&opt);
  Say("bind to " + opt.host + ":" + std::to_string(opt.port));
  while (!Stopping()) {
    pollfd waiting = {listener, POLLIN, 0};
    if (poll(&waiting, 1, 200) <= 0) continue;  // a stop, or time to look at the parent again
    int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    double timeout_s = 0;
    if (g_stop || !Handshake(fd, opt.key, &timeout_s)) {
      close(fd);
      continue;
    }
    std::string dir = opt.work_dir + "/deploy-session-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) Fail("cannot create a session directory in " + opt.work_dir);
    Say("session start");
    pid_t child = fork();
    if (child == 0) {
      for (int sig : {SIGTERM, SIGINT, SIGHUP}) signal(sig, SIG_DFL);  // a stop ends the session
      close(listener);
      ServeSession(fd, dir);
    }
    if (child > 0) AwaitSession(child, fd, timeout_s);
    close(fd);
    nftw(dir.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
    Say("session end");
  }
  return 0;
}
