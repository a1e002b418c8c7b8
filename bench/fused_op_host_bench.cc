// What a FusedOp round trip costs on the host outside gRPC and the kernel:
// each stage of the hot path on its own, nanoseconds per call (median of 9
// runs of `iters` calls), for the load generator's message (rms_norm bf16
// [1,4096] unless --op/--shape say otherwise). The stages are those of the
// async server's path: parse the body from gRPC's slices, validate it into an
// OpRequest, build the scheduler's task, the backend-independent part of a
// launch (output shapes, tuning key), build the result, encode it, record
// the stage histograms, read the clock (FastNow; absl::Now() beside it,
// not summed), and parse + validate into a staging block (not summed), hot
// and cold (caches evicted before each call, as the server meets it).
// No GPU needed.
//   fused_op_host_bench [--op=rms_norm] [--shape=1,4096] [--iters=20000] [--evict_mib=8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kernels/backend.h"
#include "kernels/clock.h"
#include "server/fused_op_wire.h"
#include "server/scheduler.h"
#include "server/validation.h"
#include "telemetry/metrics.h"
#include "warmup/tuning_cache.h"

ABSL_FLAG(std::string, op, "rms_norm", "op");
ABSL_FLAG(std::string, shape, "1,4096", "its tuning key (e.g. M,H)");
ABSL_FLAG(int, iters, 20000, "calls per run");
ABSL_FLAG(int, evict_mib, 8, "cold rows: MiB of other memory read before each call");

namespace fusedserve {
namespace {

// Median ns per call of fn over 9 runs.
double NsPerCall(int iters, const std::function<void()>& fn) {
  std::vector<double> runs;
  for (int r = 0; r < 9; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    const auto t1 = std::chrono::steady_clock::now();
    runs.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / iters);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

int Main() {
  std::vector<int64_t> key;
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_shape), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(d, &v)) {
      std::fprintf(stderr, "bad --shape\n");
      return 2;
    }
    key.push_back(v);
  }
  const std::string op = absl::GetFlag(FLAGS_op);
  const int iters = absl::GetFlag(FLAGS_iters);
  const OpRequest sample = MakeRandomRequest(op, DType::kBF16, key, 1);
  std::string bytes;
  if (!OpRequestToProto(sample).SerializeToString(&bytes)) return 1;
  grpc::Slice slice(bytes.data(), bytes.size());
  const grpc::ByteBuffer body(&slice, 1);
  const ValidationLimits limits;

  WireFusedOp wire;
  absl::StatusOr<OpRequest> decoded =
      ParseFusedOpWire(body, &wire) ? ValidateWireFusedOp(wire, limits) : absl::InvalidArgumentError("not parsed");
  if (!decoded.ok()) {
    std::fprintf(stderr, "the sample does not decode: %s\n", std::string(decoded.status().message()).c_str());
    return 1;
  }
  const OpRequest request = *std::move(decoded);
  // The result a launch returns: the outputs at their shapes.
  TensorMap outputs;
  for (const auto& [name, shape] : OutputShapes(request)) {
    HostTensor t;
    t.dtype = DType::kBF16;
    t.shape = shape;
    t.data.assign(t.numel() * DTypeSize(t.dtype), '\x11');
    outputs[name] = std::move(t);
  }
  Metrics metrics;

