// fusedserve_wakeup_bench: the latency floor a host gives an RPC server, with
// no gRPC involved. Every hop between threads in a request's path costs one
// of these; on some VMs (a futex wake of an idle vCPU is an IPI and a VM exit)
// they cost tens of µs each, which is the budget of a whole FusedOp.
//
//   futex ping-pong      two threads hand a token back and forth through
//                        absl::Mutex + CondVar (each hop: futex wake + sleep)
//   eventfd+epoll        the same through an eventfd watched by epoll_wait
//                        (how gRPC's iomgr kicks a sleeping poller)
//   spin ping-pong       the same through an atomic, both threads spinning
//                        (no sleep, no syscall: the cache-line transfer floor)
//   tcp blocking         TCP loopback echo, blocking send/recv, TCP_NODELAY
//   tcp busy-poll srv    the echo server spins on non-blocking recv; the
//                        client blocks (a polling server, a sleeping client)
//   tcp busy-poll both   both ends spin on non-blocking recv (no sleeps at all)
//
// Each row is a round trip (two hops), measured --iterations times after a
// warm-up. --cpus=A,B pins the two threads (default: unpinned).
//
//   fusedserve_wakeup_bench [--iterations=20000] [--payloads=1,8192] [--cpus=0,1]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

ABSL_FLAG(int, iterations, 20000, "Measured round trips per row");
ABSL_FLAG(int, warmup, 2000, "Unmeasured round trips before each row");
ABSL_FLAG(std::string, payloads, "1,8192", "TCP payload sizes in bytes, comma-separated");
ABSL_FLAG(std::string, cpus, "", "Pin the two threads to these CPUs, e.g. 0,1 (default: unpinned)");

namespace {

using Clock = std::chrono::steady_clock;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int g_cpu[2] = {-1, -1};

void Pin(int which) {
  if (g_cpu[which] < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(g_cpu[which], &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    std::fprintf(stderr, "warning: cannot pin to CPU %d\n", g_cpu[which]);
  }
}

struct Stats {
  double p50 = 0, p99 = 0, mean = 0, min = 0;
};

Stats Summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()))]; };
  s.p50 = pct(50);
  s.p99 = pct(99);
  s.min = v.front();
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  return s;
}

void PrintRow(const std::string& name, const std::string& payload, const Stats& s) {
  std::printf("%-22s %9s %10.2f %10.2f %10.2f %10.2f\n", name.c_str(), payload.c_str(), s.p50, s.p99, s.mean, s.min);
  std::fflush(stdout);
}

// Runs `round_trip` warmup + iterations times on the calling thread (pinned
// as thread 0) and returns the latencies, µs.
std::vector<double> Time(const std::function<void()>& round_trip) {
  const int warm = absl::GetFlag(FLAGS_warmup), n = absl::GetFlag(FLAGS_iterations);
  std::vector<double> out;
  out.reserve(n);
  for (int i = 0; i < warm + n; ++i) {
    const Clock::time_point t0 = Clock::now();
    round_trip();
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (i >= warm) out.push_back(us);
  }
  return out;
}

// ---- thread to thread --------------------------------------------------------

Stats FutexPingPong() {
  absl::Mutex mu;
  absl::CondVar cv;
  int64_t ping = 0, pong = 0;  // guarded by mu
  bool stop = false;
  std::thread peer([&] {
    Pin(1);
    int64_t seen = 0;
    absl::MutexLock lock(&mu);
    for (;;) {
      while (ping == seen && !stop) cv.Wait(&mu);
      if (stop) return;
      seen = ping;
      pong = seen;
      cv.SignalAll();
    }
  });
  Pin(0);
  int64_t i = 0;
  std::vector<double> lat = Time([&] {
    absl::MutexLock lock(&mu);
    ping = ++i;
    cv.SignalAll();
    while (pong != i) cv.Wait(&mu);
  });
  {
    absl::MutexLock lock(&mu);
    stop = true;
    cv.SignalAll();
  }
  peer.join();
  return Summarize(std::move(lat));
}

Stats EventfdPingPong() {
  const int to_peer = eventfd(0, EFD_NONBLOCK), to_main = eventfd(0, EFD_NONBLOCK);
  std::atomic<bool> stop{false};
  auto wait_on = [](int efd, int ep) {
    uint64_t v;
    for (;;) {
      if (read(efd, &v, sizeof(v)) == sizeof(v)) return;
      epoll_event ev;
      epoll_wait(ep, &ev, 1, -1);
    }
  };
  auto make_epoll = [](int efd) {
    const int ep = epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = efd;
    epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev);
    return ep;
  };
  const int ep_peer = make_epoll(to_peer), ep_main = make_epoll(to_main);
  const uint64_t one = 1;
  std::thread peer([&] {
    Pin(1);
    for (;;) {
      wait_on(to_peer, ep_peer);
      if (stop.load()) return;
      if (write(to_main, &one, sizeof(one)) != sizeof(one)) return;
    }
  });
  Pin(0);
  std::vector<double> lat = Time([&] {
    if (write(to_peer, &one, sizeof(one)) != sizeof(one)) std::perror("write");
    wait_on(to_main, ep_main);
  });
  stop = true;
  if (write(to_peer, &one, sizeof(one)) != sizeof(one)) std::perror("write");
  peer.join();
  for (int fd : {to_peer, to_main, ep_peer, ep_main}) close(fd);
  return Summarize(std::move(lat));
}

