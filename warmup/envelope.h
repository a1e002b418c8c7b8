// The shape envelope: which (op, dtype, shape bucket) entries the server
// tunes and warms up at start.
//
// Default (no --envelope file): options.model_entries (the hosted model's
// own kernels, model/kernel_shapes.h), then the FusedOp entries below for
// each of options.model_shapes (and for the standard dims of WarmupOptions,
// Llama-3-8B's, only when model_entries or model_shapes is empty), dtype options.dtype,
// token buckets M = 1, 2, 4, ... RoundUpPow2(max_tokens), without repeating
// an entry:
//   rms_norm, add_rms_norm, add_rms_norm_silu, layer_norm  {M, hidden}
//   silu_and_mul {M, intermediate}   gelu {M, intermediate}   softmax {M, vocab}
//   rope {M, Hq, Hkv, D}
//   linear {M, (Hq + 2 Hkv) D, hidden} (QKV projection), {M, hidden, Hq D} (output projection)
//   swiglu_mlp {M, hidden, intermediate}   attention {M, Hq, Hkv, D}
//   attention_decode {B, L, Hq, Hkv, D} for L in {1024, 4096} and B = 1 ... 256
//     while the KV cache stays within 2 GiB
// Memory-bound ops come first so that fused ops can pick up their tuned
// sub-op configs.
//
// Envelope file (--envelope): a JSON list of entries,
//   [{"op": "rms_norm", "dtype": "bf16", "key": [4096, 4096]},
//    {"op": "linear",   "dtype": "f16",  "key": [1, 6144, 4096]}, ...]
// "key" is the op's TuningKey (kernels/op.h):
//   norms {M,H}  softmax {M,N}  silu_and_mul {M,I}  gelu {M,N}
//   rope {T,Hq,Hkv,D}  linear {M,N,K}  swiglu_mlp {M,D,I}
//   attention {T,Hq,Hkv,D}  attention_decode {B,L,Hq,Hkv,D}
// The token dim (and decode's L) is rounded up to its power-of-two bucket;
// duplicates after bucketing are dropped. dtype is "bf16", "f16" or "f32".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "warmup/warmup.h"

namespace fusedserve {

std::vector<EnvelopeEntry> DefaultEnvelope(const WarmupOptions& options);
absl::StatusOr<std::vector<EnvelopeEntry>> ParseEnvelope(const std::string& json_text);
// An envelope file lists at most a few thousand entries; a larger one is refused.
inline constexpr int64_t kMaxEnvelopeFileBytes = int64_t{16} << 20;
// Reads a regular file of at most kMaxEnvelopeFileBytes (a FIFO or device is
// refused, not blocked on; NOT_FOUND when missing) and parses it.
absl::StatusOr<std::vector<EnvelopeEntry>> LoadEnvelopeFile(const std::string& path);

// Checks a TuningKey's rank and dims for op.
absl::Status ValidateTuningKey(const std::string& op, const std::vector<int64_t>& key);
// "M=4096 H=4096", for log lines.
std::string FormatTuningKey(const std::string& op, const std::vector<int64_t>& key);
// A small key of the same op (token dim 1, other dims capped) for a quick
// functional run through a backend.
std::vector<int64_t> SmallTuningKey(const std::string& op, const std::vector<int64_t>& key);

}  // namespace fusedserve
