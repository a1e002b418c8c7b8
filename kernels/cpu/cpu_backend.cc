// CPU backend: converts inputs to fp32, runs the reference implementation,
// rounds outputs to the request dtype. Runs on the caller's thread.
#include <cmath>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/reference.h"

namespace fusedserve {
namespace {

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::string device_name() const override { return "CPU reference (fp32 accumulation)"; }

  absl::StatusOr<TensorMap> Run(const OpRequest& r) override {
    const DType dt = RequestDType(r);
    std::map<std::string, std::vector<float>> out;
    auto shapes = OutputShapes(r);
    for (const auto& [name, shape] : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      out[name].assign(n, 0.0f);
    }
    auto F = [&](const std::string& name) { return r.in(name).ToFloat(); };
    const std::string& op = r.op;
    if (op == "rms_norm" || op == "add_rms_norm" || op == "add_rms_norm_silu" || op == "layer_norm") {
      const HostTensor& x = r.in("x");
      const int64_t H = x.dim(-1), M = x.numel() / std::max<int64_t>(H, 1);
      const float eps = static_cast<float>(r.f("eps"));
      const auto xv = F("x"), w = F("weight");
      if (op == "rms_norm") {
        cpu::RmsNorm(xv.data(), w.data(), M, H, eps, out["y"].data());
      } else if (op == "add_rms_norm") {
        cpu::AddRmsNorm(xv.data(), F("residual").data(), w.data(), M, H, eps, out["y"].data(),
                        out["residual_out"].data());
      } else if (op == "add_rms_norm_silu") {
        cpu::AddRmsNormSilu(xv.data(), F("residual").data(), w.data(), M, H, eps, out["y"].data());
      } else {
        cpu::LayerNorm(xv.data(), w.data(), F("bias").data(), M, H, eps, out["y"].data());
      }
    } else if (op == "softmax") {
      const HostTensor& x = r.in("x");
      const int64_t N = x.dim(-1), M = x.numel() / std::max<int64_t>(N, 1);
      cpu::Softmax(F("x").data(), M, N, out["y"].data());
    } else if (op == "silu_and_mul") {
      const HostTensor& x = r.in("x");
      const int64_t I = x.dim(-1) / 2, M = x.numel() / std::max<int64_t>(x.dim(-1), 1);
      cpu::SiluAndMul(F("x").data(), M, I, out["y"].data());
    } else if (op == "gelu") {
      cpu::Gelu(F("x").data(), r.in("x").numel(), r.s("approximate") == "tanh", out["y"].data());
    } else if (op == "rope") {
      const HostTensor& q = r.in("q");
      const HostTensor& k = r.in("k");
      cpu::Rope(F("q").data(), F("k").data(), r.in("positions").ToInt64().data(), q.dim(0), q.dim(1), k.dim(1),
                q.dim(2), r.f("theta"), out["q_out"].data(), out["k_out"].data());
    } else if (op == "linear") {
      const HostTensor& x = r.in("x");
      const HostTensor& w = r.in("weight");
      std::vector<float> bias;
      if (r.has("bias")) bias = F("bias");
      cpu::Linear(F("x").data(), F("weight").data(), bias.empty() ? nullptr : bias.data(), x.dim(0), x.dim(1),
                  w.dim(0), ParseActivation(r.s("activation")), out["y"].data());
    } else if (op == "swiglu_mlp") {
      const HostTensor& x = r.in("x");
      cpu::SwigluMlp(F("x").data(), F("gate_up").data(), F("down").data(), x.dim(0), x.dim(1),
                     r.in("down").dim(1), out["y"].data());
    } else if (op == "attention") {
      const HostTensor& q = r.in("q");
      const HostTensor& k = r.in("k");
      const HostTensor& sl = r.in("seq_lens");
      cpu::Attention(F("q").data(), F("k").data(), F("v").data(), sl.ToInt64().data(), sl.dim(0), q.dim(0),
                     q.dim(1), k.dim(1), q.dim(2), r.b("causal"), static_cast<float>(AttentionScale(r)),
                     out["o"].data());
    } else if (op == "attention_decode") {
      const HostTensor& q = r.in("q");
      const HostTensor& kc = r.in("k_cache");
      cpu::AttentionDecode(F("q").data(), F("k_cache").data(), F("v_cache").data(),
                           r.in("lengths").ToInt64().data(), q.dim(0), kc.dim(1), q.dim(1), kc.dim(2), q.dim(2),
                           static_cast<float>(AttentionScale(r)), out["o"].data());
    } else {
      return absl::UnimplementedError("op '" + op + "' has no CPU implementation");
    }
    TensorMap result;
    for (auto& [name, shape] : shapes) result[name] = HostTensor::FromFloat(dt, shape, out[name]);
    return result;
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace fusedserve