  std::printf("# %s bf16 key %s: %zu request bytes; ns per call, median of 9 runs of %d\n", op.c_str(),
              absl::GetFlag(FLAGS_shape).c_str(), bytes.size(), iters);
  std::printf("%-28s %10s\n", "stage", "ns");
  double total = 0;
  auto row = [&](const char* name, double ns) {
    total += ns;
    std::printf("%-28s %10.0f\n", name, ns);
  };
  const double parse = NsPerCall(iters, [&] { ParseFusedOpWire(body, &wire); });
  row("parse (slices -> wire)", parse);
  const double parse_validate = NsPerCall(iters, [&] {
    ParseFusedOpWire(body, &wire);
    absl::StatusOr<OpRequest> r = ValidateWireFusedOp(wire, limits);
  });
  row("validate (wire -> request)", parse_validate - parse);
  OpRequest copy = request;
  row("task (request moved in)", NsPerCall(iters, [&] {
        OpTask task;
        task.request = std::move(copy);
        task.enqueued = FastNow();
        task.interrupted = [&copy]() { return absl::OkStatus(); };
        task.done = [&copy](absl::StatusOr<TensorMap>) {};
        copy = std::move(task.request);
      }));
  row("output shapes + dtype", NsPerCall(iters, [&] {
        OutputShapeList l = OutputShapes(request);
        DType d = RequestDType(request);
        (void)d;
      }));
  row("tuning key", NsPerCall(iters, [&] { std::vector<int64_t> k = TuningKey(request); }));
  // The tuned-config lookup a launch makes (a cache of 64 entries, this one among them).
  std::unique_ptr<TuningCache> cache = TuningCache::Open("", CacheStamp{});
  for (int i = 0; i < 64; ++i) {
    TuningEntry e;
    e.op = op;
    e.dtype = DType::kBF16;
    e.key = key;
    e.key.back() += i;
    e.config = "threads=256,vecs=2";
    cache->Put(e);
  }
  row("tuned config lookup",
      NsPerCall(iters, [&] { std::string c = cache->LookupConfig(op, DType::kBF16, TuningKey(request)); }));
  grpc::ByteBuffer response;
  // The stages timed hot here and cold below.
  auto encode_result = [&] {
    TensorMap result = outputs;  // the backend's result, handed over
    EncodeFusedOpWire(std::move(result), "cuda", &response);
    response.Clear();  // gRPC done with it
  };
  auto observe_stages = [&] {
    for (int s = 0; s < Metrics::kStages; ++s) metrics.RecordStage(static_cast<Metrics::Stage>(s), 1e-5);
  };
  auto record_request = [&] { metrics.RecordRequest("FusedOp", op, "OK", 1e-4); };
  row("result + encode + release", NsPerCall(iters, encode_result));
  row("8 stage observations", NsPerCall(iters, observe_stages));
  row("request metric", NsPerCall(iters, record_request));
  // The path's clock, and absl::Now(), which it read before.
  row("10 x FastNow()", NsPerCall(iters, [&] {
        for (int i = 0; i < 10; ++i) {
          absl::Time t = FastNow();
          (void)t;
        }
      }));
  std::printf("%-28s %10.0f\n", "sum", total);
  // Parse and validate into a staging block (the CUDA backend's are pinned,
  // this one is ordinary memory): the tensors' own buffers are not made.
  std::vector<char> staging_bytes(2 * bytes.size() + 4096);
  auto staging = std::make_shared<StagingBlock>();
  staging->host = staging->device = staging_bytes.data();
  staging->size = staging_bytes.size();
  auto parse_validate_staged = [&] {
    staging->used = 0;
    ParseFusedOpWire(body, &wire, staging);
    absl::StatusOr<OpRequest> r = ValidateWireFusedOp(wire, limits);
    wire.DropStaging();
  };
  const double staged = NsPerCall(iters, parse_validate_staged);
  std::printf("%-28s %10.0f  (not in the sum; parse + validate above: %.0f)\n", "parse + validate, staged", staged,
              parse_validate);
  // The same with the body as the server may get it, for the gap between
  // this bench and the server's receive + decode stages: cut into gRPC-like
  // slices, and (cold) one of 64 copies in turn, each into one of 8 blocks,
  // so that no body or block is in the caches when it is parsed.
  auto staged_bodies = [&](size_t piece, int copies) {
    std::vector<grpc::ByteBuffer> bodies;
    for (int c = 0; c < copies; ++c) {
      std::vector<grpc::Slice> slices;
      for (size_t i = 0; i < bytes.size(); i += piece) {
        slices.emplace_back(bytes.data() + i, std::min(piece, bytes.size() - i));
      }
      bodies.emplace_back(slices.data(), slices.size());
    }
    std::vector<std::vector<char>> block_bytes(8, std::vector<char>(2 * bytes.size() + 4096));
    std::vector<std::shared_ptr<StagingBlock>> blocks;
    for (std::vector<char>& b : block_bytes) {
      blocks.push_back(std::make_shared<StagingBlock>());
      blocks.back()->host = blocks.back()->device = b.data();
      blocks.back()->size = b.size();
    }
    size_t n = 0;
    return NsPerCall(iters, [&] {
      StagingBlock& b = *blocks[n % blocks.size()];
      b.used = 0;
      ParseFusedOpWire(bodies[n % bodies.size()], &wire, blocks[n % blocks.size()]);
      absl::StatusOr<OpRequest> r = ValidateWireFusedOp(wire, limits);
      wire.DropStaging();
      ++n;
    });
  };
  std::printf("%-28s %10.0f  (not in the sum)\n", "  the body in 1 KiB slices", staged_bodies(1024, 1));
  std::printf("%-28s %10.0f  (not in the sum)\n", "  64 bodies, 8 blocks (cold)", staged_bodies(bytes.size(), 64));
  // Cold: each call timed on its own after a walk over --evict_mib of other
  // memory, which leaves the path's code and data out of L1 and L2, as
  // between two requests at c=1 (the gRPC and TCP work in between, and a
  // sleeping poller's core). Medians of iters/20 calls; not in the sum.
  std::vector<char> evict(static_cast<size_t>(absl::GetFlag(FLAGS_evict_mib)) << 20, 1);
  long sink = 0;
  auto cold = [&](const char* what, const std::function<void()>& fn) {
    std::vector<double> ns;
    for (int i = 0; i < std::max(1, iters / 20); ++i) {
      for (size_t j = 0; j < evict.size(); j += 64) sink += evict[j];
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ns.begin(), ns.end());
    std::printf("%-28s %10.0f  (cold, not in the sum)\n", what, ns[ns.size() / 2]);
  };
  cold("parse + validate, staged", parse_validate_staged);
  cold("  the op's name looked up", [&] { sink += FindOpSpec(op) != nullptr; });
  cold("8 stage observations", observe_stages);
  cold("request metric", record_request);
  cold("result + encode + release", encode_result);
  if (sink == 42) std::printf(" ");  // keeps the walks
  std::printf("%-28s %10.0f  (not in the sum)\n", "10 x absl::Now()", NsPerCall(iters, [&] {
                for (int i = 0; i < 10; ++i) {
                  absl::Time t = absl::Now();
                  (void)t;
                }
              }));
  return 0;
}

}  // namespace
}  // namespace fusedserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fusedserve::Main();
}
