// The tensor-parallel CUDA runner (cuda_rank.h): N rank runners, one per
// GPU, driven in lockstep. Each call of the engine fans out to every rank at
// once (rank 0 on the caller's thread, the others on their own threads, which
// stay for the runner's life so a decode step pays a wake-up, not a thread
// start) and returns when all have finished. Ranks issue the same
// collectives in the same order because they run the same code on the same
// batch; only rank 0 runs the LM head and reports tokens and logits.
#ifdef FUSEDSERVE_HAVE_CUDA

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/cuda_rank.h"
#include "model/rank_threads.h"

namespace fusedserve {
namespace {

class CudaTensorParallelRunner final : public ModelRunner {
 public:
  CudaTensorParallelRunner(const ModelConfig& c, std::unique_ptr<cuda::NcclGroup> group,
                           std::vector<std::unique_ptr<ModelRunner>> ranks)
      : c_(c),
        group_(std::move(group)),
        ranks_(std::move(ranks)),
        threads_(static_cast<int>(ranks_.size()), RankThreads::kStragglerWait, [this] { group_->Abort(); }) {}

  const ModelConfig& config() const override { return c_; }
  std::string device() const override { return "cuda"; }
  // Per GPU: each rank holds its kv heads' slice of every block.
  int64_t KvBytesPerBlock(int64_t block_size) const override { return ranks_[0]->KvBytesPerBlock(block_size); }

  absl::Status InitKvCache(int64_t num_blocks, int64_t block_size) override {
    return OnEveryRank([&](int r) { return ranks_[r]->InitKvCache(num_blocks, block_size); });
  }

  absl::Status Forward(const std::vector<SeqForward>& batch, ForwardOutput* out) override {
    std::vector<ForwardOutput> others(ranks_.size());
    return OnEveryRank([&](int r) { return ranks_[r]->Forward(batch, r == 0 ? out : &others[r]); });
  }

  // hidden is in place: ranks other than 0 work on copies.
  absl::Status RunLayers(int64_t first, int64_t n, int64_t B, int64_t S, const int64_t* positions,
                         float* hidden) override {
    std::vector<std::vector<float>> copies = Copies(hidden, B * S);
    return OnEveryRank(
        [&](int r) { return ranks_[r]->RunLayers(first, n, B, S, positions, r == 0 ? hidden : copies[r].data()); });
  }

  bool SupportsLayersChunked() const override { return ranks_[0]->SupportsLayersChunked(); }
  absl::Status RunLayersChunked(int64_t first, int64_t n, const std::vector<SeqForward>& batch,
                                const int64_t* positions, float* hidden) override {
    int64_t T = 0;
    for (const SeqForward& s : batch) T += s.num_tokens;
    std::vector<std::vector<float>> copies = Copies(hidden, T);
    return OnEveryRank([&](int r) {
      return ranks_[r]->RunLayersChunked(first, n, batch, positions, r == 0 ? hidden : copies[r].data());
    });
  }

 private:
  // Once the group was aborted (RankThreads) the ranks' states may differ and
  // every later call fails with the first error: only a restart mends that
  // (the server reports it; Kubernetes restarts the pod).
  absl::Status OnEveryRank(const std::function<absl::Status(int)>& fn) {
    if (!failed_.ok()) return failed_;
    absl::Status s = threads_.Run(fn);
    if (threads_.aborted())
      failed_ = absl::UnavailableError(absl::StrCat("tensor-parallel group stopped: ", s.message()));
    return s;
  }

  std::vector<std::vector<float>> Copies(const float* hidden, int64_t rows) const {
    std::vector<std::vector<float>> copies(ranks_.size());
    for (size_t r = 1; r < ranks_.size(); ++r) copies[r].assign(hidden, hidden + rows * c_.hidden);
    return copies;
  }

  const ModelConfig c_;
  // Declared so that the threads stop first, then the ranks go, then the
  // communicators they used.
  std::unique_ptr<cuda::NcclGroup> group_;
  std::vector<std::unique_ptr<ModelRunner>> ranks_;
  RankThreads threads_;
  absl::Status failed_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCudaTensorParallelRunner(std::unique_ptr<ModelWeights> weights,
                                                                          const CudaModelRunnerOptions& options) {
  const int n = options.tensor_parallel;
  std::vector<TensorShard> shards;
  for (int r = 0; r < n || r == 0; ++r) {
    absl::StatusOr<TensorShard> shard = ShardOf(weights->config(), r, n);
    if (!shard.ok()) return shard.status();
    shards.push_back(*shard);
  }
  std::vector<int> devices;
  for (int r = 0; r < n; ++r) devices.push_back(options.device + r);
  std::unique_ptr<cuda::NcclGroup> group;
  if (CudaStatus s = cuda::NcclGroup::Create(devices, &group); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tensor_parallel=", n, " on GPUs ", absl::StrJoin(devices, ","), ": ", s.message));
  }
  // Ranks load their shards at once, each on its own thread and GPU.
  std::vector<std::unique_ptr<ModelRunner>> ranks(n);
  {
    RankThreads loaders(n, RankThreads::kStragglerWait, nullptr);  // loading has no collectives
    absl::Status loaded = loaders.Run([&](int r) -> absl::Status {
      absl::StatusOr<std::unique_ptr<ModelRunner>> rank =
          MakeCudaRankRunner(*weights, options, shards[r], group.get(), devices[r]);
      if (!rank.ok()) return rank.status();
      ranks[r] = *std::move(rank);
      return absl::OkStatus();
    });
    if (!loaded.ok()) return loaded;
  }
  return std::unique_ptr<ModelRunner>(
      new CudaTensorParallelRunner(weights->config(), std::move(group), std::move(ranks)));
}

}  // namespace fusedserve

#endif  // FUSEDSERVE_HAVE_CUDA
