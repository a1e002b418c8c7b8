// absl::Status (used everywhere inside) to grpc::Status at the edge.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace fusedserve {

// absl and gRPC share the numeric codes, so the mapping is 1:1.
grpc::Status ToGrpcStatus(const absl::Status& s);
// "OK", "INVALID_ARGUMENT", ... (label value of fusedserve_requests_total).
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace fusedserve
