// The /metrics HTTP endpoint under idle and half-open connections: such
// clients may hold worker threads only until the request timeout, and
// scrapes keep working meanwhile (docs/reliability.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace fusedserve {
namespace {

using testing::ServerProcess;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A TCP connection to 127.0.0.1:port that has sent `prefix` (maybe nothing), or -1.
int Stall(int port, const std::string& prefix) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (!prefix.empty() && write(fd, prefix.data(), prefix.size()) != static_cast<ssize_t>(prefix.size()))) {
    close(fd);
    return -1;
  }
  return fd;
}

// GET /metrics with a deadline on the whole exchange; the status line
// ("HTTP/1.1 200 OK") and body, or "" if it did not finish in time.
std::string Scrape(int port, double timeout_s, std::string* body) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  const int fd = Stall(port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (fd < 0) return "";
  std::string response;
  char buf[65536];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const int left_ms =
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (poll(&p, 1, left_ms > 0 ? left_ms : 0) <= 0) break;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) {
      close(fd);
      const size_t end = response.find("\r\n");
      const size_t head = response.find("\r\n\r\n");
      if (end == std::string::npos || head == std::string::npos) return "";
      *body = response.substr(head + 4);
      return response.substr(0, end);
    }
    response.append(buf, n);
  }
  close(fd);
  return "";
}

// Waits until the server closes fd (EOF or reset, after whatever error
// response it sends); false after timeout_s.
bool ClosedByServer(int fd, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) < 0) return false;
    if (p.revents != 0 && read(fd, buf, sizeof(buf)) <= 0) return true;
  }
  return false;
}

// Half of the stalled clients send nothing, half an unfinished request line.
std::vector<int> StallMany(int port, int count) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    const int fd = Stall(port, i % 2 == 0 ? "" : "GET /metr");
    EXPECT_GE(fd, 0);
    if (fd >= 0) fds.push_back(fd);
  }
  return fds;
}

// 8 stalled connections (4x the exposer's old 2 threads) with the default
// thread count: scrapes answer at once, and the stalled ones are closed by
// the request timeout.
TEST(MetricsHttpTest, StalledConnectionsDoNotBlockScrapes) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--metrics_request_timeout_ms=1500"});
  ASSERT_NE(server, nullptr);
  const std::vector<int> stalled = StallMany(server->metrics_port(), 8);
  // Give the server time to hand every stalled connection to a worker.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  Clock::time_point t = Clock::now();
  std::string body;
  EXPECT_EQ(Scrape(server->metrics_port(), 5, &body), "HTTP/1.1 200 OK");
  EXPECT_LT(SecondsSince(t), 1.0);
  EXPECT_NE(body.find("fusedserve_ready 1"), std::string::npos) << body.substr(0, 300);

  t = Clock::now();
  for (int fd : stalled) {
    EXPECT_TRUE(ClosedByServer(fd, 5)) << "a stalled connection is still open after " << SecondsSince(t) << " s";
    close(fd);
  }
  EXPECT_EQ(Scrape(server->metrics_port(), 5, &body), "HTTP/1.1 200 OK");
}

// More stalled connections than threads: a scrape waits its turn, but only
// until the request timeout frees the workers, never for good.
TEST(MetricsHttpTest, MoreStalledConnectionsThanThreadsDelayScrapesUntilTimeout) {
  std::unique_ptr<ServerProcess> server =
      ServerProcess::Start({"--metrics_threads=2", "--metrics_request_timeout_ms=500"});
  ASSERT_NE(server, nullptr);
  const std::vector<int> stalled = StallMany(server->metrics_port(), 8);
  const Clock::time_point t = Clock::now();
  std::string body;
  // 8 stalled on 2 workers: four rounds of 0.5 s before the scrape's turn.
  EXPECT_EQ(Scrape(server->metrics_port(), 10, &body), "HTTP/1.1 200 OK");
  EXPECT_LT(SecondsSince(t), 6.0);
  for (int fd : stalled) close(fd);
}

TEST(MetricsHttpTest, BadKnobsStopStartup) {
  const char* bin = std::getenv("FUSEDSERVE_BIN");
  ASSERT_NE(bin, nullptr);
  for (const char* flag : {"--metrics_threads=0", "--metrics_request_timeout_ms=0"}) {
    const std::string cmd = std::string(bin) + " --device=cpu --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 " +
                            "--tuning_cache= " + flag + " >/dev/null 2>&1";
    EXPECT_NE(std::system(cmd.c_str()), 0) << flag;
  }
}

}  // namespace
}  // namespace fusedserve