Stats SpinPingPong() {
  alignas(64) std::atomic<int64_t> ping{0};
  alignas(64) std::atomic<int64_t> pong{0};
  std::thread peer([&] {
    Pin(1);
    int64_t seen = 0;
    for (;;) {
      int64_t v;
      while ((v = ping.load(std::memory_order_acquire)) == seen) CpuRelax();
      if (v < 0) return;
      seen = v;
      pong.store(v, std::memory_order_release);
    }
  });
  Pin(0);
  int64_t i = 0;
  std::vector<double> lat = Time([&] {
    ping.store(++i, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != i) CpuRelax();
  });
  ping.store(-1, std::memory_order_release);
  peer.join();
  return Summarize(std::move(lat));
}

// ---- TCP loopback -------------------------------------------------------------

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Receives exactly n bytes; spins on MSG_DONTWAIT when `poll`. False on EOF/error.
bool RecvAll(int fd, char* buf, size_t n, bool poll) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = recv(fd, buf + got, n - got, poll ? MSG_DONTWAIT : 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (poll) CpuRelax();
    } else {
      return false;
    }
  }
  return true;
}

bool SendAll(int fd, const char* buf, size_t n) {
  size_t sent = 0;
  while (sent < n) {
    const ssize_t r = send(fd, buf + sent, n - sent, MSG_NOSIGNAL);
    if (r > 0) {
      sent += static_cast<size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      CpuRelax();
    } else {
      return false;
    }
  }
  return true;
}

// One echo connection; `server_poll` / `client_poll` spin on non-blocking recv.
Stats TcpEcho(size_t payload, bool server_poll, bool client_poll) {
  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(lfd, 1) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("tcp listen");
    return {};
  }
  std::thread server([&] {
    Pin(1);
    const int fd = accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    NoDelay(fd);
    std::vector<char> buf(payload);
    while (RecvAll(fd, buf.data(), payload, server_poll) && SendAll(fd, buf.data(), payload)) {
    }
    close(fd);
  });
  Pin(0);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("tcp connect");
    server.join();
    return {};
  }
  NoDelay(fd);
  std::vector<char> out(payload, 'x'), in(payload);
  bool ok = true;
  std::vector<double> lat =
      Time([&] { ok = ok && SendAll(fd, out.data(), payload) && RecvAll(fd, in.data(), payload, client_poll); });
  close(fd);
  server.join();
  close(lfd);
  if (!ok) std::fprintf(stderr, "warning: tcp echo failed\n");
  return Summarize(std::move(lat));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("fusedserve_wakeup_bench [--iterations=N] [--payloads=1,8192] [--cpus=A,B]");
  absl::ParseCommandLine(argc, argv);
  std::vector<size_t> payloads;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_payloads), ',', absl::SkipWhitespace())) {
    size_t v = 0;
    if (!absl::SimpleAtoi(p, &v) || v < 1) {
      std::fprintf(stderr, "bad --payloads entry '%s'\n", std::string(p).c_str());
      return 2;
    }
    payloads.push_back(v);
  }
  const std::string cpus = absl::GetFlag(FLAGS_cpus);
  if (!cpus.empty()) {
    std::vector<std::string> parts = absl::StrSplit(cpus, ',');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &g_cpu[0]) || !absl::SimpleAtoi(parts[1], &g_cpu[1])) {
      std::fprintf(stderr, "--cpus needs two CPU numbers, e.g. 0,1\n");
      return 2;
    }
  }
  std::printf("round trips (two hops), %d iterations each, %u CPUs online, threads %s\n",
              absl::GetFlag(FLAGS_iterations), std::thread::hardware_concurrency(),
              cpus.empty() ? "unpinned" : ("pinned to " + cpus).c_str());
  std::printf("%-22s %9s %10s %10s %10s %10s\n", "test", "payload_B", "p50_us", "p99_us", "mean_us", "min_us");
  PrintRow("futex ping-pong", "-", FutexPingPong());
  PrintRow("eventfd+epoll", "-", EventfdPingPong());
  PrintRow("spin ping-pong", "-", SpinPingPong());
  for (size_t p : payloads) PrintRow("tcp blocking", std::to_string(p), TcpEcho(p, false, false));
  for (size_t p : payloads) PrintRow("tcp busy-poll srv", std::to_string(p), TcpEcho(p, true, false));
  for (size_t p : payloads) PrintRow("tcp busy-poll both", std::to_string(p), TcpEcho(p, true, true));
  return 0;
}
