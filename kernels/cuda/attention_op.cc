// The CUDA entries of attention and attention_decode (kernels/cuda/
// attention.h): request -> AttentionParams / DecodeParams and the tuned
// AttentionConfig / DecodeConfig ("" or unparsable: the default).
#include <algorithm>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/dispatch.h"

namespace fusedserve {
namespace {

CudaStatus RunAttention(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                        DispatchContext& ctx) {
  const DeviceTensor& q = in.at("q");
  const DeviceTensor& k = in.at("k");
  cuda::AttentionParams a;
  a.dtype = q.dtype;
  a.q = q.data;
  a.k = k.data;
  a.v = in.at("v").data;
  a.o = out.at("o").data;
  a.seq_lens = static_cast<const int32_t*>(in.at("seq_lens").data);
  a.T = static_cast<int>(q.shape[0]);
  a.Hq = static_cast<int>(q.shape[1]);
  a.D = static_cast<int>(q.shape[2]);
  a.Hkv = static_cast<int>(k.shape[1]);
  const std::vector<int64_t> lens = host.in("seq_lens").ToInt64();
  a.B = static_cast<int>(lens.size());
  for (int64_t l : lens) a.max_seqlen = std::max<int>(a.max_seqlen, static_cast<int>(l));
  a.causal = host.b("causal");
  a.scale = static_cast<float>(AttentionScale(host));
  cuda::AttentionConfig c;
  if (!cuda::ParseAttentionConfig(ConfigOf(ctx, host, a.dtype), &c)) c = cuda::DefaultAttentionConfig(a, ctx.sm_count);
  return cuda::LaunchAttentionPrefill(a, c, ctx.stream);
}

CudaStatus RunAttentionDecode(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                              DispatchContext& ctx) {
  const DeviceTensor& q = in.at("q");
  const DeviceTensor& kc = in.at("k_cache");
  cuda::DecodeParams a;
  a.dtype = q.dtype;
  a.q = q.data;
  a.k_cache = kc.data;
  a.v_cache = in.at("v_cache").data;
  a.o = out.at("o").data;
  a.lengths = static_cast<const int32_t*>(in.at("lengths").data);
  a.B = static_cast<int>(q.shape[0]);
  a.Hq = static_cast<int>(q.shape[1]);
  a.D = static_cast<int>(q.shape[2]);
  a.L = static_cast<int>(kc.shape[1]);
  a.Hkv = static_cast<int>(kc.shape[2]);
  a.scale = static_cast<float>(AttentionScale(host));
  cuda::DecodeConfig c;
  cuda::ParseDecodeConfig(ConfigOf(ctx, host, a.dtype), &c);
  const int splits = cuda::DecodeSplits(a, c, ctx.sm_count);
  void* ws = nullptr;
  const size_t ws_bytes = cuda::DecodeWorkspaceBytes(a.B, a.Hq, a.D, splits);
  if (ws_bytes > 0) {
    if (ctx.scratch == nullptr) return CudaStatus::Error("attention_decode: no scratch memory");
    if (CudaStatus s = ctx.scratch->Get(ws_bytes, &ws); !s.ok()) return s;
  }
  return cuda::LaunchAttentionDecode(a, splits, ws, ctx.stream);
}

std::vector<std::string> PrefillCandidates(DType dtype, const std::vector<int64_t>&) {
  return FormatAll(cuda::AttentionCandidates(dtype), cuda::FormatAttentionConfig);
}

std::vector<std::string> DecodeCandidates(DType, const std::vector<int64_t>& key) {
  return FormatAll(cuda::DecodeCandidates(key[1]), cuda::FormatDecodeConfig);
}

}  // namespace

std::vector<CudaOp> AttentionCudaOps() {
  return {{"attention", RunAttention, PrefillCandidates}, {"attention_decode", RunAttentionDecode, DecodeCandidates}};
}

}  // namespace fusedserve
