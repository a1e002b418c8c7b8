// Dispatch of the compute-bound ops (linear, swiglu_mlp, attention,
// attention_decode) to their launchers, and their tunable candidates.
// Shapes come from the device tensors; the host request supplies attributes
// and the host copies of seq_lens (for the longest sequence). Configs (the
// linear, swiglu_mlp and attention launches for a config are in
// tuned_configs.h, which the model runner calls too):
//   linear            "algo=i" (i-th cuBLASLt heuristic algorithm) | "gemv" | "skinny"
//   swiglu_mlp        "path=gemm" (linear, SwiGLU kernel) | "path=gemv" | "path=skinny"
//                     (fused gate); the GEMMs run linear's configs for their keys
//   attention         "bm=128,w=4" | "bm=64,w=4" | "bm=128,w=8" (query rows, warps per CTA)
//   attention_decode  "splits=auto" | "splits=N" (KV-length splits)
// An empty config means the built-in rule for the shape; a config that cannot
// apply to a shape (GEMV for large M, say) falls back to that rule.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/tuned_configs.h"

namespace fusedserve {
namespace {

// Value of "name=value" in a config string, or "" when absent.
std::string ConfigValue(const std::string& config, const std::string& name) {
  const std::string prefix = name + "=";
  size_t pos = 0;
  while (pos < config.size()) {
    size_t end = config.find(',', pos);
    if (end == std::string::npos) end = config.size();
    const std::string item = config.substr(pos, end - pos);
    if (item.compare(0, prefix.size(), prefix) == 0) return item.substr(prefix.size());
    pos = end + 1;
  }
  return "";
}

int ParseInt(const std::string& s, int fallback) {
  if (s.empty()) return fallback;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  return (end != nullptr && *end == '\0') ? static_cast<int>(v) : fallback;
}

size_t AlignUp(size_t n) { return (n + 255) / 256 * 256; }

std::string Config(DispatchContext& ctx, const OpRequest& host, DType dtype) {
  return ctx.config ? ctx.config(host.op, dtype, TuningKey(host)) : std::string();
}

const DeviceTensor* Find(const DeviceTensorMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

CudaStatus RunLinear(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                     DispatchContext& ctx) {
  const DeviceTensor& x = in.at("x");
  const DeviceTensor& w = in.at("weight");
  const DeviceTensor* bias = Find(in, "bias");
  GemmArgs g;
  g.dtype = x.dtype;
  g.M = x.shape[0];
  g.K = x.shape[1];
  g.N = w.shape[0];
  g.x = x.data;
  g.w = w.data;
  g.bias = bias ? bias->data : nullptr;
  g.y = out.at("y").data;
  g.act = ParseActivation(host.s("activation"));
  return LaunchLinearConfig(g, Config(ctx, host, g.dtype), ctx.stream);
}

CudaStatus RunSwigluMlp(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                        DispatchContext& ctx) {
  const DeviceTensor& x = in.at("x");
  const DeviceTensor& gate_up = in.at("gate_up");
  const DeviceTensor& down = in.at("down");
  const DType dt = x.dtype;
  const int64_t M = x.shape[0], D = x.shape[1], I = down.shape[1];
  void* y = out.at("y").data;
  if (M == 0 || D == 0) return CudaStatus::Ok();
  if (ctx.scratch == nullptr) return CudaStatus::Error("swiglu_mlp: no scratch memory");
  const std::string config = Config(ctx, host, dt);
  // The GEMMs run linear's tuned configs for their own keys, as in the model.
  auto linear_config = [&](const std::vector<int64_t>& key) {
    return ctx.config ? ctx.config("linear", dt, key) : std::string();
  };
  const bool need_gu = SwigluGateNeedsScratch(dt, M, D, I, x.data, gate_up.data, config);
  const size_t es = DTypeSize(dt);
  const size_t h_bytes = AlignUp(static_cast<size_t>(M) * I * es);
  const size_t gu_bytes = need_gu ? AlignUp(static_cast<size_t>(M) * 2 * I * es) : 0;
  void* scratch = nullptr;
  if (CudaStatus s = ctx.scratch->Get(std::max<size_t>(h_bytes + gu_bytes, 256), &scratch); !s.ok()) return s;
  void* h = scratch;                                                     // [M,I]
  void* gu = need_gu ? static_cast<char*>(scratch) + h_bytes : nullptr;  // [M,2I]
  if (CudaStatus s =
          LaunchSwigluGate(dt, M, D, I, x.data, gate_up.data, h, gu, config, linear_config({M, 2 * I, D}), ctx.stream);
      !s.ok())
    return s;
  GemmArgs g2;
  g2.dtype = dt;
  g2.M = M;
  g2.N = D;
  g2.K = I;
  g2.x = h;
  g2.w = down.data;
  g2.y = y;
  return LaunchLinearConfig(g2, linear_config({M, D, I}), ctx.stream);
}

CudaStatus RunAttention(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                        DispatchContext& ctx) {
  const DeviceTensor& q = in.at("q");
  const DeviceTensor& k = in.at("k");
  AttentionArgs a;
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
  return LaunchAttentionConfig(a, Config(ctx, host, a.dtype), ctx.sm_count, ctx.stream);
}

CudaStatus RunAttentionDecode(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                              DispatchContext& ctx) {
  const DeviceTensor& q = in.at("q");
  const DeviceTensor& kc = in.at("k_cache");
  DecodeArgs a;
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
  int splits = ParseInt(ConfigValue(Config(ctx, host, a.dtype), "splits"), 0);
  if (splits <= 0) splits = DecodeDefaultSplits(a.dtype, a.B, a.L, a.Hq, a.Hkv, a.D, ctx.sm_count);
  splits = std::max(1, std::min(splits, std::max(1, a.L)));
  void* ws = nullptr;
  const size_t ws_bytes = DecodeWorkspaceBytes(a.B, a.Hq, a.D, splits);
  if (ws_bytes > 0) {
    if (ctx.scratch == nullptr) return CudaStatus::Error("attention_decode: no scratch memory");
    if (CudaStatus s = ctx.scratch->Get(ws_bytes, &ws); !s.ok()) return s;
  }
  return LaunchAttentionDecode(a, splits, ws, ctx.stream);
}

}  // namespace

CudaStatus LaunchLinearConfig(const GemmArgs& g, const std::string& config, cudaStream_t stream) {
  const bool gemv_ok = GemvSupported(g.dtype, g.M, g.K, g.x, g.w);
  // The skinny GEMM has no epilogue.
  const bool skinny_ok =
      g.bias == nullptr && g.act == Activation::kNone && SkinnyGemmSupported(g.dtype, g.M, g.N, g.K, g.x, g.w);
  if (config == "gemv" && gemv_ok) return LaunchGemv(g, stream);
  if (config == "skinny" && skinny_ok) return LaunchSkinnyGemm(g.dtype, g.M, g.N, g.K, g.x, g.w, g.y, stream);
  const std::string algo = ConfigValue(config, "algo");
  if (algo.empty()) {  // the built-in rule
    if (gemv_ok && g.M <= kGemvAutoMaxM) return LaunchGemv(g, stream);
    if (skinny_ok) return LaunchSkinnyGemm(g.dtype, g.M, g.N, g.K, g.x, g.w, g.y, stream);
  }
  return GemmForward(g, ParseInt(algo, 0), stream);
}

namespace {

enum class SwigluPath { kGemm, kGemv, kSkinny };

SwigluPath ChooseSwigluPath(DType dt, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                            const std::string& config) {
  const bool gemv_ok = GemvSupported(dt, M, D, x, gate_up);
  const bool skinny_ok = SkinnyGemmSupported(dt, M, I, D, x, gate_up);
  const std::string path = ConfigValue(config, "path");
  if (path == "gemv" && gemv_ok) return SwigluPath::kGemv;
  if (path == "skinny" && skinny_ok) return SwigluPath::kSkinny;
  if (path == "gemm") return SwigluPath::kGemm;
  if (gemv_ok && M <= kGemvAutoMaxM) return SwigluPath::kGemv;
  return skinny_ok ? SwigluPath::kSkinny : SwigluPath::kGemm;
}

}  // namespace

bool SwigluGateNeedsScratch(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                            const std::string& config) {
  return ChooseSwigluPath(dtype, M, D, I, x, gate_up, config) == SwigluPath::kGemm;
}

CudaStatus LaunchSwigluGate(DType dt, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                            void* gu, const std::string& config, const std::string& gate_up_config,
                            cudaStream_t stream) {
  switch (ChooseSwigluPath(dt, M, D, I, x, gate_up, config)) {
    case SwigluPath::kGemv:
      return LaunchGemvSwiglu(dt, M, D, I, x, gate_up, h, stream);
    case SwigluPath::kSkinny:
      return LaunchSkinnySwiglu(dt, M, D, I, x, gate_up, h, stream);
    case SwigluPath::kGemm:
      break;
  }
  if (gu == nullptr) return CudaStatus::Error("swiglu: the GEMM path needs gate_up scratch");
  GemmArgs g;
  g.dtype = dt;
  g.M = M;
  g.N = 2 * I;
  g.K = D;
  g.x = x;
  g.w = gate_up;
  g.y = gu;
  if (CudaStatus s = LaunchLinearConfig(g, gate_up_config, stream); !s.ok()) return s;
  return LaunchMlpSiluAndMul(dt, M, I, gu, h, stream);
}

CudaStatus LaunchAttentionConfig(const AttentionArgs& a, const std::string& config, int sm_count, cudaStream_t stream) {
  int block_m = ParseInt(ConfigValue(config, "bm"), 0);
  int warps = ParseInt(ConfigValue(config, "w"), 4);
  const bool known = (block_m == 128 && (warps == 4 || warps == 8)) || (block_m == 64 && warps == 4);
  if (!known) {
    block_m = DefaultPrefillBlockM(a, sm_count);
    warps = 4;
  }
  return LaunchAttentionPrefill(a, block_m, warps, stream);
}

CudaStatus RunComputeOp(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                        DispatchContext& ctx, bool* handled) {
  *handled = true;
  if (host.op == "linear") return RunLinear(host, in, out, ctx);
  if (host.op == "swiglu_mlp") return RunSwigluMlp(host, in, out, ctx);
  if (host.op == "attention") return RunAttention(host, in, out, ctx);
  if (host.op == "attention_decode") return RunAttentionDecode(host, in, out, ctx);
  *handled = false;
  return CudaStatus::Ok();
}

namespace {

// The skinny GEMM's shape rules (skinny_gemm.h), pointers aside.
bool SkinnyCandidate(DType dtype, int64_t M, int64_t N, int64_t K) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) && M >= 1 && M <= kSkinnyMaxM && N % 16 == 0 && K % 32 == 0;
}

}  // namespace

