// Test support: runs the real fusedserve binary as a child process on free
// loopback ports and talks to it over real gRPC and HTTP.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fusedserve/v1/fusedserve.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "kernels/op.h"

namespace fusedserve::testing {

// A free TCP port on 127.0.0.1 (bound then released).
int FreePort();

// GET http://127.0.0.1:port/path; returns the body ("" on failure).
std::string HttpGet(int port, const std::string& path);

// Scrapes http://127.0.0.1:metrics_port/metrics until `pred` holds or 10 s
// pass; returns the last scrape. For updates made after the client has its
// answer (a FusedOp call's metrics land just after its response is written).
std::string ScrapeUntil(int metrics_port, const std::function<bool(const std::string&)>& pred);

class ServerProcess {
 public:
  // Starts $FUSEDSERVE_BIN serve --device=cpu on free ports with `flags`
  // appended and waits until health reports SERVING. Fails the test (returns
  // nullptr) if it does not within timeout_s. $FUSEDSERVE_TEST_SERVER_FLAGS
  // (space-separated) go before `flags`: on a GPU host,
  // FUSEDSERVE_TEST_SERVER_FLAGS=--device=cuda runs a test against the CUDA
  // backend.
  // `credentials` (default: plaintext) are used for the test's own channel,
  // e.g. TLS credentials for a server started with --tls_cert.
  static std::unique_ptr<ServerProcess> Start(const std::vector<std::string>& flags = {}, double timeout_s = 60,
                                              std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  // Starts $FUSEDSERVE_BIN `mode` like Start but returns at once, without
  // waiting for the port or SERVING (start-up and exit tests); channel() is
  // unset.
  static std::unique_ptr<ServerProcess> Spawn(const std::vector<std::string>& flags, const std::string& mode = "serve");
  // A new channel to the server with other credentials (TLS tests).
  std::shared_ptr<grpc::Channel> NewChannel(std::shared_ptr<grpc::ChannelCredentials> credentials) const;
  ~ServerProcess();

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::unique_ptr<v1::FusedServe::Stub> stub() const { return v1::FusedServe::NewStub(channel_); }
  // Overall health ("" service); UNKNOWN when the call fails.
  grpc::health::v1::HealthCheckResponse::ServingStatus Health() const;

  void Signal(int sig) const;
  // Exit code, or -1 if still running after timeout_s (or killed by a signal).
  int WaitExit(double timeout_s);
  // The server's stderr so far.
  std::string Log() const;

 private:
  // One start; a server that exits because its port was taken sets
  // *port_taken (when given) instead of failing the test.
  static std::unique_ptr<ServerProcess> StartOnce(const std::vector<std::string>& flags, double timeout_s,
                                                  std::shared_ptr<grpc::ChannelCredentials> credentials,
                                                  bool* port_taken);
  ServerProcess() = default;
  pid_t pid_ = -1;
  bool exited_ = false;
  int port_ = 0;
  int metrics_port_ = 0;
  std::string log_path_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace fusedserve::testing
