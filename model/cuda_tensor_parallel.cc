// The tensor-parallel CUDA runner (cuda_rank.h): N rank runners, one per
// GPU, driven in lockstep. Each call of the engine fans out to every rank at
// once (rank 0 on the caller's thread, the others on their own threads, which
// stay for the runner's life so a decode step pays a wake-up, not a thread
// start) and returns when all have finished. Ranks issue the same
// collectives in the same order because they run the same code on the same
// batch; only rank 0 runs the LM head and reports tokens and logits.
#ifdef FUSEDSERVE_HAVE_CUDA

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/cuda_rank.h"

namespace fusedserve {
namespace {

// Runs fn(rank) for ranks 0..n-1 at once: rank 0 on the calling thread, the
// others on threads kept for the purpose. One call at a time (the engine's).
class RankThreads {
 public:
  explicit RankThreads(int ranks) : results_(ranks) {
    for (int r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { Loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // The first rank's error, in rank order.
  absl::Status Run(const std::function<absl::Status(int)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      pending_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    start_.notify_all();
    results_[0] = fn(0);
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, [&] { return pending_ == 0; });
      fn_ = nullptr;
    }
    for (absl::Status& s : results_) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  void Loop(int rank) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<absl::Status(int)>* fn = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
      }
      absl::Status s = (*fn)(rank);
      std::lock_guard<std::mutex> lock(mu_);
      results_[rank] = std::move(s);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<absl::Status(int)>* fn_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<absl::Status> results_;
  std::vector<std::thread> threads_;
};

class CudaTensorParallelRunner final : public ModelRunner {
 public:
  CudaTensorParallelRunner(const ModelConfig& c, std::unique_ptr<cuda::NcclGroup> group,
                           std::vector<std::unique_ptr<ModelRunner>> ranks)
      : c_(c), group_(std::move(group)), ranks_(std::move(ranks)), threads_(static_cast<int>(ranks_.size())) {}

  const ModelConfig& config() const override { return c_; }
  std::string device() const override { return "cuda"; }
  // Per GPU: each rank holds its kv heads' slice of every block.
  int64_t KvBytesPerBlock(int64_t block_size) const override { return ranks_[0]->KvBytesPerBlock(block_size); }

  absl::Status InitKvCache(int64_t num_blocks, int64_t block_size) override {
    return threads_.Run([&](int r) { return ranks_[r]->InitKvCache(num_blocks, block_size); });
  }

  absl::Status Forward(const std::vector<SeqForward>& batch, ForwardOutput* out) override {
    std::vector<ForwardOutput> others(ranks_.size());
    return threads_.Run([&](int r) { return ranks_[r]->Forward(batch, r == 0 ? out : &others[r]); });
  }

  // hidden is in place: ranks other than 0 work on copies.
  absl::Status RunLayers(int64_t first, int64_t n, int64_t B, int64_t S, const int64_t* positions,
                         float* hidden) override {
    std::vector<std::vector<float>> copies = Copies(hidden, B * S);
    return threads_.Run(
        [&](int r) { return ranks_[r]->RunLayers(first, n, B, S, positions, r == 0 ? hidden : copies[r].data()); });
  }

  bool SupportsLayersChunked() const override { return ranks_[0]->SupportsLayersChunked(); }
  absl::Status RunLayersChunked(int64_t first, int64_t n, const std::vector<SeqForward>& batch,
                                const int64_t* positions, float* hidden) override {
    int64_t T = 0;
    for (const SeqForward& s : batch) T += s.num_tokens;
    std::vector<std::vector<float>> copies = Copies(hidden, T);
    return threads_.Run([&](int r) {
      return ranks_[r]->RunLayersChunked(first, n, batch, positions, r == 0 ? hidden : copies[r].data());
    });
  }

 private:
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
    RankThreads loaders(n);
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
