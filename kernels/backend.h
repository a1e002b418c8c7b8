// Backend: runs a validated OpRequest and returns its outputs. The server
// holds one backend (CPU reference or CUDA) chosen at start-up.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/op.h"

namespace fusedserve {

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "cuda".
  virtual std::string name() const = 0;
  // Human-readable device description (GPU name, or "CPU reference").
  virtual std::string device_name() const = 0;
  // Runs one op. The request has passed ValidateOpRequest; outputs have the
  // dtype of the request's float inputs. Thread-safe.
  virtual absl::StatusOr<TensorMap> Run(const OpRequest& request) = 0;
};

// Output names and shapes of a validated request (same for every backend).
std::vector<std::pair<std::string, std::vector<int64_t>>> OutputShapes(const OpRequest& request);

// The float dtype of a validated request (all its float inputs share it).
DType RequestDType(const OpRequest& request);

std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace fusedserve
