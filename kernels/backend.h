// Backend: runs a validated OpRequest and returns its outputs. The server
// holds one backend (CPU reference or CUDA) chosen at start-up.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/op.h"

namespace fusedserve {

// Polled by a backend between pieces of long work: OK to go on, or the status
// the request ends with instead (the client cancelled, its deadline passed,
// the server's drain ran out of time). Empty: never stop.
using StopCheck = std::function<absl::Status()>;

// Host work that may run while the device computes the op: a backend that
// launches asynchronously (CUDA) calls it on the calling thread after the
// launch and before it waits, with the outputs as Run will return them
// (views into a staging block; their bytes not yet written: do not read
// them), where it knows them by then. Not called by the CPU backend, on
// the copy path, or when the launch fails. Empty: nothing to run.
using WhileRunning = std::function<void(const TensorMap& pending_outputs)>;

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "cuda".
  virtual std::string name() const = 0;
  // Human-readable device description (GPU name, or "CPU reference").
  virtual std::string device_name() const = 0;
  // Runs one op. The request has passed ValidateOpRequest; outputs have the
  // dtype of the request's float inputs. Thread-safe. Work that can take long
  // (the CPU reference) polls `stop` between pieces and returns its status.
  // `while_running`: see WhileRunning.
  virtual absl::StatusOr<TensorMap> Run(const OpRequest& request, const StopCheck& stop,
                                        const WhileRunning& while_running) = 0;
  absl::StatusOr<TensorMap> Run(const OpRequest& request, const StopCheck& stop) {
    return Run(request, stop, WhileRunning());
  }
  absl::StatusOr<TensorMap> Run(const OpRequest& request) { return Run(request, StopCheck(), WhileRunning()); }
  // A staging block of at least `bytes` that nothing else holds, for a
  // request to be decoded into (see StagingBlock), or null: this backend
  // has none (CPU), the size is past what it stages, or the calling thread
  // holds too many already. Then the tensors own their bytes as usual.
  virtual std::shared_ptr<StagingBlock> TakeStaging(size_t bytes) { return nullptr; }
};

// Where the last Backend::Run on this thread spent its time, for the server's
// latency breakdown (fusedserve_fused_op_stage_seconds): a backend that
// splits its work (CUDA: copies in, kernels, copies out) sets it before Run
// returns; the caller clears it before Run and reads it after, on the same
// thread. Left invalid, the whole Run counts as "kernel".
struct BackendStageTimes {
  bool valid = false;
  double h2d = 0, kernel = 0, d2h = 0;  // seconds
};
inline BackendStageTimes& ThisThreadStageTimes() {
  static thread_local BackendStageTimes t;
  return t;
}

// Output names and shapes of a validated request (same for every backend).
OutputShapeList OutputShapes(const OpRequest& request);

// The float dtype of a validated request (all its float inputs share it).
DType RequestDType(const OpRequest& request);

std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace fusedserve
