// Request validation at the edge: wire tensors to HostTensors (dtype, shape
// and byte-length checks, overflow-safe), then the op table's rules (inputs,
// dtypes, ranks, shapes, attributes). Everything that reaches a backend has
// passed here; every failure is INVALID_ARGUMENT naming the field.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "fusedserve/v1/fusedserve.pb.h"
#include "kernels/op.h"

namespace fusedserve {

struct ValidationLimits {
  // Largest number of elements in any one tensor (default 2^28: 512 MiB of bf16).
  int64_t max_tensor_elements = int64_t{1} << 28;
};

// Converts one wire tensor; `name` is used in error messages.
absl::StatusOr<HostTensor> TensorFromProto(const v1::Tensor& t, const std::string& name,
                                           const ValidationLimits& limits);
void TensorToProto(const HostTensor& t, v1::Tensor* out);
// The wire form of a request (the inverse of ValidateFusedOp's conversion),
// for clients: tests, the load generator, the fuzzers.
v1::FusedOpRequest OpRequestToProto(const OpRequest& request);

DType FromProtoDType(v1::DType d);  // only for validated values
v1::DType ToProtoDType(DType d);

// Full validation of a FusedOp request; defaults filled in for missing attrs.
absl::StatusOr<OpRequest> ValidateFusedOp(const v1::FusedOpRequest& request, const ValidationLimits& limits);

// Op-level rules on an already converted request (used by ValidateFusedOp,
// the batcher and the fuzzer).
absl::Status ValidateOpRequest(OpRequest& request);

}  // namespace fusedserve
