// fusedserve_grpc_ab: one sync client, one call at a time, alternating
// between two servers in chunks of --chunk calls, so that both are measured
// in the same stretch of the host's time. On a VM the round trip of a bare
// echo moves by a third from one two-second round to the next
// (run_grpc_floor.sh's rounds), which pairing whole rounds cannot cancel;
// chunks of ~10 ms can. Each chunk's first --skip calls are not counted: the
// server idled while the other chunk ran (its pollers may have gone to
// sleep), and a steady client's next call does not find it so.
// Prints per server the p50/p99 over every counted call and the median of
// the chunk pairs' p50 ratio (B / A).
//   fusedserve_grpc_ab --a=HOST:PORT --b=HOST:PORT [--chunk=200 --skip=20 --duration_s=10]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "fusedserve/v1/fusedserve.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "kernels/op.h"
#include "server/validation.h"

ABSL_FLAG(std::string, a, "127.0.0.1:50351", "first server HOST:PORT (the reference, e.g. the echo)");
ABSL_FLAG(std::string, b, "127.0.0.1:50352", "second server HOST:PORT");
ABSL_FLAG(std::string, label_a, "a", "name of the first server in the table");
ABSL_FLAG(std::string, label_b, "b", "name of the second server in the table");
ABSL_FLAG(int, chunk, 200, "calls to one server before switching to the other");
ABSL_FLAG(int, skip, 20, "calls at the start of each chunk that are not counted");
ABSL_FLAG(double, duration_s, 10, "measured time, seconds");
ABSL_FLAG(double, wait_ready_s, 60, "wait this long for each server to answer a FusedOp");

namespace fusedserve {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

std::unique_ptr<v1::FusedServe::Stub> Connect(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::FusedServe::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
}

// One call's latency in us, or a negative value with the status printed.
double Call(v1::FusedServe::Stub* stub, const v1::FusedOpRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::FusedOpResponse resp;
  const Clock::time_point t0 = Clock::now();
  const grpc::Status st = stub->FusedOp(&ctx, req, &resp);
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (!st.ok()) {
    std::fprintf(stderr, "FusedOp failed: %d %s\n", static_cast<int>(st.error_code()), st.error_message().c_str());
    return -1;
  }
  return us;
}

bool WaitReady(v1::FusedServe::Stub* stub, const v1::FusedOpRequest& req, const std::string& target) {
  const Clock::time_point until =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_wait_ready_s) * 1e3));
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::FusedOpResponse resp;
    const grpc::Status st = stub->FusedOp(&ctx, req, &resp);
    if (st.ok()) return true;
    if (Clock::now() > until) {
      std::fprintf(stderr, "%s not ready: %s\n", target.c_str(), st.error_message().c_str());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

int Main() {
  const std::string targets[2] = {absl::GetFlag(FLAGS_a), absl::GetFlag(FLAGS_b)};
  const std::string labels[2] = {absl::GetFlag(FLAGS_label_a), absl::GetFlag(FLAGS_label_b)};
  const int chunk = std::max(1, absl::GetFlag(FLAGS_chunk));
  const int skip = std::clamp(absl::GetFlag(FLAGS_skip), 0, chunk - 1);
  // The message of run_grpc_floor.sh: rms_norm bf16 [1,4096].
  const v1::FusedOpRequest req = OpRequestToProto(MakeRandomRequest("rms_norm", DType::kBF16, {1, 4096}, 1000));
  std::unique_ptr<v1::FusedServe::Stub> stubs[2] = {Connect(targets[0]), Connect(targets[1])};
  for (int s = 0; s < 2; ++s) {
    if (!WaitReady(stubs[s].get(), req, targets[s])) return 1;
  }
  std::vector<double> all[2];
  std::vector<double> ratios;  // per chunk pair: p50 of b / p50 of a
  const Clock::time_point end =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_duration_s) * 1e3));
  while (Clock::now() < end) {
    double p50[2];
    for (int s = 0; s < 2; ++s) {
      std::vector<double> lat;
      for (int i = 0; i < chunk; ++i) {
        const double us = Call(stubs[s].get(), req);
        if (us < 0) return 1;
        if (i >= skip) lat.push_back(us);
      }
      p50[s] = Percentile(lat, 0.5);
      all[s].insert(all[s].end(), lat.begin(), lat.end());
    }
    ratios.push_back(p50[1] / p50[0]);
  }
  std::printf("rms_norm bf16 [1,4096]; one sync client; %zu chunk pairs of %d calls (first %d of each not counted)\n\n",
              ratios.size(), chunk, skip);
  std::printf("| server | calls | p50 us | p99 us | p99/p50 |\n|---|---|---|---|---|\n");
  for (int s = 0; s < 2; ++s) {
    const double p50 = Percentile(all[s], 0.5), p99 = Percentile(all[s], 0.99);
    std::printf("| %s | %zu | %.1f | %.1f | %.2f |\n", labels[s].c_str(), all[s].size(), p50, p99, p99 / p50);
  }
  std::printf("\n%s / %s, median of the chunk pairs' p50 ratios: %.3f (quartiles %.3f-%.3f)\n", labels[1].c_str(),
              labels[0].c_str(), Percentile(ratios, 0.5), Percentile(ratios, 0.25), Percentile(ratios, 0.75));
  return 0;
}

}  // namespace
}  // namespace fusedserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fusedserve::Main();
}