std::vector<std::string> ComputeCandidates(const std::string& op, DType dtype, const std::vector<int64_t>& key) {
  const int64_t vec = IsFloat(dtype) ? static_cast<int64_t>(16 / DTypeSize(dtype)) : 1;
  if (op == "linear" && key.size() == 3) {
    const int64_t M = key[0], N = key[1], K = key[2];
    std::vector<std::string> c;
    const int n = std::max(1, GemmAlgoCount(dtype, M, N, K));
    for (int i = 0; i < n; ++i) c.push_back("algo=" + std::to_string(i));
    if (M >= 1 && M <= kGemvMaxM && K % vec == 0) c.push_back("gemv");
    if (SkinnyCandidate(dtype, M, N, K)) c.push_back("skinny");
    return c;
  }
  if (op == "swiglu_mlp" && key.size() == 3) {
    std::vector<std::string> c = {"path=gemm"};
    if (key[0] >= 1 && key[0] <= kGemvMaxM && key[1] % vec == 0) c.push_back("path=gemv");
    if (SkinnyCandidate(dtype, key[0], key[2], key[1])) c.push_back("path=skinny");
    return c;
  }
  if (op == "attention") {
    if (dtype == DType::kF32) return {"bm=128,w=4"};  // the fp32 path has no block size
    return {"bm=128,w=4", "bm=64,w=4", "bm=128,w=8"};
  }
  if (op == "attention_decode" && key.size() == 5) {
    std::vector<std::string> c = {"splits=auto"};
    const int64_t L = key[1];
    for (int s = 1; s <= 128 && (s == 1 || L / s >= 128); s *= 2) c.push_back("splits=" + std::to_string(s));
    return c;
  }
  return {};
}

}  // namespace fusedserve
