// FusedOp's wire codec: the request body (the protobuf wire format of a
// fusedserve.v1.FusedOpRequest) decoded straight from gRPC's slices into an
// OpRequest, and the response encoded straight from the output tensors, with
// no protobuf message in between: each tensor's bytes are copied once on the
// way in (slices -> the tensor's buffer, or the backend's staging block,
// which the kernel then reads in place) and once at most on the way out (a
// large output tensor's own buffer is lent to gRPC as a slice of the
// response; outputs left in a staging block are copied into it).
//
// The decoder takes the common shape of a body and leaves the rest to
// protobuf (the reference): a string that is not plain ASCII (protobuf checks
// UTF-8), a repeated map key, a Tensor sent twice in one map entry (protobuf
// merges them), a group or malformed field, a truncated body. Unknown fields
// are skipped, as protobuf does. Validation is TakeValidatedFusedOp's, with
// its messages.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "kernels/op.h"
#include "server/validation.h"

namespace fusedserve {

// A parsed, not yet validated FusedOp request. Reused from call to call (its
// vectors keep their capacity).
struct WireFusedOp {
  struct Input {
    std::string name;
    int32_t dtype = 0;  // the v1::DType value as sent
    HostTensor tensor;  // shape and bytes as sent; dtype set by validation
  };
  struct Attr {
    std::string name;
    AttrValue value;
    bool set = false;  // an AttrValue with none of its oneof fields is an error
  };
  std::string op;
  std::vector<Input> inputs;
  std::vector<Attr> attrs;
  size_t n_inputs = 0, n_attrs = 0;  // entries in use

  // Lets go of the staging block, whose pool reuses it once no tensor holds it.
  void DropStaging();
};

// Parses `body` into `out`; false when it is left to protobuf (see above).
// With `staging`, tensor bytes go into that block where they fit (the
// tensors' views, moved into the OpRequest by validation; see StagingBlock),
// else into the tensors' own strings.
bool ParseFusedOpWire(const grpc::ByteBuffer& body, WireFusedOp* out,
                      const std::shared_ptr<StagingBlock>& staging = nullptr);

// TakeValidatedFusedOp on a parsed request (its tensors' bytes are moved).
absl::StatusOr<OpRequest> ValidateWireFusedOp(WireFusedOp& parsed, const ValidationLimits& limits);

// Serializes a FusedOpResponse {outputs, backend} into `out`: one slice, or,
// when an output holds 1 KiB or more, framing slices with each such tensor's
// bytes between them as a slice that keeps `outputs` alive.
void EncodeFusedOpWire(TensorMap outputs, const std::string& backend, grpc::ByteBuffer* out);

// A response encoded while the GPU still computes its outputs (Backend's
// WhileRunning): the framing at once, with room for each output's bytes,
// which Complete copies in once they are written. The same bytes as
// EncodeFusedOpWire, all in one slice. Reused from call to call.
class EarlyFusedOpResponse {
 public:
  // For the next call: Encode writes into `out`, naming `backend` (both
  // outlive the call). Forgets an earlier Encode.
  void Arm(grpc::ByteBuffer* out, const std::string* backend) {
    out_ = out;
    backend_ = backend;
    encoded_ = false;
  }
  // `pending`: the outputs' names, dtypes, shapes and sizes (bytes unread).
  void Encode(const TensorMap& pending);
  // Copies `outputs`' bytes into the response Encode wrote; false (nothing
  // to use) when there was none since Arm, or `outputs` are not what it
  // encoded.
  bool Complete(const TensorMap& outputs);

 private:
  grpc::ByteBuffer* out_ = nullptr;
  const std::string* backend_ = nullptr;
  bool encoded_ = false;
  // Each output's bytes in the response (inline: no allocation for the
  // callback and sync APIs, which construct one per call).
  absl::InlinedVector<std::pair<uint8_t*, size_t>, 4> places_;
};

}  // namespace fusedserve
