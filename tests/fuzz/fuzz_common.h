// Shared by the FusedOp fuzz targets: what must hold for every request that
// passes validation. A violated property aborts (libFuzzer reports it as a
// crash and saves the input).
//   1. The CPU reference backend runs it without crashing (when it is cheap
//      enough) and returns exactly the outputs OutputShapes promises.
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

// Multiply-adds a backend run would take, roughly; big runs are skipped so
// that the fuzzer keeps its pace.
inline double Cost(const OpRequest& r) {
  double inputs = 0;
  for (const auto& [name, t] : r.inputs) inputs += static_cast<double>(t.numel());
  const std::string& op = r.op;
  if (op == "linear") return double(r.in("x").dim(0)) * r.in("weight").dim(0) * r.in("x").dim(1);
  if (op == "swiglu_mlp") return 3.0 * r.in("x").dim(0) * r.in("x").dim(1) * r.in("down").dim(1);
  if (op == "attention") return double(r.in("q").dim(0)) * r.in("q").dim(0) * r.in("q").dim(1) * r.in("q").dim(2);
  if (op == "attention_decode") return double(r.in("k_cache").numel()) * r.in("q").dim(1);
  return inputs;
}

inline void CheckValidated(const OpRequest& r) {
  static Backend* cpu = MakeCpuBackend().release();
  std::optional<BatchShape> shape = BatchShapeOf(r);
  Require(shape.has_value(), "a valid request has a batch key");
  Require(shape->rows >= 1, "a valid request has rows");
  (void)TuningKey(r);
  const auto expect = OutputShapes(r);
  if (Cost(r) > (1 << 18)) return;
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
  if (Cost(r) > (1 << 16)) return;
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
