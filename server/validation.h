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
  // Bounds on what one FusedOp may cost (EstimateCost), checked before it
  // runs; past them the request gets RESOURCE_EXHAUSTED naming the flag.
  double max_op_bytes = double(int64_t{4} << 30);  // outputs + working memory (--max_op_bytes)
  double max_op_flops = 5e10;                      // work (--max_op_flops; the server sets it per backend)
  double max_output_bytes = double(512 << 20);     // the response must fit one message (--max_message_bytes)
};

// A client-supplied string as it may appear in an error message: escaped and
// cut to a few dozen characters, so that an 8 KB op name cannot turn the
// error into a metadata-size failure.
std::string ClientText(absl::string_view s);

// Converts one wire tensor; `name` is used in error messages. The second
// form takes the bytes out of `t` instead of copying them (the server's
// request messages are not read again once converted).
absl::StatusOr<HostTensor> TensorFromProto(const v1::Tensor& t, const std::string& name,
                                           const ValidationLimits& limits);
absl::StatusOr<HostTensor> TakeTensorFromProto(v1::Tensor& t, const std::string& name, const ValidationLimits& limits);
// The checks TensorFromProto makes on a wire tensor before taking its bytes:
// dtype (the v1::DType value as sent), rank, dimensions and byte length
// (shared with the FusedOp wire decoder, server/fused_op_wire.h).
absl::Status CheckWireTensor(int dtype, const int64_t* dims, int rank, size_t data_bytes, const std::string& name,
                             const ValidationLimits& limits);
void TensorToProto(const HostTensor& t, v1::Tensor* out);
void TensorToProto(HostTensor&& t, v1::Tensor* out);  // moves the bytes
// The wire form of a request (the inverse of ValidateFusedOp's conversion),
// for clients: tests, the load generator, the fuzzers.
v1::FusedOpRequest OpRequestToProto(const OpRequest& request);

DType FromProtoDType(v1::DType d);  // only for validated values
v1::DType ToProtoDType(DType d);

// Full validation of a FusedOp request; defaults filled in for missing attrs;
// the cost bounds of `limits` checked (CheckOpCost). The second form moves
// the tensor bytes out of `request`.
absl::StatusOr<OpRequest> ValidateFusedOp(const v1::FusedOpRequest& request, const ValidationLimits& limits);
absl::StatusOr<OpRequest> TakeValidatedFusedOp(v1::FusedOpRequest& request, const ValidationLimits& limits);

// RESOURCE_EXHAUSTED when a validated request's outputs, working memory or
// work exceed `limits`; the message names the limit and its flag.
absl::Status CheckOpCost(const OpRequest& request, const ValidationLimits& limits);

// INVALID_ARGUMENT naming the op's inputs when `name` is not one of them.
absl::Status CheckInputName(const OpSpec& spec, const std::string& name);

// Op-level rules on an already converted request (used by ValidateFusedOp,
// the batcher and the fuzzer).
absl::Status ValidateOpRequest(OpRequest& request);

}  // namespace fusedserve
