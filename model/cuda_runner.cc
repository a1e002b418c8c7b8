// CUDA ModelRunner: the LLaMA forward pass on the device in the model dtype
// (bf16 for the presets), fp32 accumulation inside every kernel.
//   weights     uploaded once; q/k/v and gate/up fused into one matrix each.
//   KV cache    [layers][num_blocks + 1][block_size][Hkv][Dh] for K and V; the
//               extra block is where the padding rows of a graph bucket write.
//   step        embedding gather -> per layer: rms_norm, QKV GEMM, rope + cache
//               write (paged_attention.h), attention (flash prefill for
//               sequences starting at position 0 and, on the Hopper kernel,
//               later chunks of at least kChunkFlashMinRows rows over their
//               K/V gathered from the cache; paged attention through the
//               block tables for everything else), o_proj GEMM, add_rms_norm,
//               SwiGLU MLP, add_rms_norm -> final norm -> last-token rows ->
//               LM head -> device argmax; the B token ids (and logits rows of
//               sampled sequences) copied to the host for the engine.
//   kernels     norms, GEMMs (linear), the SwiGLU gate (swiglu_mlp's path)
//               and flash prefill run the op's launch for the config the
//               tuning cache holds for the step's token bucket
//               (tuned_configs.h; keys in kernel_shapes.h), the ops' built-in
//               rule without one: GEMV for one row, the tensor-core skinny
//               GEMM up to 32, cuBLASLt beyond; the gate is fused into the
//               first two (cuBLASLt: + the SwiGLU kernel).
//   buffers     sized at creation (options.max_tokens rows), grown only when a
//               step is larger; no device allocation per step otherwise.
//   fused decode  a pure-decode step whose projections all run the GEMV (one
//               row by the built-in rule; tuned configs may give it more) or
//               the narrow skinny GEMM (2-32 rows) takes EnqueueFusedDecode
//               (gemv.h, skinny_gemm.h; CudaModelRunnerOptions::decode_fusion):
//               by default rope + cache write in the QKV projection's
//               epilogue and the add +
//               RMS norm between o_proj / down and the next projection split
//               between their epilogues (5 kernels a layer instead of 8);
//               optionally the norms folded into the next GEMV's weight
//               stream instead (not faster on the H100). wqkv's q/k head rows
//               are stored interleaved for the rope epilogue (Upload).
//   graphs      a step where every sequence decodes one token runs from a CUDA
//               graph of the next batch bucket (padding rows point at the spare
//               block), captured when the KV cache is created.
//   ranks       with tensor parallelism (cuda_tensor_parallel.cc) each GPU runs
//               one of these over its shard: its q/kv heads and intermediate
//               columns, and an NCCL all-reduce of the o_proj and down_proj
//               partial sums before each residual add: one kernel does the
//               all-reduce, the add and the next norm (TpAddNorm, NCCL's
//               device API; FUSEDSERVE_TP_FUSED_NORM=0: off) for decode steps
//               and, over 2 GPUs, every step (kFusedNormMaxRows); else
//               ncclAllReduce and the add_rms_norm kernel (small ones in an
//               NCCL symmetric window with FUSEDSERVE_TP_SYMMETRIC=1); the LM head
//               is split by vocabulary rows (each rank's logits gathered to
//               rank 0).
#ifdef FUSEDSERVE_HAVE_CUDA

#include "model/cuda_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/argmax.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_hopper.h"
#include "kernels/cuda/buffers.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/decode_megakernel.h"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/nccl_group.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/skinny_hopper.h"
#include "kernels/cuda/tp_add_norm.h"
#include "kernels/cuda/tuned_configs.h"
#include "model/cuda_rank.h"
#include "model/kernel_shapes.h"

namespace fusedserve {
namespace {

// A later prefill chunk (start > 0: chunked prefill, prefix-cache hit) of at
// least this many rows runs the flash kernel over its whole context gathered
// from the cache; paged attention re-reads the context once per query row
// (1920 rows over 2048 keys: ~20 ms a step on the H100 for the 1B model).
constexpr int64_t kChunkFlashMinRows = 16;

// FUSEDSERVE_TP_SYMMETRIC=1 (off by default): the all-reduces of up to this
// many bytes (decode steps up to 4 rows of hidden 4096 in bf16) run in an
// NCCL symmetric window. On 2 and 4 H100s (gpu_collective_bench) 4-16 KB
// take 5.2-5.6 µs there against 7.3-7.8 in plain buffers (N = 2) and
// 7.5-7.8 against 12-13 (N = 4); from 64 KB (N = 2) or 256 KB (N = 4) up
// they are slower. Off by default: with it the fp32 tiny model at N = 2
// gives wrong logits (model_cuda_test TensorParallelMatchesCpu/tiny, NCCL
// 2.28.3; alternating two windows did not help), cause not found; the bf16
// models matched the CPU runner in every run.
constexpr size_t kSymmetricMaxBytes = 32 << 10;

// Steps of up to this many rows (every decode bucket) run a rank's
// all-reduce, residual add and RMS norm as one kernel (TpAddNorm) when the
// loaded NCCL has the device API of the headers it was built with; over 2
// GPUs every step up to options.max_tokens rows does (each rank reads its
// peer's sums once: 4096 rows of hidden 4096 in 107 us against 182 for
// ncclAllReduce + add_rms_norm on H100s; over 4 the one-shot read of 3
// peers' rows is slower than NCCL's ring, 332 vs 221 us; gpu_collective_bench).
constexpr int64_t kFusedNormMaxRows = 64;

// A runtime call's error as a status (the one conversion, CudaToAbsl).
absl::Status Cuda(cudaError_t e, const char* what) { return CudaToAbsl(CheckCuda(e, what, __FILE__, __LINE__)); }

// The int32 step inputs, packed for the step's sizes (t token rows, r paged
// query rows, s sequences, bt block-table entries) into one pinned staging
// area and one device area, so a step uploads them with one copy. A graph
// bucket's steps all have the same sizes, hence the offsets it captured.
struct StepIndex {
  // Offsets (in int32 elements) of each array.
  int64_t tokens = 0, positions = 0, slots = 0, rows = 0, row_seq = 0, ctx = 0, seq_lens = 0, last_rows = 0,
          bt_width = 0, block_tables = 0, total = 0;
  void Layout(int64_t t, int64_t r, int64_t s, int64_t bt) {
    int64_t o = 0;
    auto take = [&](int64_t n) {
      const int64_t at = o;
      o += (n + 31) / 32 * 32;  // 128-byte aligned ranges
      return at;
    };
    tokens = take(t);
    positions = take(t);
    slots = take(t);
    rows = take(r);
    row_seq = take(r);
    ctx = take(r);
    seq_lens = take(s);
    last_rows = take(s);
    bt_width = take(1);  // the block tables' row stride, read by the graph's attention
    block_tables = take(bt);
    total = o;
  }
};

class CudaModelRunner final : public ModelRunner {
  // One forward step's sizes and attention plan (what a decode graph bakes in).
  struct Step {
    int64_t T = 0, B = 0, R = 0;  // token rows, sequences, paged query rows
    bool use_flash = false;       // flash prefill over every sequence (rows of the others redone by paged)
    int64_t max_prefill = 0;      // longest sequence in the flash launch
    int64_t Tk = 0;               // > 0: the flash launch's K/V, Tk rows, gathered from the cache (chunks)
    int splits = 1;               // paged attention context splits
    bool block_layers = false;    // TransformerBlock: the dense k/v of the step are the "cache"
    int64_t block_size = 0;       // TransformerBlock: S
  };
  struct Graph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
  };

 public:
  // Rank shard.rank of a tensor-parallel group (group null: the whole model).
  CudaModelRunner(const ModelConfig& c, const CudaModelRunnerOptions& o, const TensorShard& shard,
                  const cuda::NcclGroup* group, int device)
      : c_(ShardConfig(c, shard)), full_(c), o_(o), shard_(shard), group_(group), device_(device) {}

