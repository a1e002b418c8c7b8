// Shared by the FusedOp fuzz targets: what must hold for every request that
// passes validation. A violated property aborts (libFuzzer reports it as a
// crash and saves the input).
//   1. It is within the cost bounds, and the CPU reference backend runs it
//      without crashing (to the end when cheap, else its first piece: all
//      its allocations, under libFuzzer's malloc limit) and returns exactly
//      the outputs OutputShapes promises.
//   2. The batcher can key it, and two copies merged into one launch split
//      back into two answers identical to running it alone.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "server/batcher.h"
#include "server/validation.h"

namespace fusedserve::fuzz {

inline void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz property violated: %s\n", what);
    std::abort();
  }
}

// The server's limits, with the bytes bound lowered so that everything a
// valid request may allocate fits well under libFuzzer's malloc limit
// (-malloc_limit_mb, default 2048): a request whose real allocations exceed
// its estimate, or a bound that misses a case, is a crash.
inline ValidationLimits FuzzLimits() {
  ValidationLimits limits;
  limits.max_tensor_elements = int64_t{1} << 22;  // 4M elements: 8 MiB of bf16 per tensor
  limits.max_op_bytes = double(int64_t{768} << 20);
  limits.max_output_bytes = double(int64_t{256} << 20);
  return limits;
}

// Validation may refuse with these codes only.
inline bool IsValidationCode(absl::StatusCode c) {
  return c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kResourceExhausted;
}

// A StopCheck that lets the backend run its first piece of work and stops it
// before the second: every allocation of the request happens, the time does not.
class StopAfterFirstPiece {
 public:
  StopCheck check() {
    return [this] { return pieces_++ == 0 ? absl::OkStatus() : absl::AbortedError("fuzz: stopped"); };
  }

 private:
  int pieces_ = 0;
};

inline void CheckValidated(const OpRequest& r) {
  static Backend* cpu = MakeCpuBackend().release();
  std::optional<BatchShape> shape = BatchShapeOf(r);
  Require(shape.has_value(), "a valid request has a batch key");
  Require(shape->rows >= 1, "a valid request has rows");
  (void)TuningKey(r);
  const auto expect = OutputShapes(r);
  const OpCost cost = EstimateCost(r);
  Require(CheckOpCost(r, FuzzLimits()).ok(), "a validated request is within the cost bounds");
  // Every validated request reaches the backend: cheap ones run to the end,
  // the rest allocate everything and stop after their first piece.
  if (cost.flops > (1 << 22)) {
    StopAfterFirstPiece stop;
    absl::StatusOr<TensorMap> first = cpu->Run(r, stop.check());
    Require(first.ok() || first.status().code() == absl::StatusCode::kAborted,
            "the CPU backend accepts every validated request");
    return;
  }
  absl::StatusOr<TensorMap> alone = cpu->Run(r);
  Require(alone.ok(), "the CPU backend accepts every validated request");
  Require(alone->size() == expect.size(), "outputs as OutputShapes lists");
  for (const auto& [name, s] : expect) {
    auto it = alone->find(name);
    Require(it != alone->end(), "every listed output is returned");
    Require(it->second.shape == s, "output shape as OutputShapes says");
    Require(it->second.data.size() == static_cast<size_t>(it->second.numel()) * DTypeSize(it->second.dtype),
            "output byte length matches its shape");
  }
  if (cost.flops > (1 << 18)) return;
  OpRequest a = r, b = r;
  std::vector<OutputLayout> layouts = {OutputLayoutOf(a), OutputLayoutOf(b)};
  OpRequest merged = MergeRequests({&a, &b});
  Require(ValidateOpRequest(merged).ok(), "a merged request is valid");
  absl::StatusOr<TensorMap> both = cpu->Run(merged);
  Require(both.ok(), "the CPU backend runs the merged request");
  absl::StatusOr<std::vector<TensorMap>> split = SplitOutputs(layouts, *std::move(both));
  Require(split.ok() && split->size() == 2, "merged outputs split back");
  for (const TensorMap& part : *split) {
    for (const auto& [name, t] : *alone) {
      Require(part.at(name).shape == t.shape && part.at(name).data == t.data, "merged answer equals alone");
    }
  }
}

}  // namespace fusedserve::fuzz
