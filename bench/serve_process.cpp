#include "serve_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "nxd/runtime/error.h"

namespace nxd::bench::serve {

namespace {

std::string log_tail(const std::filesystem::path& log) {
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
}

double now() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

}  // namespace

Endpoint parse_endpoint(const std::string& flag, const std::string& v) {
  Endpoint e;
  const size_t colon = v.rfind(':');
  const std::string port = colon == std::string::npos ? v : v.substr(colon + 1);
  if (colon != std::string::npos && colon > 0) e.host = v.substr(0, colon);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  NXD_CHECK(!port.empty() && *end == '\0' && p > 0 && p < 65536, "[nxd-bench-serve] ", flag, " ", v,
            ": expected host:port");
  e.port = static_cast<int>(p);
  return e;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("[nxd-bench-serve] socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw Error("[nxd-bench-serve] could not find a free port");
  }
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

bool wait_ready(const Endpoint& at, double timeout_s, pid_t child) {
  const double end = now() + timeout_s;
  while (now() < end) {
    if (child > 0) {
      int status = 0;
      if (::waitpid(child, &status, WNOHANG) == child) return false;
    }
    httplib::Client c(at.host, at.port);
    c.set_connection_timeout(1);
    c.set_read_timeout(2);
    if (auto r = c.Get("/health"); r && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

ServerProcess::ServerProcess(StartOptions o) : o_(std::move(o)) {
  NXD_CHECK(!o_.argv.empty(), "[nxd-bench-serve] no program to start");
  std::vector<char*> args;
  for (auto& a : o_.argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int log = ::open(o_.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (log < 0) throw Error(str("[nxd-bench-serve] cannot write ", o_.log.string()));
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(log, 1);
    ::dup2(log, 2);
    for (const auto& [k, v] : o_.env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "exec %s failed\n", args[0]);
    ::_exit(127);
  }
  ::close(log);
  if (pid_ < 0) throw Error(str("[nxd-bench-serve] fork failed for ", o_.argv[0]));
  if (!wait_ready(o_.at, o_.ready_timeout_s, pid_)) {
    stop();
    throw Error(str("[nxd-bench-serve] ", o_.argv[0], " did not get ready on port ", o_.at.port,
                    "; its log (", o_.log.string(), ") ends:\n", log_tail(o_.log)));
  }
}

void ServerProcess::stop() {
  if (pid_ <= 0) return;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == 0) {
    ::kill(pid_, SIGTERM);
    const double end = now() + 15;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (now() > end) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  pid_ = -1;
}

ServerProcess::~ServerProcess() {
  stop();
}

}  // namespace nxd::bench::serve