  ~CudaModelRunner() override {
    cudaSetDevice(device_);
    DropGraphs();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(const ModelWeights& w) {
    if (absl::Status status = Cuda(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) return status;
    int sms = 0;
    if (absl::Status status = Cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_), "sm count");
        !status.ok())
      return status;
    sm_count_ = sms;
    if (absl::Status status = Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
        !status.ok())
      return status;
    fuse_ = cuda::EnvKnob("FUSEDSERVE_DECODE_FUSION", 0, 1 << 20, o_.decode_fusion);
    dt_ = c_.dtype;
    if (!IsFloat(dt_)) return absl::InvalidArgumentError("model dtype must be a float type");
    es_ = DTypeSize(dt_);
    if (!cuda::PagedAttentionSupported(static_cast<int>(c_.q_heads), static_cast<int>(c_.kv_heads),
                                       static_cast<int>(c_.head_dim))) {
      return absl::InvalidArgumentError(
          absl::StrCat("the CUDA model runner supports head dims 16/32/64/128 and at most 8 "
                       "query heads per kv head (model: head dim ",
                       c_.head_dim, ", ", c_.q_heads, "/", c_.kv_heads, ")"));
    }
    flash_ok_ = cuda::AttentionHeadDimSupported(static_cast<int>(c_.head_dim));
    chunk_flash_ = flash_ok_ && cuda::HopperAttentionAvailable() &&
                   cuda::HopperAttentionSupports(dt_, static_cast<int>(c_.head_dim)) &&
                   cuda::EnvKnob("FUSEDSERVE_CHUNK_FLASH", 0, 1, 1) != 0;  // "0": later chunks on paged attention
    residual_in_gemm_ = group_ == nullptr && cuda::EnvKnob("FUSEDSERVE_RESIDUAL_IN_GEMM", 0, 1, 1) != 0;

    if (absl::Status status = Upload(w, {"model.embed_tokens.weight"}, &embed_); !status.ok()) return status;
    if (absl::Status status = Upload(w, {"model.norm.weight"}, &final_norm_); !status.ok()) return status;
    const std::string head_name = c_.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    vocab_parallel_ =
        group_ != nullptr && shard_.size > 1 && cuda::EnvKnob("FUSEDSERVE_TP_VOCAB_PARALLEL", 0, 1, 1) != 0;
    if (vocab_parallel_) {
      // Every rank's vocabulary rows (where its logits land in the gather).
      for (int r = 0; r < shard_.size; ++r) {
        absl::StatusOr<TensorShard> part = ShardOf(full_, r, shard_.size);
        if (!part.ok()) return part.status();
        vocab_parts_.push_back(*part);
      }
      // This rank's vocabulary rows of the LM head (tied: of the embedding).
      if (absl::Status status =
              Upload(w, {WeightBlock{head_name, shard_.vocab_begin, shard_.vocab, 0, c_.hidden}}, &lm_head_own_);
          !status.ok())
        return status;
    } else if (!c_.tied_embeddings) {
      if (absl::Status status = Upload(w, {head_name}, &lm_head_own_); !status.ok()) return status;
    }
    lm_head_ = c_.tied_embeddings && !vocab_parallel_ ? embed_.get() : lm_head_own_.get();
    if (group_ != nullptr && cuda::EnvKnob("FUSEDSERVE_TP_SYMMETRIC", 0, 1, 0) == 1) {
      // Every rank registers at once (the loaders run one thread a rank).
      if (CudaStatus s = group_->AllocateSymmetric(shard_.rank, kSymmetricMaxBytes, &symmetric_); s.ok()) {
        symmetric_bytes_ = kSymmetricMaxBytes;
      } else if (shard_.rank == 0) {
        std::fprintf(stderr, "tensor parallel: all-reduces in plain buffers (%s)\n", s.message.c_str());
      }
    }
    if (group_ != nullptr && shard_.size > 1 && cuda::EnvKnob("FUSEDSERVE_TP_FUSED_NORM", 0, 1, 1) != 0) {
      // Collective like the windows above.
      const int64_t rows = shard_.size == 2 ? std::max(kFusedNormMaxRows, o_.max_tokens) : kFusedNormMaxRows;
      if (CudaStatus s = cuda::TpAddNorm::Create(*group_, shard_.rank, rows, c_.hidden, dt_, &add_norm_);
          !s.ok() && shard_.rank == 0) {
        std::fprintf(stderr, "tensor parallel: all-reduce and norm in two kernels (%s)\n", s.message.c_str());
      }
    }
    layers_ = std::vector<Layer>(c_.layers);
    for (int64_t i = 0; i < c_.layers; ++i) {
      const std::string p = absl::StrCat("model.layers.", i, ".");
      Layer& L = layers_[i];
      if (absl::Status status = Upload(w, {p + "input_layernorm.weight"}, &L.attn_norm); !status.ok()) return status;
      if (absl::Status status = Upload(w, {p + "post_attention_layernorm.weight"}, &L.mlp_norm); !status.ok())
        return status;
      // This rank's blocks (the whole matrices when unsharded); q and k head
      // rows interleaved for the rope epilogue of the fused QKV GEMV
      // (gemv.h), which the rope kernel reads too.
      const LayerBlocks b = LayerShardBlocks(full_, shard_, i);
      if (absl::Status status =
              Upload(w, {b.qkv.begin(), b.qkv.end()}, &L.wqkv, (c_.q_heads + c_.kv_heads) * c_.head_dim);
          !status.ok())
        return status;
      if (absl::Status status = Upload(w, {b.o}, &L.wo); !status.ok()) return status;
      if (absl::Status status = Upload(w, {b.gate_up.begin(), b.gate_up.end()}, &L.gate_up); !status.ok())
        return status;
      if (absl::Status status = Upload(w, {b.down}, &L.down); !status.ok()) return status;
    }

    // cos/sin of pos * inv_freq (Llama-3.1 scaling included), fp64 on the host.
    const std::vector<double> inv = c_.RopeInvFreq();
    const int64_t half = c_.head_dim / 2;
    table_rows_ = c_.max_position;
    std::vector<float> cs(static_cast<size_t>(table_rows_ * half * 2));
    for (int64_t p = 0; p < table_rows_; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(p) * inv[i];
        cs[(p * half + i) * 2] = static_cast<float>(std::cos(a));
        cs[(p * half + i) * 2 + 1] = static_cast<float>(std::sin(a));
      }
    }
    if (absl::Status status = CudaToAbsl(cos_sin_.Allocate(cs.size() * sizeof(float)), "rope table"); !status.ok())
      return status;
    if (absl::Status status =
            Cuda(cudaMemcpy(cos_sin_.get(), cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice),
                 "rope table upload");
        !status.ok())
      return status;
    return Reserve(std::max<int64_t>(1, o_.max_tokens), std::max<int64_t>(1, o_.max_seqs));
  }

  const ModelConfig& config() const override { return full_; }
  std::string device() const override { return "cuda"; }
  const std::string& decode_report() const { return decode_report_; }

  int64_t KvBytesPerBlock(int64_t block_size) const override {
    return 2 * c_.layers * block_size * c_.kv_dim() * static_cast<int64_t>(DTypeSize(c_.dtype));
  }

