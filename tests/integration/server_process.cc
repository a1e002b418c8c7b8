#include "tests/integration/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
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

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/validation.h"

namespace fusedserve::testing {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

namespace {

// A TCP connection to 127.0.0.1:port, or -1.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool PortOpen(int port) {
  const int fd = Connect(port);
  if (fd < 0) return false;
  close(fd);
  return true;
}

}  // namespace

std::string HttpGet(int port, const std::string& path) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

std::string ScrapeUntil(int metrics_port, const std::function<bool(const std::string&)>& pred) {
  std::string m;
  for (int i = 0; i < 200; ++i) {
    m = HttpGet(metrics_port, "/metrics");
    if (pred(m)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return m;
}

std::shared_ptr<grpc::Channel> ServerProcess::NewChannel(std::shared_ptr<grpc::ChannelCredentials> credentials) const {
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(-1);
  // Test certificates name "localhost"; the target is an IP address.
  channel_args.SetSslTargetNameOverride("localhost");
  return grpc::CreateCustomChannel(address(), credentials ? credentials : grpc::InsecureChannelCredentials(),
                                   channel_args);
}

std::unique_ptr<ServerProcess> ServerProcess::Spawn(const std::vector<std::string>& flags, const std::string& mode) {
  const char* bin = std::getenv("FUSEDSERVE_BIN");
  if (bin == nullptr) {
    ADD_FAILURE() << "FUSEDSERVE_BIN is not set (ctest sets it)";
    return nullptr;
  }
  std::unique_ptr<ServerProcess> p(new ServerProcess);
  p->port_ = FreePort();
  p->metrics_port_ = FreePort();
  char tmpl[] = "/tmp/fusedserve-test-XXXXXX";
  const int log_fd = mkstemp(tmpl);
  p->log_path_ = tmpl;

  std::vector<std::string> args = {bin,
                                   mode,
                                   "--device=cpu",
                                   "--listen=127.0.0.1:" + std::to_string(p->port_),
                                   "--metrics_listen=127.0.0.1:" + std::to_string(p->metrics_port_),
                                   "--tuning_cache="};
  if (const char* extra = std::getenv("FUSEDSERVE_TEST_SERVER_FLAGS")) {
    for (absl::string_view f : absl::StrSplit(extra, ' ', absl::SkipEmpty())) args.emplace_back(f);
  }
  args.insert(args.end(), flags.begin(), flags.end());
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(log_fd, STDERR_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    // The test runner may have signals blocked; the server sets up its own.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin, argv.data());
    _exit(127);
  }
  close(log_fd);
  p->pid_ = pid;
  return p;
}

std::unique_ptr<ServerProcess> ServerProcess::Start(const std::vector<std::string>& flags, double timeout_s,
                                                    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  // FreePort's port can be taken by another test's server before this one
  // binds it (ctest runs tests in parallel); the server then exits saying so,
  // and it is started again on other ports.
  for (int attempt = 0;; ++attempt) {
    bool port_taken = false;
    std::unique_ptr<ServerProcess> p = StartOnce(flags, timeout_s, credentials, attempt < 3 ? &port_taken : nullptr);
    if (p != nullptr || !port_taken) return p;
  }
}

std::unique_ptr<ServerProcess> ServerProcess::StartOnce(const std::vector<std::string>& flags, double timeout_s,
                                                        std::shared_ptr<grpc::ChannelCredentials> credentials,
                                                        bool* port_taken) {
  std::unique_ptr<ServerProcess> p = Spawn(flags);
  if (p == nullptr) return nullptr;
  const pid_t pid = p->pid_;
  auto exited = [&] {
    p->exited_ = true;
    const std::string log = p->Log();
    if (port_taken != nullptr &&
        (log.find("cannot listen") != std::string::npos || log.find("in use") != std::string::npos)) {
      *port_taken = true;
      return;
    }
    ADD_FAILURE() << "fusedserve exited during start-up:\n" << log;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  // Create the channel only once the port accepts connections: a channel
  // that saw "connection refused" backs off for seconds before retrying.
  while (std::chrono::steady_clock::now() < deadline && !PortOpen(p->port_)) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      exited();
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  p->channel_ = p->NewChannel(credentials);

  while (std::chrono::steady_clock::now() < deadline) {
    // SERVING from the health service alone is not enough: gRPC's default
    // health service starts out SERVING, and the server can only say
    // NOT_SERVING once BuildAndStart has returned; a probe in between (a
    // loaded machine stretches that window) would let a test call a server
    // still warming up. The log line comes after the server is ready.
    if (p->Health() == grpc::health::v1::HealthCheckResponse::SERVING &&
        p->Log().find("SERVING (warm-up") != std::string::npos) {
      return p;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited();
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "fusedserve did not report SERVING within " << timeout_s << " s:\n" << p->Log();
  return nullptr;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  // FUSEDSERVE_KEEP_TEST_LOGS=1 keeps the server's log for a post-mortem.
  const char* keep = std::getenv("FUSEDSERVE_KEEP_TEST_LOGS");
  if (!log_path_.empty() && (keep == nullptr || keep[0] != '1')) unlink(log_path_.c_str());
}

grpc::health::v1::HealthCheckResponse::ServingStatus ServerProcess::Health() const {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok()) return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  return resp.status();
}

void ServerProcess::Signal(int sig) const { kill(pid_, sig); }

int ServerProcess::WaitExit(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace fusedserve::testing
