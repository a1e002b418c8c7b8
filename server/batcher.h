// The dynamic batcher: an OpScheduler that merges compatible FusedOp requests
// into one backend launch along the row (token) dimension and splits the
// outputs back, so each caller gets exactly its own rows.
//
// Requests are compatible (share a batch key) when they have the same op,
// dtypes, trailing shapes (every dim but the row dim), attributes and
// byte-identical non-row inputs (weights, biases). Row-wise ops (norms,
// softmax, activations) are viewed as [rows, last dim] so that [B,S,H] and
// [M,H] requests merge too; rope, linear and swiglu_mlp merge along dim 0;
// attention concatenates sequences (seq_lens concatenated) and
// attention_decode concatenates batch entries (same cache length L).
//
// Launch policy, per batch key (Triton's dynamic batcher plus continuous
// batching): a free worker launches the oldest launchable key's queue when
//   - the backend has spare capacity: fewer than parallel_launches launches
//     are inside Backend::Run (so an idle server never makes a lone request
//     wait, and on a GPU, which runs one launch at a time, the next batch
//     goes the moment the previous one leaves the device), or
//   - its rows reach the target (largest preferred size, else max_rows), or
//   - its oldest request has waited max_delay_us, or
//   - no request for that key arrived for idle_us (when enabled), or
//   - the batcher is draining;
// otherwise it waits for whichever comes first. Under load the backend is
// busy, so arrivals accumulate into large batches while it runs.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/scheduler.h"

namespace fusedserve {

// Knobs of one op (or the defaults for every op).
struct BatchPolicy {
  // Rows (tokens) per launch. A single request larger than this runs alone.
  int64_t max_rows = 2048;
  // Longest time the oldest queued request waits for company, µs.
  int64_t max_delay_us = 200;
  // Launch once no request for the key arrived for this long, µs (0: off).
  // Off by default: the backend-capacity rule already launches at once
  // when nothing is running, and a busy backend is worth waiting for.
  int64_t idle_us = 0;
  // Row counts worth launching (sorted), e.g. the sizes kernels are tuned
  // for: a queue reaching the largest launches without waiting, and a batch
  // is cut at the largest size its queue reaches (else at max_rows).
  std::vector<int64_t> preferred_rows;
  // Requests of this op queued before RESOURCE_EXHAUSTED (0: only the global limit).
  int max_queue = 0;
};

struct BatcherOptions {
  int threads = 2;  // worker threads (form batches, run them, answer)
  // Launches the backend runs at once usefully: 1 for CUDA (the workers'
  // launches, one at a time; small inline ones run on lanes of their own,
  // inline_launches), the worker count for the CPU reference.
  int parallel_launches = 1;
  int max_queue = 1024;                         // queued requests (all ops) before RESOURCE_EXHAUSTED
  int64_t max_queued_bytes = int64_t{1} << 30;  // their input bytes before RESOURCE_EXHAUSTED
  // A merged launch stays within the per-request cost bounds (EstimateCost):
  // merging never makes work that no single request could ask for.
  double max_launch_bytes = double(int64_t{4} << 30);  // outputs + working memory
  double max_launch_flops = 5e10;
  // A request that RunsInline(request, inline_max_bytes) accepts and that
  // finds nothing queued and a launch slot free (fewer than
  // parallel_launches launches running: with CUDA's one, the batcher idle)
  // is launched alone on the submitting (gRPC) thread, before Submit
  // returns: the launch the policy makes at once anyway, minus the hand-off
  // to a worker and back. 0 disables.
  int64_t inline_max_bytes = 0;
  // Inline launches that may run at once on lanes of their own, beside the
  // workers' launches (the CUDA backend's small-op lanes: its streams for
  // memory-bound ops). 0: inline launches take the workers' launch slots
  // (parallel_launches), as on the CPU reference, whose launches all share
  // its cores.
  int inline_launches = 0;
  BatchPolicy defaults;
  std::map<std::string, BatchPolicy> per_op;  // overrides, by op name

  const BatchPolicy& policy(const std::string& op) const {
    auto it = per_op.find(op);
    return it == per_op.end() ? defaults : it->second;
  }
};

// Parses --batch_overrides: "op:key=value[:key=value...][,op:...]" with keys
// max_rows, delay_us, idle_us, max_queue, preferred (row counts separated by
// '/'). Unspecified keys keep the values of `base`. Unknown ops or keys are
// INVALID_ARGUMENT.
absl::StatusOr<std::map<std::string, BatchPolicy>> ParseBatchOverrides(const std::string& spec,
                                                                       const BatchPolicy& base);
// "64,128,256" -> {64,128,256} (sorted); INVALID_ARGUMENT on a bad entry.
absl::StatusOr<std::vector<int64_t>> ParseRowList(const std::string& spec, char sep = ',');

absl::StatusOr<std::unique_ptr<OpScheduler>> MakeBatcher(Backend* backend, Metrics* metrics,
                                                         const BatcherOptions& options);

// ---- merging (exposed for tests) ---------------------------------------------

struct BatchShape {
  std::string key;  // equal keys may merge (non-row inputs compared byte-wise too)
  int64_t rows = 0;
};

// The batch key and row count of a validated request, or nullopt when the
// request cannot be merged with others (it then runs alone).
std::optional<BatchShape> BatchShapeOf(const OpRequest& request);

// True when the non-row inputs (weights, biases) of a and b are byte-identical.
bool SameNonRowInputs(const OpRequest& a, const OpRequest& b);

// Rows of a request along the merge axis and the shapes of its outputs;
// taken before merging (MergeRequests moves inputs out of the first part).
struct OutputLayout {
  int64_t rows = 0;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
};
OutputLayout OutputLayoutOf(const OpRequest& request);

// One request holding the rows of every part, in order. The parts share one
// batch key and identical non-row inputs. Row inputs are copied; the non-row
// inputs (weights) are moved out of parts[0] to avoid copying them, and
// RestoreNonRowInputs puts them back.
OpRequest MergeRequests(const std::vector<OpRequest*>& parts);
void RestoreNonRowInputs(OpRequest& merged, OpRequest& first);

// Splits the merged launch's outputs: result[i] holds exactly the outputs
// part i would have got alone.
absl::StatusOr<std::vector<TensorMap>> SplitOutputs(const std::vector<OutputLayout>& parts, TensorMap merged);

}  // namespace fusedserve
