#pragma once
// nxd-bench-serve's servers: a server it starts (a child process with its output in a log file,
// ready once GET /health answers 200, stopped with SIGTERM and, after 15 s, SIGKILL) or one it
// connects to (host:port, nothing started or stopped).
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace nxd::bench::serve {

struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 0;
};

// "host:port" or ":port" / "port" (host 127.0.0.1); InvalidArgument naming the value otherwise.
Endpoint parse_endpoint(const std::string& flag, const std::string& v);

// A TCP port that was free a moment ago on 127.0.0.1 (bound to port 0, then closed).
int free_port();

struct StartOptions {
  std::vector<std::string> argv;                         // the program and its arguments
  std::vector<std::pair<std::string, std::string>> env;  // set on top of this process's
  std::filesystem::path log;                             // stdout and stderr
  Endpoint at;                                           // where it will listen
  double ready_timeout_s = 300;  // llama-server loads the model before /health says 200
};

class ServerProcess {
 public:
  // Starts and waits until ready; Error with the log's tail if it exits or never gets ready.
  explicit ServerProcess(StartOptions o);
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess();  // stop()
  void stop();
  const Endpoint& endpoint() const { return o_.at; }

 private:
  StartOptions o_;
  pid_t pid_ = -1;
};

// Waits until GET /health answers 200 (false after timeout_s).
bool wait_ready(const Endpoint& at, double timeout_s, pid_t child = -1);

}  // namespace nxd::bench::serve