  absl::Status InitKvCache(int64_t num_blocks, int64_t block_size) override {
    if (num_blocks <= 0 || block_size <= 0) return absl::InvalidArgumentError("KV cache needs blocks > 0");
    if (absl::Status status = Cuda(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) return status;
    DropGraphs();
    num_blocks_ = num_blocks;
    block_size_ = block_size;
    // One spare block (index num_blocks) takes the K/V of graph padding rows.
    layer_slots_ = (num_blocks + 1) * block_size;
    const size_t bytes = static_cast<size_t>(c_.layers * layer_slots_ * c_.kv_dim()) * es_;
    if (absl::Status status = CudaToAbsl(k_cache_.Allocate(bytes), "K cache"); !status.ok()) return status;
    if (absl::Status status = CudaToAbsl(v_cache_.Allocate(bytes), "V cache"); !status.ok()) return status;
    if (absl::Status status = Cuda(cudaMemsetAsync(k_cache_.get(), 0, bytes, stream_), "K cache clear"); !status.ok())
      return status;
    if (absl::Status status = Cuda(cudaMemsetAsync(v_cache_.get(), 0, bytes, stream_), "V cache clear"); !status.ok())
      return status;
    if (absl::Status status = InitMegakernel(); !status.ok()) return status;
    const int64_t max_ctx = std::min<int64_t>(table_rows_, num_blocks * block_size);
    max_bt_width_ = std::max<int64_t>(1, (max_ctx + block_size - 1) / block_size);
    if (absl::Status status = Reserve(cap_tokens_, cap_seqs_); !status.ok()) return status;
    if (absl::Status status = Cuda(cudaStreamSynchronize(stream_), "KV cache init"); !status.ok()) return status;
    // Every kernel's tuned configs for the buffers' token buckets, read now
    // (the graphs bake them in).
    for (int k = 0; k < kModelKernels; ++k) {
      const ModelKernel kernel = static_cast<ModelKernel>(k);
      if (kernel == ModelKernel::kAttention && !flash_ok_) continue;
      Tuned(kernel, kernel == ModelKernel::kLmHead ? std::min(cap_seqs_, cap_tokens_) : cap_tokens_);
    }
    if (o_.cuda_graphs)
      if (absl::Status status = CaptureGraphs(); !status.ok()) return status;
    return absl::OkStatus();
  }

  // One step: 1. check the batch, 2. pick the decode graph of its bucket
  // (pure-decode steps), 3. stage its indices (and the bucket's padding
  // rows), 4. replay the graph or enqueue the step, 5. download the tokens.
  absl::Status Forward(const std::vector<SeqForward>& batch, ForwardOutput* out) override {
    if (k_cache_.get() == nullptr) return absl::FailedPreconditionError("KV cache not initialised");
    if (absl::Status status = Cuda(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) return status;
    const int64_t B = static_cast<int64_t>(batch.size());
    if (B == 0) {
      out->greedy.clear();
      out->logits.clear();
      return absl::OkStatus();
    }
    int64_t T = 0;
    bool all_decode = true;
    if (absl::Status status = CheckBatch(batch, &T, &all_decode); !status.ok()) return status;
    // Growing the buffers drops the graphs, so look one up only after.
    if (absl::Status status = Reserve(T, B); !status.ok()) return status;
    const Graph* graph = nullptr;
    int64_t bucket = B;
    if (all_decode && !graphs_.empty()) {
      auto it = graphs_.lower_bound(B);
      if (it != graphs_.end() && it->first <= cap_seqs_ && it->first <= cap_tokens_) {
        graph = &it->second;
        bucket = it->first;
      }
    }
    Step st;
    st.T = T;
    st.B = B;
    int64_t max_ctx = 1;
    if (absl::Status status = StageIndices(batch, bucket, &st, &max_ctx); !status.ok()) return status;
    if (absl::Status status = UploadIndices(); !status.ok()) return status;
    if (st.Tk > 0) {
      if (absl::Status status = Cuda(cudaMemcpyAsync(dkv_.get(), hkv_.as<int32_t>(), kv_idx_ * sizeof(int32_t),
                                                     cudaMemcpyHostToDevice, stream_),
                                     "chunk index upload");
          !status.ok())
        return status;
    }
    if (graph != nullptr) {
      if (absl::Status status = Cuda(cudaGraphLaunch(graph->exec, stream_), "cudaGraphLaunch"); !status.ok())
        return status;
    } else {
      st.splits = cuda::PagedAttentionSplits(static_cast<int>(st.R), static_cast<int>(c_.kv_heads),
                                             static_cast<int>(max_ctx), sm_count_);
      if (absl::Status status = EnqueueForward(st); !status.ok()) return status;
    }
    return Download(batch, out);
  }

  // Token rows of the batch (*T), and whether every sequence decodes one token.
  absl::Status CheckBatch(const std::vector<SeqForward>& batch, int64_t* T, bool* all_decode) const {
    for (const SeqForward& s : batch) {
      if (s.num_tokens <= 0) return absl::InternalError("empty sequence in a forward batch");
      const int64_t need = (s.start + s.num_tokens + block_size_ - 1) / block_size_;
      if (need > s.num_blocks) return absl::InternalError("block table too short for the sequence");
      if (need > max_bt_width_ || s.start + s.num_tokens > table_rows_) {
        return absl::InvalidArgumentError("sequence longer than the model's maximum position");
      }
      *T += s.num_tokens;
      *all_decode = *all_decode && s.num_tokens == 1;
    }
    return absl::OkStatus();
  }

  // Lays out and fills the host staging of the step's indices: per token
  // row its token, position and cache slot; per paged query row its row,
  // sequence and context; per sequence its length, last row and block table;
  // then the padding rows up to `bucket`. Sets st->use_flash, max_prefill,
  // R and, when a later chunk runs flash, Tk (StageChunks).
  absl::Status StageIndices(const std::vector<SeqForward>& batch, int64_t bucket, Step* st, int64_t* max_ctx) {
    const int64_t B = static_cast<int64_t>(batch.size());
    int64_t R = 0;
    // The flash launch covers every sequence of the step; its rows count for
    // those at position 0 and the long later chunks, paged redoes the others.
    auto chunk = [&](const SeqForward& s) { return chunk_flash_ && s.start > 0 && s.num_tokens >= kChunkFlashMinRows; };
    bool any_chunk = false;
    for (const SeqForward& s : batch) {
      if (flash_ok_ && ((s.start == 0 && s.num_tokens > 1) || chunk(s))) st->use_flash = true;
      any_chunk = any_chunk || chunk(s);
    }
    auto in_flash = [&](const SeqForward& s) { return st->use_flash && (s.start == 0 || chunk(s)); };
    // Block tables go up as wide as this step's longest sequence needs, not
    // as wide as the longest sequence the cache could hold.
    int64_t width = 1;
    for (const SeqForward& s : batch) {
      if (in_flash(s)) st->max_prefill = std::max(st->max_prefill, s.num_tokens);
      R += in_flash(s) ? 0 : s.num_tokens;
      width = std::max(width, (s.start + s.num_tokens + block_size_ - 1) / block_size_);
    }
    if (any_chunk) {
      if (absl::Status status = StageChunks(batch, in_flash, st); !status.ok()) return status;
    }
    ix_.Layout(std::max(st->T, bucket), std::max(R, bucket), std::max(B, bucket), std::max(B, bucket) * width);
    int32_t* h = hidx_.as<int32_t>();
    h[ix_.bt_width] = static_cast<int32_t>(width);
    int64_t row = 0;
    R = 0;
    for (int64_t b = 0; b < B; ++b) {
      const SeqForward& s = batch[b];
      const int64_t nb = (s.start + s.num_tokens + block_size_ - 1) / block_size_;
      std::copy_n(s.block_table, nb, h + ix_.block_tables + b * width);
      const bool paged = !in_flash(s);
      for (int64_t i = 0; i < s.num_tokens; ++i, ++row) {
        const int32_t tok = s.tokens[i];
        if (tok < 0 || tok >= c_.vocab) return absl::InternalError("token id out of range");
        const int64_t pos = s.start + i;
        h[ix_.tokens + row] = tok;
        h[ix_.positions + row] = static_cast<int32_t>(pos);
        h[ix_.slots + row] = static_cast<int32_t>(s.block_table[pos / block_size_] * block_size_ + pos % block_size_);
        if (paged) {
          h[ix_.rows + R] = static_cast<int32_t>(row);
          h[ix_.row_seq + R] = static_cast<int32_t>(b);
          h[ix_.ctx + R] = static_cast<int32_t>(pos + 1);
          ++R;
          *max_ctx = std::max(*max_ctx, pos + 1);
        }
      }
      h[ix_.seq_lens + b] = static_cast<int32_t>(s.num_tokens);
      h[ix_.last_rows + b] = static_cast<int32_t>(row - 1);
    }
    StagePadding(B, bucket, width);
    st->R = R;
    return absl::OkStatus();
  }

  // The flash launch's k_starts and the cache slots of its K/V rows (hkv_,
  // uploaded to dkv_): a sequence in the launch gets keys [0, start + n) and
  // k_start = start; the others (redone by paged attention) their own rows
  // at k_start 0. Grows the gather buffers when the step needs more rows.
  template <typename InFlash>
  absl::Status StageChunks(const std::vector<SeqForward>& batch, const InFlash& in_flash, Step* st) {
    const int64_t B = static_cast<int64_t>(batch.size());
    int64_t Tk = 0;
    for (const SeqForward& s : batch) Tk += in_flash(s) ? s.start + s.num_tokens : s.num_tokens;
    if (Tk > (int64_t{1} << 30)) return absl::InvalidArgumentError("step context too long");
    const int64_t slots_at = (B + 31) / 32 * 32;
    kv_idx_ = slots_at + Tk;
    const size_t row_bytes = static_cast<size_t>(c_.kv_dim()) * es_;
    if (kv_idx_ * sizeof(int32_t) > dkv_.size() || Tk * row_bytes > kg_.size()) {
      if (absl::Status status = Cuda(cudaStreamSynchronize(stream_), "sync before growing chunk buffers"); !status.ok())
        return status;
      const int64_t idx = std::max<int64_t>(kv_idx_, 2 * static_cast<int64_t>(dkv_.size() / sizeof(int32_t)));
      const int64_t rows = std::max<int64_t>(Tk, 2 * static_cast<int64_t>(kg_.size() / row_bytes));
      if (absl::Status status = CudaToAbsl(dkv_.Allocate(idx * sizeof(int32_t)), "chunk indices"); !status.ok())
        return status;
      if (absl::Status status = CudaToAbsl(hkv_.Allocate(idx * sizeof(int32_t)), "host chunk indices"); !status.ok())
        return status;
      if (absl::Status status = CudaToAbsl(kg_.Allocate(rows * row_bytes), "chunk K"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(vg_.Allocate(rows * row_bytes), "chunk V"); !status.ok()) return status;
    }
    int32_t* h = hkv_.as<int32_t>();
    int64_t k = slots_at;
    for (int64_t b = 0; b < B; ++b) {
      const SeqForward& s = batch[b];
      const int64_t first = in_flash(s) ? 0 : s.start;
      h[b] = static_cast<int32_t>(s.start - first);
      for (int64_t pos = first; pos < s.start + s.num_tokens; ++pos) {
        h[k++] = static_cast<int32_t>(s.block_table[pos / block_size_] * block_size_ + pos % block_size_);
      }
    }
    st->Tk = Tk;
    return absl::OkStatus();
  }

  // Padding rows [from, to) of a graph bucket: token 0 at position 0 of the
  // spare block, so they write nothing a sequence reads.
  void StagePadding(int64_t from, int64_t to, int64_t width) {
    int32_t* h = hidx_.as<int32_t>();
    for (int64_t b = from; b < to; ++b) {
      h[ix_.tokens + b] = 0;
      h[ix_.positions + b] = 0;
      h[ix_.slots + b] = static_cast<int32_t>(num_blocks_ * block_size_);
      h[ix_.rows + b] = static_cast<int32_t>(b);
      h[ix_.row_seq + b] = static_cast<int32_t>(b);
      h[ix_.ctx + b] = 1;
      h[ix_.seq_lens + b] = 1;
      h[ix_.last_rows + b] = static_cast<int32_t>(b);
      h[ix_.block_tables + b * width] = static_cast<int32_t>(num_blocks_);
    }
  }

  absl::Status RunLayers(int64_t first, int64_t n, int64_t B, int64_t S, const int64_t* positions,
                         float* hidden) override {
    if (first < 0 || n < 0 || first + n > c_.layers) return absl::InvalidArgumentError("layer range out of bounds");
    if (n == 0 || B * S == 0) return absl::OkStatus();
    if (absl::Status status = Cuda(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) return status;
    const int64_t T = B * S, D = c_.hidden;
    for (int64_t i = 0; i < T; ++i) {
      if (positions[i] < 0 || positions[i] >= table_rows_) {
        return absl::InvalidArgumentError(absl::StrCat("position ", positions[i], " outside [0, ", table_rows_, ")"));
      }
    }
    if (S > (int64_t{1} << 30)) return absl::InvalidArgumentError("sequence too long");
    if (absl::Status status = Reserve(T, B); !status.ok()) return status;
    // The graphs read the step buffers at fixed addresses; this path reuses
    // them and never touches the KV cache.
    ix_.Layout(T, T, B, 0);
    int32_t* h = hidx_.as<int32_t>();
    for (int64_t i = 0; i < T; ++i) {
      h[ix_.positions + i] = static_cast<int32_t>(positions[i]);
      h[ix_.rows + i] = static_cast<int32_t>(i);
      h[ix_.row_seq + i] = static_cast<int32_t>(i / S);
      h[ix_.ctx + i] = static_cast<int32_t>(i % S + 1);
    }
    for (int64_t b = 0; b < B; ++b) {
      h[ix_.seq_lens + b] = static_cast<int32_t>(S);
      h[ix_.last_rows + b] = static_cast<int32_t>(b);  // identity block table: sequence b = "block" b
    }
    if (absl::Status status = UploadIndices(); !status.ok()) return status;
    std::vector<uint8_t> x(static_cast<size_t>(T * D) * es_);
    ConvertFromFloat(hidden, T * D, x.data());
    if (absl::Status status =
            Cuda(cudaMemcpyAsync(x_[0].get(), x.data(), x.size(), cudaMemcpyHostToDevice, stream_), "hidden upload");
        !status.ok())
      return status;
    Step st;
    st.T = T;
    st.B = B;
    st.R = T;
    st.use_flash = flash_ok_;
    st.max_prefill = S;
    st.splits = 1;
    st.block_layers = true;
    st.block_size = S;
    if (absl::Status status = EnqueueLayers(st, first, first + n); !status.ok()) return status;
    if (absl::Status status =
            Cuda(cudaMemcpyAsync(x.data(), x_[0].get(), x.size(), cudaMemcpyDeviceToHost, stream_), "hidden download");
        !status.ok())
      return status;
    if (absl::Status status = Cuda(cudaStreamSynchronize(stream_), "TransformerBlock"); !status.ok()) return status;
    ConvertToFloat(x.data(), T * D, hidden);
    return absl::OkStatus();
  }

 private:
  struct Layer {
    DeviceBuffer attn_norm;  // [D]
    DeviceBuffer wqkv;       // [(Hq + 2 Hkv) Dh, D]
    DeviceBuffer wo;         // [D, Hq Dh]
    DeviceBuffer mlp_norm;   // [D]
    DeviceBuffer gate_up;    // [2I, D]
    DeviceBuffer down;       // [D, I]
  };

  void ConvertFromFloat(const float* src, int64_t n, uint8_t* dst) const {
    if (dt_ == DType::kF32) {
      std::memcpy(dst, src, n * sizeof(float));
      return;
    }
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = dt_ == DType::kBF16 ? FloatToBf16(src[i]) : FloatToHalf(src[i]);
  }
  void ConvertToFloat(const uint8_t* src, int64_t n, float* dst) const {
    if (dt_ == DType::kF32) {
      std::memcpy(dst, src, n * sizeof(float));
      return;
    }
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    if (dt_ == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(s[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(s[i]);
    }
  }

  // A whole tensor, or a rank's block of a 2-D one (tensor_parallel.h),
  // sliced while uploading: no GPU holds a full copy of a sharded weight.
  struct Part {
    std::string name;
    bool whole = true;
    WeightBlock block;
    Part(const char* n) : name(n) {}                                      // NOLINT: a whole tensor by its name
    Part(std::string n) : name(std::move(n)) {}                           // NOLINT: likewise
    Part(const WeightBlock& b) : name(b.name), whole(false), block(b) {}  // NOLINT
  };
  // Concatenates the parts (rows of row-major matrices) in dt_ and uploads
  // them. Rows [0, interleave_rows) form heads of head_dim rows whose rows i
  // and i + head_dim/2 are stored next to each other (2i, 2i + 1).
  absl::Status Upload(const ModelWeights& w, const std::vector<Part>& parts, DeviceBuffer* out,
                      int64_t interleave_rows = 0) {
    std::vector<uint8_t> bytes;
    for (const Part& part : parts) {
      const WeightTensor& t = w.Get(part.name);
      if (!t.is_float) return absl::InvalidArgumentError(absl::StrCat(part.name, ": not a float tensor"));
      const WeightBlock& b = part.block;
      const bool whole = part.whole || (t.shape.size() == 2 && b.row == 0 && b.rows == t.shape[0] && b.col == 0 &&
                                        b.cols == t.shape[1]);
      const size_t at = bytes.size();
      if (whole && t.dtype == dt_) {
        bytes.resize(at + static_cast<size_t>(t.numel()) * es_);
        std::memcpy(bytes.data() + at, t.data, t.bytes);
      } else {
        const std::vector<float> f = whole ? t.ToFloat() : t.ToFloatBlock(b.row, b.rows, b.col, b.cols);
        bytes.resize(at + f.size() * es_);
        ConvertFromFloat(f.data(), static_cast<int64_t>(f.size()), bytes.data() + at);
      }
    }
    if (interleave_rows > 0) {
      const int64_t Dh = c_.head_dim, half = Dh / 2;
      const size_t row = static_cast<size_t>(c_.hidden) * es_;  // a projection row: hidden elements
      std::vector<uint8_t> head(static_cast<size_t>(Dh) * row);
      for (int64_t h0 = 0; h0 + Dh <= interleave_rows; h0 += Dh) {
        uint8_t* base = bytes.data() + h0 * row;
        for (int64_t i = 0; i < half; ++i) {
          std::memcpy(head.data() + (2 * i) * row, base + i * row, row);
          std::memcpy(head.data() + (2 * i + 1) * row, base + (i + half) * row, row);
        }
        std::memcpy(base, head.data(), head.size());
      }
    }
    if (absl::Status status = CudaToAbsl(out->Allocate(bytes.size()), parts[0].name); !status.ok()) return status;
    return Cuda(cudaMemcpy(out->get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "weight upload");
  }

  // Grows the step buffers to hold `tokens` rows and `seqs` sequences.
  absl::Status Reserve(int64_t tokens, int64_t seqs) {
    StepIndex most;  // the largest layout a step within these sizes can take
    most.Layout(tokens, tokens, seqs, seqs * max_bt_width_);
    const bool grow_rows = tokens > cap_tokens_;
    const bool grow_idx = grow_rows || seqs > cap_seqs_ || most.total > cap_idx_;
    if (!grow_rows && !grow_idx) return absl::OkStatus();
    if (cap_tokens_ > 0) DropGraphs();  // they captured the old addresses
    if (absl::Status status = Cuda(cudaStreamSynchronize(stream_), "sync before growing buffers"); !status.ok())
      return status;
    const int64_t T = std::max(tokens, cap_tokens_), Sq = std::max(seqs, cap_seqs_);
    if (grow_rows || seqs > cap_seqs_) {
      const int64_t D = c_.hidden, qkvd = c_.q_dim() + 2 * c_.kv_dim(), I = c_.intermediate;
      if (absl::Status status = CudaToAbsl(x_[0].Allocate(T * D * es_), "residual"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(x_[1].Allocate(T * D * es_), "residual"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(h_.Allocate(T * D * es_), "normed"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(tmp_.Allocate(T * D * es_), "tmp"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(qkv_.Allocate(T * qkvd * es_), "qkv"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(q_.Allocate(T * c_.q_dim() * es_), "q"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(k_.Allocate(T * c_.kv_dim() * es_), "k"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(v_.Allocate(T * c_.kv_dim() * es_), "v"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(ao_.Allocate(T * c_.q_dim() * es_), "attention out"); !status.ok())
        return status;
      if (absl::Status status = CudaToAbsl(gu_.Allocate(T * 2 * I * es_), "gate_up"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(act_.Allocate(T * I * es_), "mlp act"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(last_.Allocate(Sq * D * es_), "last rows"); !status.ok()) return status;
      if (absl::Status status = CudaToAbsl(logits_.Allocate(Sq * c_.vocab * es_), "logits"); !status.ok())
        return status;
      if (vocab_parallel_) {
        const int64_t per = vocab_parts_[0].vocab;  // the most rows a rank has
        if (absl::Status status = CudaToAbsl(head_part_.Allocate(Sq * per * es_), "logits part"); !status.ok())
          return status;
        if (absl::Status status = CudaToAbsl(head_parts_.Allocate(shard_.size * Sq * per * es_), "logits parts");
            !status.ok())
          return status;
      }
      if (absl::Status status = CudaToAbsl(hlogits_.Allocate(Sq * c_.vocab * es_), "host logits"); !status.ok())
        return status;
      if (absl::Status status = CudaToAbsl(greedy_.Allocate(Sq * sizeof(int32_t)), "greedy tokens"); !status.ok())
        return status;
      if (sq_.size() == 0) {  // the decode GEMVs' norm sums (kDecodeNormEpilogue)
        if (absl::Status status = CudaToAbsl(sq_.Allocate(kNormSumsBytes), "norm sums"); !status.ok()) return status;
      }
      const size_t aws = cuda::ArgmaxWorkspaceBytes(Sq);
      if (absl::Status status = CudaToAbsl(argmax_ws_.Allocate(aws), "argmax workspace"); !status.ok()) return status;
      if (absl::Status status = Cuda(cudaMemset(argmax_ws_.get(), 0, aws), "argmax workspace clear"); !status.ok())
        return status;
      if (absl::Status status = CudaToAbsl(hgreedy_.Allocate(Sq * sizeof(int32_t)), "host greedy tokens"); !status.ok())
        return status;
      if (ws_.size() == 0) {
        const size_t ws =
            cuda::PagedAttentionWorkspaceBytes(static_cast<int>(c_.q_heads), static_cast<int>(c_.head_dim));
        if (absl::Status status = CudaToAbsl(ws_.Allocate(ws), "attention workspace"); !status.ok()) return status;
        // Its split counters start at zero (each launch leaves them so).
        if (absl::Status status = Cuda(cudaMemset(ws_.get(), 0, ws), "attention workspace clear"); !status.ok())
          return status;
      }
      cap_tokens_ = T;
      cap_seqs_ = Sq;
    }
    most.Layout(T, T, Sq, Sq * max_bt_width_);
    cap_idx_ = std::max(cap_idx_, most.total);
    if (absl::Status status = CudaToAbsl(didx_.Allocate(cap_idx_ * sizeof(int32_t)), "step indices"); !status.ok())
      return status;
    if (absl::Status status = CudaToAbsl(hidx_.Allocate(cap_idx_ * sizeof(int32_t)), "host step indices"); !status.ok())
      return status;
    std::memset(hidx_.as<int32_t>(), 0, cap_idx_ * sizeof(int32_t));
    return absl::OkStatus();
  }

  // The step's indices (layout ix_), one host-to-device copy.
  absl::Status UploadIndices() {
    return Cuda(
        cudaMemcpyAsync(didx_.get(), hidx_.as<int32_t>(), ix_.total * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
        "step index upload");
  }

  // Copies out the greedy tokens and the logits rows that are wanted, then
  // waits for the step.
  absl::Status Download(const std::vector<SeqForward>& batch, ForwardOutput* out) {
    if (shard_.rank != 0) return Cuda(cudaStreamSynchronize(stream_), "forward step");
    const int64_t B = static_cast<int64_t>(batch.size()), V = c_.vocab;
    if (absl::Status status = Cuda(cudaMemcpyAsync(hgreedy_.as<int32_t>(), greedy_.get(), B * sizeof(int32_t),
                                                   cudaMemcpyDeviceToHost, stream_),
                                   "greedy download");
        !status.ok())
      return status;
    // Runs of consecutive wanted rows, one copy each.
    for (int64_t b = 0; b < B;) {
      if (!batch[b].want_logits) {
        ++b;
        continue;
      }
      int64_t e = b;
      while (e < B && batch[e].want_logits) ++e;
      if (absl::Status status =
              Cuda(cudaMemcpyAsync(hlogits_.as<uint8_t>() + b * V * es_, logits_.as<uint8_t>() + b * V * es_,
                                   (e - b) * V * es_, cudaMemcpyDeviceToHost, stream_),
                   "logits download");
          !status.ok())
        return status;
      b = e;
    }
    if (absl::Status status = Cuda(cudaStreamSynchronize(stream_), "forward step"); !status.ok()) return status;
    out->greedy.assign(hgreedy_.as<int32_t>(), hgreedy_.as<int32_t>() + B);
    // Sized only when a row is wanted: a greedy step must not clear B x vocab floats.
    const bool any = std::any_of(batch.begin(), batch.end(), [](const SeqForward& f) { return f.want_logits; });
    out->logits.resize(any ? B * V : 0);
    for (int64_t b = 0; b < B; ++b) {
      if (batch[b].want_logits) ConvertToFloat(hlogits_.as<uint8_t>() + b * V * es_, V, out->logits.data() + b * V);
    }
    return absl::OkStatus();
  }

  const int32_t* Idx(int64_t offset) const { return didx_.as<int32_t>() + offset; }
  uint8_t* KCache(int64_t l) const { return k_cache_.as<uint8_t>() + l * layer_slots_ * c_.kv_dim() * es_; }
  uint8_t* VCache(int64_t l) const { return v_cache_.as<uint8_t>() + l * layer_slots_ * c_.kv_dim() * es_; }

  // The config of kernel k at M rows: the tuning cache's for M's bucket,
  // looked up the first time that bucket is needed ("" without one).
  const std::string& Tuned(ModelKernel k, int64_t M) {
    static const std::string kBuiltin;
    if (builtin_only_) return kBuiltin;
    std::vector<std::string>& v = tuned_[static_cast<int>(k)];
    size_t bucket = 0;
    while ((int64_t{1} << bucket) < M) ++bucket;
    while (v.size() <= bucket) {
      const ModelKernelKey key = KeyOfModelKernel(c_, k, int64_t{1} << v.size());
      v.push_back(o_.tuned ? o_.tuned(key.op, dt_, key.key) : std::string());
    }
    return v[bucket];
  }

  // y = x . w^T.   x [M,K]; w [N,K]; y [M,N]
  cuda::GemmParams LinearParams(const void* x, const void* w, int64_t M, int64_t K, int64_t N, void* y) const {
    cuda::GemmParams a;
    a.dtype = dt_;
    a.M = M;
    a.N = N;
    a.K = K;
    a.x = x;
    a.w = w;
    a.y = y;
    return a;
  }
  absl::Status Linear(ModelKernel k, const void* x, const void* w, int64_t M, int64_t K, int64_t N, void* y) {
    return CudaToAbsl(LaunchLinearConfig(LinearParams(x, w, M, K, N, y), Tuned(k, M), stream_), "linear");
  }

  // The row-parallel projections' partial sums over the ranks (none unsharded).
  absl::Status AllReduce(void* data, int64_t count) {
    if (group_ == nullptr) return absl::OkStatus();
    return CudaToAbsl(group_->AllReduceSum(shard_.rank, data, static_cast<size_t>(count), dt_, stream_),
                      "tensor-parallel all-reduce");
  }

  absl::Status Norm(cuda::NormKind kind, const void* x, const void* residual, const void* weight, int64_t rows, void* y,
                    void* residual_out) {
    cuda::NormParams p;
    p.kind = kind;
    p.dtype = dt_;
    p.x = x;
    p.residual = residual;
    p.weight = weight;
    p.y = y;
    p.residual_out = residual_out;
    p.rows = rows;
    p.hidden = c_.hidden;
    p.eps = static_cast<float>(c_.rms_eps);
    cuda::NormConfig config;  // unparsable or "": the launcher's default
    cuda::ParseNormConfig(Tuned(kind == cuda::NormKind::kRms ? ModelKernel::kInputNorm : ModelKernel::kAddNorm, rows),
                          &config);
    return CudaToAbsl(cuda::LaunchNorm(p, config, stream_), "rms_norm");
  }

  // Enqueues the whole step (no host synchronisation: also what a graph holds).
  absl::Status EnqueueForward(const Step& st) {
    if (absl::Status status = CudaToAbsl(
            cuda::LaunchGatherRows(embed_.get(), Idx(ix_.tokens), st.T, c_.hidden * es_, x_[0].get(), stream_),
            "embedding");
        !status.ok())
      return status;
    if (FusedDecode(st)) return EnqueueFusedDecode(st);
    if (absl::Status status = EnqueueLayers(st, 0, c_.layers); !status.ok()) return status;
    if (shard_.rank != 0 && !vocab_parallel_) return absl::OkStatus();  // rank 0 alone runs a replicated head
    // h holds final_norm(x); the LM head runs on each sequence's last row.
    if (absl::Status status = CudaToAbsl(
            cuda::LaunchGatherRows(h_.get(), Idx(ix_.last_rows), st.B, c_.hidden * es_, last_.get(), stream_),
            "last rows");
        !status.ok())
      return status;
    return EnqueueLmHead(st, last_.get());
  }

  // Logits of the B rows (normed, [B, D]) into logits_ and their argmax:
  // on rank 0 over the whole vocabulary or, vocabulary-parallel, each rank
  // over its rows, then gathered to rank 0 ([rank][B][part] -> [B][vocab]).
  absl::Status EnqueueLmHead(const Step& st, const void* rows) {
    const int64_t B = st.B, D = c_.hidden, V = c_.vocab;
    if (!vocab_parallel_) {
      if (absl::Status status = Linear(ModelKernel::kLmHead, rows, lm_head_, B, D, V, logits_.get()); !status.ok())
        return status;
    } else {
      const int64_t per = vocab_parts_[0].vocab;  // each rank's stride in the gather
      if (absl::Status status = Linear(ModelKernel::kLmHead, rows, lm_head_, B, D, shard_.vocab, head_part_.get());
          !status.ok())
        return status;
      if (absl::Status status = CudaToAbsl(group_->AllGather(shard_.rank, head_part_.get(), head_parts_.get(),
                                                             static_cast<size_t>(B * per), dt_, stream_),
                                           "logits all-gather");
          !status.ok())
        return status;
      if (shard_.rank != 0) return absl::OkStatus();
      for (int r = 0; r < shard_.size; ++r) {
        const int64_t begin = vocab_parts_[r].vocab_begin, n = vocab_parts_[r].vocab;
        if (absl::Status status = Cuda(cudaMemcpy2DAsync(logits_.as<uint8_t>() + begin * es_, V * es_,
                                                         head_parts_.as<uint8_t>() + r * B * per * es_, n * es_,
                                                         n * es_, B, cudaMemcpyDeviceToDevice, stream_),
                                       "logits parts");
            !status.ok())
          return status;
      }
    }
    return CudaToAbsl(
        cuda::LaunchArgmaxRows(dt_, logits_.get(), B, V, greedy_.as<int32_t>(), argmax_ws_.get(), stream_),
        "greedy argmax");
  }

  // A row-parallel projection (which: 0 o_proj, 1 down) of x [T, K], then
  // the residual add and the norm: residual_out = x . w^T (summed over the
  // ranks) + residual, y = rms_norm(residual_out) * weight. Unsharded, where
  // the projection runs on cuBLASLt, the GEMM adds the residual itself (C,
  // beta = 1) and a plain rms_norm follows: add_rms_norm's extra read and
  // write of [T, D] go (2 x 22 us a layer of an 8B prefill of 4096 tokens).
  absl::Status ProjectAddNorm(ModelKernel k, int which, const void* x, const void* w, int64_t T, int64_t K,
                              const void* residual, const void* weight, void* y, void* residual_out) {
    cuda::GemmParams g = LinearParams(x, w, T, K, c_.hidden, residual_out);
    cuda::LinearConfig config;
    cuda::ParseLinearConfig(Tuned(k, T), &config);
    if (residual_in_gemm_ && cuda::LinearRunsGemm(g, config)) {
      g.residual = residual;
      if (absl::Status status = CudaToAbsl(cuda::LaunchLinear(g, config, stream_), "linear + residual"); !status.ok())
        return status;
      return Norm(cuda::NormKind::kRms, residual_out, nullptr, weight, T, y, nullptr);
    }
    void* sums = PartialSums(T, which);
    if (absl::Status status = Linear(k, x, w, T, K, c_.hidden, sums); !status.ok()) return status;
    return AllReduceAddNorm(which, sums, T, residual, weight, y, residual_out);
  }

  // Whether a step of T rows runs the fused all-reduce + norm (TpAddNorm).
  bool FusedAddNorm(int64_t T) const { return add_norm_ != nullptr && T <= add_norm_->max_rows(); }

  // Where a row-parallel projection (which: 0 o_proj, 1 down) writes its
  // partial sums for T rows: TpAddNorm's buffer, the symmetric window when
  // they fit (kSymmetricMaxBytes), else tmp_.
  void* PartialSums(int64_t T, int which) const {
    if (FusedAddNorm(T)) return add_norm_->partial_sums(which, T);
    return static_cast<size_t>(T * c_.hidden) * es_ <= symmetric_bytes_ ? symmetric_ : tmp_.get();
  }

  // After a row-parallel projection: residual_out = the ranks' sum of `sums`
  // (PartialSums(T, which)) + residual, y = rms_norm(residual_out) * weight.
  absl::Status AllReduceAddNorm(int which, void* sums, int64_t T, const void* residual, const void* weight, void* y,
                                void* residual_out) {
    if (FusedAddNorm(T))
      return CudaToAbsl(
          add_norm_->Launch(which, T, residual, weight, static_cast<float>(c_.rms_eps), y, residual_out, stream_),
          "tensor-parallel all-reduce + norm");
    if (absl::Status status = AllReduce(sums, T * c_.hidden); !status.ok()) return status;
    return Norm(cuda::NormKind::kAddRms, sums, residual, weight, T, y, residual_out);
  }

  // Where kernel k's projection runs at M rows in the fused
  // decode step (its tuned config or the built-in rule): the GEMV, the narrow
  // skinny GEMM (both take gemv.h's decode epilogues), or another path.
  enum class DecodePath { kGemv, kSkinny, kOther };
  DecodePath DecodeProjection(ModelKernel k, int64_t M) {
    const std::string& config = Tuned(k, M);
    cuda::LinearPath path = cuda::LinearPath::kDefault;
    int algo = 0;
    if (k == ModelKernel::kSwiglu) {
      cuda::SwigluMlpConfig c;
      cuda::ParseSwigluMlpConfig(config, &c);
      path = c.path;
    } else {
      cuda::LinearConfig c;
      cuda::ParseLinearConfig(config, &c);
      path = c.path;
      algo = c.algo;
    }
    using cuda::LinearPath;
    if (path == LinearPath::kGemv || (path == LinearPath::kDefault && cuda::GemvByDefault(M))) return DecodePath::kGemv;
    if (M <= cuda::kSkinnyNarrowMaxM && (path == LinearPath::kDefault || (path == LinearPath::kSkinny && algo == 0)))
      return DecodePath::kSkinny;
    // 33-64 rows: the layers' projections on the Hopper skinny kernel, whose
    // epilogues save the norm and rope kernels (kDecodeSkinnyWide).
    if ((fuse_ & CudaModelRunnerOptions::kDecodeSkinnyWide) != 0 && k != ModelKernel::kLmHead &&
        M <= cuda::kSkinnyMaxM && cuda::SkinnyHopperAvailable() &&
        (path == LinearPath::kDefault || path == LinearPath::kSkinny))
      return DecodePath::kSkinny;
    return DecodePath::kOther;
  }

  // Whether the projection (N outputs, reduction K) of kernel k runs fused at
  // T rows: its DecodeProjection and the kernel's shape rules.
  bool DecodeFusable(ModelKernel k, int64_t T, int64_t N, int64_t K) {
    switch (DecodeProjection(k, T)) {
      case DecodePath::kGemv:
        return cuda::GemvShape(dt_, T, K);
      case DecodePath::kSkinny:
        return (fuse_ & CudaModelRunnerOptions::kDecodeSkinny) != 0 &&
               (fuse_ & CudaModelRunnerOptions::kDecodeFuseNorm) == 0 && cuda::SkinnyGemmShape(dt_, T, N, K);
      default:
        return false;
    }
  }

  // A pure-decode step (one token per sequence, so row b is sequence b's last
  // row) whose layers' projections all run the GEMV or the narrow skinny GEMM:
  // the fused decode layers apply (on a tensor-parallel rank only the rope
  // fusion: its o_proj and down sums are all-reduced before the residual add).
  // The LM head may run any path (after a norm kernel when not fused).
  bool FusedDecode(const Step& st) {
    if (fuse_ == 0 || st.block_layers || st.use_flash || st.T != st.B || st.R != st.T) return false;
    // A rank's residual add follows the all-reduce: no folding into epilogues.
    if (group_ != nullptr && (fuse_ & CudaModelRunnerOptions::kDecodeFuseNorm) != 0) return false;
    if (dt_ != DType::kBF16 && dt_ != DType::kF16) return false;
    const int64_t T = st.T, D = c_.hidden, qd = c_.q_dim(), I = c_.intermediate;
    return DecodeFusable(ModelKernel::kQkv, T, qd + 2 * c_.kv_dim(), D) &&
           DecodeFusable(ModelKernel::kOProj, T, D, qd) && DecodeFusable(ModelKernel::kSwiglu, T, I, D) &&
           DecodeFusable(ModelKernel::kDown, T, D, I);
  }

  // Rope over the step's qkv rows (wqkv's interleaved layout, Upload): q to
  // q_, k/v into layer l's cache slots (not for TransformerBlock, which has
  // no cache) and, with dense_kv, also to k_/v_ (what flash prefill reads).
  absl::Status RopeKvWrite(const Step& st, int64_t l, bool dense_kv) {
    cuda::RopeKvParams rp;
    rp.dtype = dt_;
    rp.qkv = qkv_.get();
    rp.positions = Idx(ix_.positions);
    rp.cos_sin = cos_sin_.as<float2>();
    rp.slots = st.block_layers ? nullptr : Idx(ix_.slots);
    rp.q = q_.get();
    rp.k = dense_kv ? k_.get() : nullptr;
    rp.v = dense_kv ? v_.get() : nullptr;
    rp.k_cache = st.block_layers ? nullptr : KCache(l);
    rp.v_cache = st.block_layers ? nullptr : VCache(l);
    rp.T = st.T;
    rp.Hq = static_cast<int>(c_.q_heads);
    rp.Hkv = static_cast<int>(c_.kv_heads);
    rp.D = static_cast<int>(c_.head_dim);
    rp.interleaved = true;
    return CudaToAbsl(cuda::LaunchRopeKvWrite(rp, stream_), "rope_kv_write");
  }

  // The decode megakernel (decode_megakernel.h) for one-row steps, when the
  // fusion mask asks for it and the model fits it: its layer table (weights
  // and this cache's layers) and workspace, rebuilt with the cache.
  absl::Status InitMegakernel() {
    mega_ = (fuse_ & CudaModelRunnerOptions::kDecodeMegakernel) != 0 && group_ == nullptr &&
            cuda::DecodeMegakernelSupported(dt_, static_cast<int>(c_.hidden), static_cast<int>(c_.intermediate),
                                            static_cast<int>(c_.q_heads), static_cast<int>(c_.kv_heads),
                                            static_cast<int>(c_.head_dim));
    if (!mega_) return absl::OkStatus();
    std::vector<cuda::MegaLayer> table(c_.layers);
    for (int64_t l = 0; l < c_.layers; ++l) {
      const Layer& L = layers_[l];
      table[l] = {L.attn_norm.get(), L.wqkv.get(), L.wo.get(), L.mlp_norm.get(),
                  L.gate_up.get(),   L.down.get(), KCache(l),  VCache(l)};
    }
    const size_t ws =
        cuda::DecodeMegakernelWorkspaceBytes(static_cast<int>(c_.intermediate), static_cast<int>(c_.q_heads),
                                             static_cast<int>(c_.kv_heads), static_cast<int>(c_.head_dim));
    if (absl::Status status = CudaToAbsl(mega_layers_.Allocate(table.size() * sizeof(table[0])), "megakernel table");
        !status.ok())
      return status;
    if (absl::Status status = CudaToAbsl(mega_ws_.Allocate(ws), "megakernel workspace"); !status.ok()) return status;
    if (absl::Status status = Cuda(cudaMemsetAsync(mega_ws_.get(), 0, ws, stream_), "megakernel workspace clear");
        !status.ok())
      return status;
    return Cuda(cudaMemcpyAsync(mega_layers_.get(), table.data(), table.size() * sizeof(table[0]),
                                cudaMemcpyHostToDevice, stream_),
                "megakernel table upload");
  }

  // Every layer of a one-row decode step in the megakernel: x_[0] holds the
  // residual row before and after.
  absl::Status EnqueueMegakernelLayers() {
    cuda::DecodeMegaParams p;
    p.dtype = dt_;
    p.layers = mega_layers_.as<cuda::MegaLayer>();
    p.num_layers = static_cast<int>(c_.layers);
    p.D = static_cast<int>(c_.hidden);
    p.I = static_cast<int>(c_.intermediate);
    p.Hq = static_cast<int>(c_.q_heads);
    p.Hkv = static_cast<int>(c_.kv_heads);
    p.Dh = static_cast<int>(c_.head_dim);
    p.eps = static_cast<float>(c_.rms_eps);
    p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.head_dim)));
    p.x = x_[0].get();
    p.position = Idx(ix_.positions);
    p.slot = Idx(ix_.slots);
    p.ctx = Idx(ix_.ctx);
    p.block_table = Idx(ix_.block_tables);
    p.block_size = static_cast<int>(block_size_);
    p.cos_sin = cos_sin_.as<float2>();
    p.workspace = mega_ws_.get();
    return CudaToAbsl(cuda::LaunchDecodeMegakernel(p, stream_), "decode megakernel");
  }

  // The decode step on the fused GEMVs (gemv.h), 5 kernels a layer instead
  // of 8 with every fusion (fuse_ bits, CudaModelRunnerOptions::decode_fusion):
  //   norm  QKV and gate_up fold the RMS norm of the residual in, o_proj and
  //         down add the residual in their epilogues, the LM head folds the
  //         final norm in;
  //   norm epilogue  o_proj and down add the residual and write x * weight
  //         of the next norm with each row's sum of squares, which QKV,
  //         gate_up and the LM head turn into the rstd in their epilogues;
  //   else the (add_)rms_norm kernels as in EnqueueLayers;
  //   rope  the QKV projection rotates q/k and writes q and the cache rows; else
  //         the QKV output and the rope kernel.
  // Either way the LM head reads the step's rows directly (one row per
  // sequence: no gather). EnqueueLayers is the reference.
  absl::Status EnqueueFusedDecode(const Step& st) {
    const int64_t T = st.T, D = c_.hidden, qd = c_.q_dim(), I = c_.intermediate;
    const int64_t qkvd = qd + 2 * c_.kv_dim();
    const float eps = static_cast<float>(c_.rms_eps);
    const bool fuse_norm = (fuse_ & CudaModelRunnerOptions::kDecodeFuseNorm) != 0;
    const bool fuse_rope = (fuse_ & CudaModelRunnerOptions::kDecodeFuseRope) != 0;
    auto gemv = [&](ModelKernel k, const void* x, const void* w, int64_t N, int64_t K, void* y,
                    const cuda::GemvFusion& f, const char* what) {
      return CudaToAbsl(DecodeProjection(k, T) == DecodePath::kGemv
                            ? cuda::LaunchGemvFused(dt_, T, N, K, x, w, y, f, stream_)
                            : cuda::LaunchSkinnyGemmFused(dt_, T, N, K, x, w, y, f, stream_),
                        what);
    };
    int cur = 0;
    const bool mega = mega_ && T == 1;
    // The norms in the GEMV epilogues: h_ then holds y * weight of the last
    // o_proj / down and sq_ its sums of y^2 (the first layer's h_ comes
    // from the norm kernel, normalised already).
    const bool norm_epi =
        (fuse_ & CudaModelRunnerOptions::kDecodeNormEpilogue) != 0 && !fuse_norm && !mega && group_ == nullptr;
    unsigned long long* sq_attn = sq_.as<unsigned long long>() + kNormSumsRows;  // down -> QKV, LM head
    unsigned long long* sq_mlp = sq_.as<unsigned long long>();                   // o_proj -> gate_up
    if (norm_epi) {  // each producer adds into zeros; the step starts from zeros whatever ran before
      if (absl::Status status = Cuda(cudaMemsetAsync(sq_.get(), 0, kNormSumsBytes, stream_), "norm sums clear");
          !status.ok())
        return status;
    }
    if (mega) {
      if (absl::Status status = EnqueueMegakernelLayers(); !status.ok()) return status;
      // What the last layer's add + norm leaves for an LM head without the norm folded in.
      if (!fuse_norm) {
        if (absl::Status status =
                Norm(cuda::NormKind::kRms, x_[0].get(), nullptr, final_norm_.get(), T, h_.get(), nullptr);
            !status.ok())
          return status;
      }
    } else if (!fuse_norm) {
      if (absl::Status status =
              Norm(cuda::NormKind::kRms, x_[0].get(), nullptr, layers_[0].attn_norm.get(), T, h_.get(), nullptr);
          !status.ok())
        return status;
    }
    for (int64_t l = 0; l < (mega ? 0 : c_.layers); ++l) {
      const Layer& L = layers_[l];
      cuda::GemvFusion qkv;
      if (fuse_norm) {
        qkv.norm_weight = L.attn_norm.get();
        qkv.eps = eps;
      } else if (norm_epi && l > 0) {
        qkv.sq_in = sq_attn;
        qkv.eps = eps;
      }
      const void* qkv_in = fuse_norm ? x_[cur].get() : h_.get();
      if (fuse_rope) {
        qkv.rope_kv = true;
        qkv.rope.positions = Idx(ix_.positions);
        qkv.rope.cos_sin = cos_sin_.as<float2>();
        qkv.rope.slots = Idx(ix_.slots);
        qkv.rope.q = q_.get();
        qkv.rope.k_cache = KCache(l);
        qkv.rope.v_cache = VCache(l);
        qkv.rope.Hq = static_cast<int>(c_.q_heads);
        qkv.rope.Hkv = static_cast<int>(c_.kv_heads);
        qkv.rope.D = static_cast<int>(c_.head_dim);
        if (absl::Status status = gemv(ModelKernel::kQkv, qkv_in, L.wqkv.get(), qkvd, D, nullptr, qkv, "qkv+rope");
            !status.ok())
          return status;
      } else {
        if (absl::Status status = gemv(ModelKernel::kQkv, qkv_in, L.wqkv.get(), qkvd, D, qkv_.get(), qkv, "qkv");
            !status.ok())
          return status;
        if (absl::Status status = RopeKvWrite(st, l, /*dense_kv=*/false); !status.ok()) return status;
      }
      if (absl::Status status = Attention(st, l); !status.ok()) return status;
      // o_proj (+ residual), then gate_up; down (+ residual), then the next QKV.
      for (int half = 0; half < 2; ++half) {
        const void* in = half == 0 ? ao_.get() : act_.get();
        const void* w = half == 0 ? L.wo.get() : L.down.get();
        const int64_t K = half == 0 ? qd : I;
        const ModelKernel k = half == 0 ? ModelKernel::kOProj : ModelKernel::kDown;
        const void* next_w = half == 0           ? L.mlp_norm.get()
                             : l + 1 < c_.layers ? layers_[l + 1].attn_norm.get()
                                                 : final_norm_.get();
        if (fuse_norm || norm_epi) {
          cuda::GemvFusion r;
          r.residual = x_[cur].get();
          if (norm_epi) {
            r.norm_next = next_w;
            r.norm_out = h_.get();
            r.sq_out = half == 0 ? sq_mlp : sq_attn;
            r.sq_clear = half == 0 ? sq_attn : sq_mlp;  // read by this layer's QKV / gate_up, done
          }
          if (absl::Status status = gemv(k, in, w, D, K, x_[1 - cur].get(), r, "o_proj/down"); !status.ok())
            return status;
        } else {
          void* sums = PartialSums(T, half);
          if (absl::Status status = gemv(k, in, w, D, K, sums, cuda::GemvFusion{}, "o_proj/down"); !status.ok())
            return status;
          if (absl::Status status = AllReduceAddNorm(half, sums, T, x_[cur].get(), next_w, h_.get(), x_[1 - cur].get());
              !status.ok())
            return status;
        }
        cur = 1 - cur;
        if (half == 1) break;
        const void* gate_in = fuse_norm ? x_[cur].get() : h_.get();
        cuda::GemvFusion g;
        if (fuse_norm) g.norm_weight = L.mlp_norm.get();
        if (norm_epi) g.sq_in = sq_mlp;
        g.eps = eps;
        if (absl::Status status = CudaToAbsl(
                DecodeProjection(ModelKernel::kSwiglu, T) == DecodePath::kGemv
                    ? cuda::LaunchGemvSwigluFused(dt_, T, D, I, gate_in, L.gate_up.get(), act_.get(), g, stream_)
                    : cuda::LaunchSkinnySwigluFused(dt_, T, D, I, gate_in, L.gate_up.get(), act_.get(), g, stream_),
                "gate_up");
            !status.ok())
          return status;
      }
    }
    if (group_ != nullptr) {
      if (shard_.rank != 0 && !vocab_parallel_) return absl::OkStatus();
      return EnqueueLmHead(st, h_.get());  // h holds final_norm(x), one row a sequence
    }
    if (!DecodeFusable(ModelKernel::kLmHead, T, c_.vocab, D)) {
      // The LM head on another path: the final norm as a kernel (with the
      // norm epilogues h_ holds x * weight, not yet scaled by the rstd).
      if (norm_epi || fuse_norm) {
        if (absl::Status status =
                Norm(cuda::NormKind::kRms, x_[cur].get(), nullptr, final_norm_.get(), T, h_.get(), nullptr);
            !status.ok())
          return status;
      }
      return EnqueueLmHead(st, h_.get());
    }
    cuda::GemvFusion head;
    if (fuse_norm) {
      head.norm_weight = final_norm_.get();
      head.eps = eps;
    } else if (norm_epi) {
      head.sq_in = sq_attn;
      head.eps = eps;
    }
    if (absl::Status status = gemv(ModelKernel::kLmHead, fuse_norm ? x_[cur].get() : h_.get(), lm_head_, c_.vocab, D,
                                   logits_.get(), head, "lm_head");
        !status.ok())
      return status;
    return CudaToAbsl(
        cuda::LaunchArgmaxRows(dt_, logits_.get(), st.B, c_.vocab, greedy_.as<int32_t>(), argmax_ws_.get(), stream_),
        "greedy argmax");
  }

  // Layers [first, end) over x_[0]; the residual ends in x_[0] again and h
  // as final_norm(x) (what the LM head needs; TransformerBlock ignores it).
  absl::Status EnqueueLayers(const Step& st, int64_t first, int64_t end) {
    const int64_t T = st.T, D = c_.hidden, qd = c_.q_dim(), kvd = c_.kv_dim(), I = c_.intermediate;
    const int64_t qkvd = qd + 2 * kvd;
    int cur = 0;
    if (absl::Status status =
            Norm(cuda::NormKind::kRms, x_[cur].get(), nullptr, layers_[first].attn_norm.get(), T, h_.get(), nullptr);
        !status.ok())
      return status;
    for (int64_t l = first; l < end; ++l) {
      const Layer& L = layers_[l];
      if (absl::Status status = Linear(ModelKernel::kQkv, h_.get(), L.wqkv.get(), T, D, qkvd, qkv_.get()); !status.ok())
        return status;
      if (absl::Status status = RopeKvWrite(st, l, /*dense_kv=*/true); !status.ok()) return status;
      if (absl::Status status = Attention(st, l); !status.ok()) return status;
      if (absl::Status status = ProjectAddNorm(ModelKernel::kOProj, 0, ao_.get(), L.wo.get(), T, qd, x_[cur].get(),
                                               L.mlp_norm.get(), h_.get(), x_[1 - cur].get());
          !status.ok())
        return status;
      cur = 1 - cur;
      if (absl::Status status =
              CudaToAbsl(LaunchSwigluGate(dt_, T, D, I, h_.get(), L.gate_up.get(), act_.get(), gu_.get(),
                                          Tuned(ModelKernel::kSwiglu, T), Tuned(ModelKernel::kGateUp, T), stream_),
                         "swiglu");
          !status.ok())
        return status;
      // Next layer's input norm fused with the residual add (the final norm
      // after the last layer; outside Forward only the new residual is kept).
      const void* next_w = l + 1 < end ? layers_[l + 1].attn_norm.get() : final_norm_.get();
      if (absl::Status status = ProjectAddNorm(ModelKernel::kDown, 1, act_.get(), L.down.get(), T, I, x_[cur].get(),
                                               next_w, h_.get(), x_[1 - cur].get());
          !status.ok())
        return status;
      cur = 1 - cur;
    }
    if (cur != 0) {
      if (absl::Status status =
              Cuda(cudaMemcpyAsync(x_[0].get(), x_[cur].get(), T * D * es_, cudaMemcpyDeviceToDevice, stream_),
                   "residual copy");
          !status.ok())
        return status;
    }
    return absl::OkStatus();
  }

  absl::Status Attention(const Step& st, int64_t l) {
    const int Hq = static_cast<int>(c_.q_heads), Hkv = static_cast<int>(c_.kv_heads);
    const int Dh = static_cast<int>(c_.head_dim);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.head_dim)));
    if (st.use_flash) {
      cuda::AttentionParams a;
      a.dtype = dt_;
      a.q = q_.get();
      a.k = k_.get();
      a.v = v_.get();
      if (st.Tk > 0) {
        // Later chunks: every sequence's keys from the cache (this layer's
        // rows of the step are already there: rope_kv_write ran).
        const int64_t row_bytes = c_.kv_dim() * es_;
        const int32_t* slots = dkv_.as<int32_t>() + (st.B + 31) / 32 * 32;
        if (absl::Status status = CudaToAbsl(
                cuda::LaunchGatherRows(KCache(l), slots, st.Tk, row_bytes, kg_.get(), stream_), "chunk K gather");
            !status.ok())
          return status;
        if (absl::Status status = CudaToAbsl(
                cuda::LaunchGatherRows(VCache(l), slots, st.Tk, row_bytes, vg_.get(), stream_), "chunk V gather");
            !status.ok())
          return status;
        a.k = kg_.get();
        a.v = vg_.get();
        a.k_starts = dkv_.as<int32_t>();
        a.Tk = static_cast<int>(st.Tk);
      }
      a.o = ao_.get();
      a.seq_lens = Idx(ix_.seq_lens);
      a.B = static_cast<int>(st.B);
      a.T = static_cast<int>(st.T);
      a.max_seqlen = static_cast<int>(st.max_prefill);
      a.Hq = Hq;
      a.Hkv = Hkv;
      a.D = Dh;
      a.causal = true;
      a.scale = scale;
      cuda::AttentionConfig ac;
      if (!cuda::ParseAttentionConfig(Tuned(ModelKernel::kAttention, st.T), &ac) ||
          (st.Tk > 0 && ac.hopper_stages == 0)) {
        ac = cuda::DefaultAttentionConfig(a, sm_count_);  // k_starts: the Hopper kernel (chunk_flash_)
      }
      if (absl::Status status = CudaToAbsl(cuda::LaunchAttentionPrefill(a, ac, stream_), "attention prefill");
          !status.ok())
        return status;
      if (st.block_layers) return absl::OkStatus();
    }
    if (st.R == 0) return absl::OkStatus();
    cuda::PagedAttentionParams p;
    p.dtype = dt_;
    p.q = q_.get();
    p.o = ao_.get();
    p.rows = Idx(ix_.rows);
    p.row_seq = Idx(ix_.row_seq);
    p.ctx_lens = Idx(ix_.ctx);
    p.R = static_cast<int>(st.R);
    p.Hq = Hq;
    p.Hkv = Hkv;
    p.D = Dh;
    p.scale = scale;
    if (st.block_layers) {
      // TransformerBlock: sequence b's dense k/v rows [b*S, (b+1)*S) are its one "block".
      p.k_cache = k_.get();
      p.v_cache = v_.get();
      p.block_tables = Idx(ix_.last_rows);
      p.bt_stride = 1;
      p.block_size = static_cast<int>(st.block_size);
    } else {
      p.k_cache = KCache(l);
      p.v_cache = VCache(l);
      p.block_tables = Idx(ix_.block_tables);
      p.bt_stride_ptr = Idx(ix_.bt_width);
      p.block_size = static_cast<int>(block_size_);
      // One row a sequence, no flash pass: each row's key ctx - 1 is the only
      // one this step wrote (RopeKvWrite / the QKV epilogue just before).
      p.only_last_key_new = !st.use_flash && st.T == st.B && st.R == st.T;
    }
    return CudaToAbsl(cuda::LaunchPagedAttention(p, st.splits, ws_.get(), stream_), "paged attention");
  }

  void DropGraphs() {
    for (auto& entry : graphs_) {
      if (entry.second.exec != nullptr) cudaGraphExecDestroy(entry.second.exec);
      if (entry.second.graph != nullptr) cudaGraphDestroy(entry.second.graph);
    }
    graphs_.clear();
  }

  // Captures the pure-decode step for B = 1, 2, 4, ... max_graph_batch. Each
  // is run once eagerly first (cuBLASLt plans are built outside the capture)
  // on padding rows only, which touch nothing but the spare block.
  absl::Status CaptureGraphs() {
    DropGraphs();
    decode_report_.clear();
    const int64_t max_b = std::min<int64_t>(o_.max_graph_batch, cap_seqs_);
    if (absl::Status status = Reserve(std::max(cap_tokens_, max_b), std::max(cap_seqs_, max_b)); !status.ok())
      return status;
    std::map<int64_t, Graph> made;
    auto drop = [](Graph& g) {
      if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
      if (g.graph != nullptr) cudaGraphDestroy(g.graph);
      g = Graph{};
    };
    for (int64_t b = 1; b <= max_b; b *= 2) {
      ix_.Layout(b, b, b, b);
      hidx_.as<int32_t>()[ix_.bt_width] = 1;
      StagePadding(0, b, /*width=*/1);
      if (absl::Status status = UploadIndices(); !status.ok()) return status;
      Step st;
      st.T = st.B = st.R = b;
      // Split count fixed per bucket (each row cuts its own context in that
      // many parts), chosen for a long context.
      st.splits = cuda::PagedAttentionSplits(static_cast<int>(b), static_cast<int>(c_.kv_heads),
                                             static_cast<int>(max_bt_width_ * block_size_), sm_count_);
      Graph tuned;
      if (absl::Status status = CaptureStep(st, &tuned); !status.ok()) return status;
      // Ranks time nothing: each would pick alone, and a rank that errs in
      // between would leave the others waiting in a collective.
      if (!o_.compare_decode_graphs || group_ != nullptr || !UsesTunedConfigs(b)) {
        made[b] = tuned;
        continue;
      }
      // The tuner times each kernel alone; inside the graph a kernel
      // overlaps its neighbours (PDL) and finds other data in L2, and a
      // choice that won alone can lose there. So the step is timed both
      // ways, in context, and the faster graph is kept.
      builtin_only_ = true;
      Graph builtin;
      absl::Status captured = CaptureStep(st, &builtin);
      builtin_only_ = false;
      if (!captured.ok()) {
        drop(tuned);
        return captured;
      }
      double tuned_us = 0, builtin_us = 0;
      if (absl::Status status = TimeGraphs(tuned, builtin, &tuned_us, &builtin_us); !status.ok()) {
        drop(tuned);
        drop(builtin);
        return status;
      }
      const bool keep_tuned = tuned_us <= builtin_us;
      made[b] = keep_tuned ? tuned : builtin;
      drop(keep_tuned ? builtin : tuned);
      absl::StrAppend(&decode_report_, decode_report_.empty() ? "" : ", ", "B=", b, " ",
                      keep_tuned ? "tuned" : "built-in", " (", absl::SixDigits(tuned_us), " vs ",
                      absl::SixDigits(builtin_us), " us)");
    }
    graphs_ = std::move(made);
    return absl::OkStatus();
  }

  // Runs the step once eagerly (cuBLASLt plans are built outside the
  // capture; padding rows touch nothing but the spare block), then captures it.
  absl::Status CaptureStep(const Step& st, Graph* g) {
    if (absl::Status status = EnqueueForward(st); !status.ok()) return status;
    if (absl::Status status = Cuda(cudaStreamSynchronize(stream_), "graph warm-up step"); !status.ok()) return status;
    if (absl::Status status = Cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
        !status.ok())
      return status;
    absl::Status enq = EnqueueForward(st);
    const cudaError_t end = cudaStreamEndCapture(stream_, &g->graph);
    if (!enq.ok()) {
      if (g->graph != nullptr) cudaGraphDestroy(g->graph);
      g->graph = nullptr;
      return enq;
    }
    if (absl::Status status = Cuda(end, "end capture"); !status.ok()) return status;
    if (cudaError_t e = cudaGraphInstantiate(&g->exec, g->graph, 0); e != cudaSuccess) {
      cudaGraphDestroy(g->graph);
      g->graph = nullptr;
      return Cuda(e, "cudaGraphInstantiate");
    }
    return absl::OkStatus();
  }

  // Whether any kernel of a b-row step has a tuned config.
  bool UsesTunedConfigs(int64_t b) {
    for (int k = 0; k < kModelKernels; ++k) {
      if (!Tuned(static_cast<ModelKernel>(k), b).empty()) return true;
    }
    return false;
  }

  // Median over alternating rounds of the mean replay time of each graph, us.
  absl::Status TimeGraphs(const Graph& a, const Graph& b, double* a_us, double* b_us) {
    constexpr int kRounds = 7, kReplays = 4;
    cudaEvent_t ev[2];
    if (absl::Status status = Cuda(cudaEventCreate(&ev[0]), "cudaEventCreate"); !status.ok()) return status;
    if (absl::Status status = Cuda(cudaEventCreate(&ev[1]), "cudaEventCreate"); !status.ok()) {
      cudaEventDestroy(ev[0]);
      return status;
    }
    std::vector<double> ta, tb;
    absl::Status status;
    for (int r = 0; r < kRounds && status.ok(); ++r) {
      for (const Graph* g : {&a, &b}) {
        status = Cuda(cudaEventRecord(ev[0], stream_), "cudaEventRecord");
        for (int i = 0; i < kReplays && status.ok(); ++i) status = Cuda(cudaGraphLaunch(g->exec, stream_), "replay");
        if (status.ok()) status = Cuda(cudaEventRecord(ev[1], stream_), "cudaEventRecord");
        if (status.ok()) status = Cuda(cudaEventSynchronize(ev[1]), "cudaEventSynchronize");
        float ms = 0;
        if (status.ok()) status = Cuda(cudaEventElapsedTime(&ms, ev[0], ev[1]), "cudaEventElapsedTime");
        if (r > 0) (g == &a ? ta : tb).push_back(1000.0 * ms / kReplays);  // round 0 warms up
        if (!status.ok()) break;
      }
    }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    if (!status.ok()) return status;
    std::nth_element(ta.begin(), ta.begin() + ta.size() / 2, ta.end());
    std::nth_element(tb.begin(), tb.begin() + tb.size() / 2, tb.end());
    *a_us = ta[ta.size() / 2];
    *b_us = tb[tb.size() / 2];
    return absl::OkStatus();
  }

  const ModelConfig c_;     // this rank's shapes (ShardConfig; the model's when unsharded)
  const ModelConfig full_;  // the model's
  const CudaModelRunnerOptions o_;
  const TensorShard shard_;
  const cuda::NcclGroup* const group_;  // null: unsharded
  const int device_;
  DType dt_ = DType::kBF16;
  size_t es_ = 2;
  int sm_count_ = 0;
  bool flash_ok_ = false;
  bool chunk_flash_ = false;  // later prefill chunks run flash (Hopper kernel; FUSEDSERVE_CHUNK_FLASH=0: never)
  // Unsharded: o_proj / down on cuBLASLt add the residual (ProjectAddNorm;
  // FUSEDSERVE_RESIDUAL_IN_GEMM=0: never).
  bool residual_in_gemm_ = false;
  int fuse_ = 0;                        // decode fusion mask: options.decode_fusion, or FUSEDSERVE_DECODE_FUSION
  bool mega_ = false;                   // one-row decode steps run the megakernel (InitMegakernel)
  DeviceBuffer mega_layers_, mega_ws_;  // its layer table and workspace
  cudaStream_t stream_ = nullptr;

  DeviceBuffer embed_, final_norm_, lm_head_own_;  // lm_head_own_: a rank's rows when vocab_parallel_
  const void* lm_head_ = nullptr;
  bool vocab_parallel_ = false;
  std::vector<TensorShard> vocab_parts_;       // vocab_parallel_: every rank's shard (its vocabulary rows)
  DeviceBuffer head_part_, head_parts_;        // vocab_parallel_: [B][its rows] logits, and every rank's
  void* symmetric_ = nullptr;                  // NCCL symmetric window (the group owns it)
  std::unique_ptr<cuda::TpAddNorm> add_norm_;  // ranks: fused all-reduce + residual add + norm
  size_t symmetric_bytes_ = 0;
  std::vector<Layer> layers_;
  DeviceBuffer cos_sin_;
  int64_t table_rows_ = 0;

  int64_t num_blocks_ = 0, block_size_ = 0, layer_slots_ = 0, max_bt_width_ = 0;
  DeviceBuffer k_cache_, v_cache_;

  int64_t cap_tokens_ = 0, cap_seqs_ = 0;
  DeviceBuffer x_[2], h_, tmp_, qkv_, q_, k_, v_, ao_, gu_, act_, last_, logits_, ws_;
  PinnedBuffer hlogits_;
  DeviceBuffer greedy_, argmax_ws_;
  // The norm sums (GemvFusion::sq_out) o_proj and down pass to the next
  // projection: o_proj's [kNormSumsRows] rows, then down's.
  static constexpr int64_t kNormSumsRows = std::max(cuda::kGemvMaxM, cuda::kSkinnyMaxM);
  static constexpr size_t kNormSumsBytes = 2 * kNormSumsRows * sizeof(unsigned long long);
  DeviceBuffer sq_;
  PinnedBuffer hgreedy_;
  StepIndex ix_;         // the current step's layout
  int64_t cap_idx_ = 0;  // int32 elements didx_/hidx_ hold
  DeviceBuffer didx_;
  PinnedBuffer hidx_;
  // A step with later chunks in the flash launch (StageChunks): [k_starts
  // (B, padded to 32) | cache slots of the K/V rows (Tk)], and those rows.
  int64_t kv_idx_ = 0;  // int32 elements of the current step's chunk indices
  DeviceBuffer dkv_, kg_, vg_;
  PinnedBuffer hkv_;

  std::map<int64_t, Graph> graphs_;
  bool builtin_only_ = false;  // Tuned() answers "" (capturing the built-in graph to compare)
  std::string decode_report_;  // per decode bucket: which graph was kept, and the two step times
  // Tuned configs per kernel, by token bucket (index log2 of the bucket).
  std::array<std::vector<std::string>, kModelKernels> tuned_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCudaRankRunner(const ModelWeights& weights,
                                                                const CudaModelRunnerOptions& options,
                                                                const TensorShard& shard, const cuda::NcclGroup* group,
                                                                int device) {
  auto runner = std::make_unique<CudaModelRunner>(weights.config(), options, shard, group, device);
  if (absl::Status s = runner->Init(weights); !s.ok()) return s;
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCudaModelRunner(std::unique_ptr<ModelWeights> weights,
                                                                 const CudaModelRunnerOptions& options) {
  if (weights == nullptr) return absl::InvalidArgumentError("no weights");
  if (absl::Status s = weights->config().Validate(); !s.ok()) return s;
  if (options.tensor_parallel != 1 || options.force_tensor_parallel_path)
    return MakeCudaTensorParallelRunner(std::move(weights), options);
  absl::StatusOr<TensorShard> whole = ShardOf(weights->config(), 0, 1);
  if (!whole.ok()) return whole.status();
  return MakeCudaRankRunner(*weights, options, *whole, nullptr, options.device);
}

std::string CudaDecodeGraphReport(const ModelRunner& runner) {
  const auto* cuda = dynamic_cast<const CudaModelRunner*>(&runner);
  return cuda != nullptr ? cuda->decode_report() : std::string();
}

absl::StatusOr<int64_t> CudaKvCacheBlocks(const ModelRunner& runner, int device, int64_t block_size, double fraction,
                                          int64_t reserve_bytes) {
  if (block_size <= 0) return absl::InvalidArgumentError("block size must be positive");
  if (absl::Status status = Cuda(cudaSetDevice(device), "cudaSetDevice"); !status.ok()) return status;
  size_t free_b = 0, total_b = 0;
  if (absl::Status status = Cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"); !status.ok()) return status;
  const double usable = static_cast<double>(free_b) * fraction - static_cast<double>(reserve_bytes);
  const int64_t per_block = runner.KvBytesPerBlock(block_size);
  // One block fewer: the runner adds a spare one for graph padding rows.
  const int64_t blocks = static_cast<int64_t>(usable / static_cast<double>(per_block)) - 1;
  if (blocks < 2) {
    return absl::ResourceExhaustedError(
        absl::StrCat("free GPU memory (", free_b >> 20, " MiB) leaves no room for the KV cache"));
  }
  return blocks;
}

}  // namespace fusedserve

#endif  // FUSEDSERVE_HAVE_CUDA
