// Metrics::DeferScope: updates made inside one wait until the outermost one
// ends, on that thread only, and what overflows its capacity is made at once.
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "telemetry/metrics.h"

namespace fusedserve {
namespace {

// The value of one exposed sample, e.g. `fusedserve_fused_op_stage_seconds_count{stage="decode"}`; -1 if absent.
double Sample(Metrics& m, const std::string& series) {
  const std::string text = prometheus::TextSerializer().Serialize(m.registry().Collect());
  const size_t at = text.find(series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 1));
}

const char kDecodeCount[] = "fusedserve_fused_op_stage_seconds_count{stage=\"decode\"}";
const char kRequests[] = "fusedserve_requests_total{code=\"OK\",op=\"rms_norm\",rpc=\"FusedOp\"}";

TEST(MetricsDeferScope, UpdatesWaitForTheOutermostScope) {
  Metrics m;
  m.RecordStage(Metrics::Stage::kDecode, 1e-6);
  EXPECT_EQ(Sample(m, kDecodeCount), 1);
  {
    Metrics::DeferScope outer;
    m.RecordStage(Metrics::Stage::kDecode, 1e-6);
    m.RecordRequest("FusedOp", "rms_norm", "OK", 1e-5);
    {
      Metrics::DeferScope inner;
      m.RecordStage(Metrics::Stage::kDecode, 1e-6);
    }
    EXPECT_EQ(Sample(m, kDecodeCount), 1);  // the inner scope's end flushed nothing
    // The series exists (looked up at once) but is not incremented yet.
    EXPECT_EQ(Sample(m, kRequests), 0);
    // Another thread's updates are its own: made at once.
    std::thread([&m] { m.RecordStage(Metrics::Stage::kDecode, 1e-6); }).join();
    EXPECT_EQ(Sample(m, kDecodeCount), 2);
  }
  EXPECT_EQ(Sample(m, kDecodeCount), 4);
  EXPECT_EQ(Sample(m, kRequests), 1);
  m.RecordStage(Metrics::Stage::kDecode, 1e-6);  // no scope: at once again
  EXPECT_EQ(Sample(m, kDecodeCount), 5);
}

TEST(MetricsDeferScope, UpdatesBeyondItsCapacityAreMadeAtOnce) {
  Metrics m;
  constexpr int kExtra = 5;
  {
    Metrics::DeferScope defer;
    for (int i = 0; i < Metrics::kMaxDeferred + kExtra; ++i) m.RecordStage(Metrics::Stage::kDecode, 1e-6);
    EXPECT_EQ(Sample(m, kDecodeCount), kExtra);
  }
  EXPECT_EQ(Sample(m, kDecodeCount), Metrics::kMaxDeferred + kExtra);
}

}  // namespace
}  // namespace fusedserve
