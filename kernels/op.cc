// The op table, output shapes, tuning keys and random requests: the parts of
// the op vocabulary every layer shares.
#include "kernels/op.h"

#include <cmath>
#include <random>

#include "kernels/backend.h"

namespace fusedserve {

const std::vector<OpSpec>& AllOpSpecs() {
  static const std::vector<OpSpec>* specs = new std::vector<OpSpec>{
      {"rms_norm", {"x", "weight"}, {}, {}, {{"eps", 1e-5, {}}}, {"y"}},
      {"add_rms_norm", {"x", "residual", "weight"}, {}, {}, {{"eps", 1e-5, {}}}, {"y", "residual_out"}},
      {"add_rms_norm_silu", {"x", "residual", "weight"}, {}, {}, {{"eps", 1e-5, {}}}, {"y"}},
      {"layer_norm", {"x", "weight", "bias"}, {}, {}, {{"eps", 1e-5, {}}}, {"y"}},
      {"softmax", {"x"}, {}, {}, {}, {"y"}},
      {"silu_and_mul", {"x"}, {}, {}, {}, {"y"}},
      {"gelu", {"x"}, {}, {}, {{"approximate", std::string("none"), {"none", "tanh"}}}, {"y"}},
      {"rope", {"q", "k", "positions"}, {}, {"positions"}, {{"theta", 500000.0, {}}}, {"q_out", "k_out"}},
      {"linear",
       {"x", "weight"},
       {"bias"},
       {},
       {{"activation", std::string("none"), {"none", "gelu", "gelu_tanh", "silu"}}},
       {"y"}},
      {"swiglu_mlp", {"x", "gate_up", "down"}, {}, {}, {}, {"y"}},
      // scale 0 means 1/sqrt(D), resolved by validation.
      {"attention", {"q", "k", "v", "seq_lens"}, {}, {"seq_lens"}, {{"causal", true, {}}, {"scale", 0.0, {}}}, {"o"}},
      {"attention_decode", {"q", "k_cache", "v_cache", "lengths"}, {}, {"lengths"}, {{"scale", 0.0, {}}}, {"o"}},
  };
  return *specs;
}

const OpSpec* FindOpSpec(const std::string& op) {
  for (const OpSpec& s : AllOpSpecs()) {
    if (s.name == op) return &s;
  }
  return nullptr;
}

Activation ParseActivation(const std::string& s) {
  if (s == "gelu") return Activation::kGeluErf;
  if (s == "gelu_tanh") return Activation::kGeluTanh;
  if (s == "silu") return Activation::kSilu;
  return Activation::kNone;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> OutputShapes(const OpRequest& r) {
  const std::string& op = r.op;
  if (op == "add_rms_norm") return {{"y", r.in("x").shape}, {"residual_out", r.in("x").shape}};
  if (op == "silu_and_mul") {
    std::vector<int64_t> s = r.in("x").shape;
    s.back() /= 2;
    return {{"y", s}};
  }
  if (op == "rope") return {{"q_out", r.in("q").shape}, {"k_out", r.in("k").shape}};
  if (op == "linear") return {{"y", {r.in("x").dim(0), r.in("weight").dim(0)}}};
  if (op == "attention" || op == "attention_decode") return {{"o", r.in("q").shape}};
  return {{"y", r.in("x").shape}};  // norms, softmax, gelu, swiglu_mlp
}

OpCost EstimateCost(const OpRequest& r) {
  auto numel = [](const std::vector<int64_t>& shape) {
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    return n;
  };
  OpCost c;
  const double elem = static_cast<double>(DTypeSize(RequestDType(r)));
  double in_elems = 0, out_elems = 0;
  for (const auto& [name, t] : r.inputs) in_elems += numel(t.shape);
  for (const auto& [name, shape] : OutputShapes(r)) out_elems += numel(shape);
  c.output_bytes = out_elems * elem;
  // fp32 copies of every input and output, and the outputs in the request dtype.
  c.scratch_bytes = 4 * (in_elems + out_elems) + c.output_bytes;
  const std::string& op = r.op;
  if (op == "linear") {
    const double M = r.in("x").dim(0), K = r.in("x").dim(1), N = r.in("weight").dim(0);
    c.flops = 2 * M * N * K + 2 * M * N;
  } else if (op == "swiglu_mlp") {
    const double M = r.in("x").dim(0), D = r.in("x").dim(1), I = r.in("down").dim(1);
    c.flops = 6 * M * D * I + 4 * M * I;
    c.scratch_bytes += 4 * 3 * M * I;  // gate|up [M, 2I] and the activation [M, I], fp32
  } else if (op == "attention" || op == "attention_decode") {
    // Scores and the weighted sum of V: 4 * D flops per (query head, key) pair.
    const HostTensor& q = r.in("q");
    const double per_pair = 4.0 * static_cast<double>(q.dim(1)) * static_cast<double>(q.dim(2));
    double pairs = 0;
    if (op == "attention_decode") {
      for (int64_t len : r.in("lengths").ToInt64()) pairs += static_cast<double>(len);
    } else {
      const bool causal = r.b("causal");
      for (int64_t len : r.in("seq_lens").ToInt64()) {
        const double n = static_cast<double>(len);
        pairs += causal ? n * (n + 1) / 2 : n * n;
      }
    }
    c.flops = per_pair * pairs;
  } else {
    // Norms, softmax, activations, rope: a handful of flops per element.
    c.flops = 8 * (in_elems + out_elems);
  }
  return c;
}

DType RequestDType(const OpRequest& r) {
  for (const auto& [name, t] : r.inputs) {
    if (IsFloat(t.dtype)) return t.dtype;
  }
  return DType::kF32;
}

std::vector<int64_t> TuningKey(const OpRequest& r) {
  const std::string& op = r.op;
  if (op == "rope") {
    const HostTensor& q = r.in("q");
    return {q.dim(0), q.dim(1), r.in("k").dim(1), q.dim(2)};
  }
  if (op == "linear") return {r.in("x").dim(0), r.in("weight").dim(0), r.in("x").dim(1)};
  if (op == "swiglu_mlp") return {r.in("x").dim(0), r.in("x").dim(1), r.in("down").dim(1)};
  if (op == "attention") {
    const HostTensor& q = r.in("q");
    return {q.dim(0), q.dim(1), r.in("k").dim(1), q.dim(2)};
  }
  if (op == "attention_decode") {
    const HostTensor& q = r.in("q");
    const HostTensor& kc = r.in("k_cache");
    return {q.dim(0), kc.dim(1), q.dim(1), kc.dim(2), q.dim(2)};
  }
  const HostTensor& x = r.in("x");
  const int64_t last = x.rank() == 0 ? 1 : x.dim(-1);
  const int64_t rows = last == 0 ? 0 : x.numel() / last;
  return {rows, op == "silu_and_mul" ? last / 2 : last};
}

namespace {

HostTensor RandomTensor(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng, float lo, float hi) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return HostTensor::FromFloat(dtype, std::move(shape), v);
}

}  // namespace

double AttentionScale(const OpRequest& r) {
  const double s = r.f("scale");
  return s != 0.0 ? s : 1.0 / std::sqrt(static_cast<double>(r.in("q").dim(-1)));
}

OpRequest MakeRandomRequest(const std::string& op, DType dtype, const std::vector<int64_t>& key, uint64_t seed) {
  std::mt19937_64 rng(seed);
  OpRequest r;
  r.op = op;
  const OpSpec* spec = FindOpSpec(op);
  for (const AttrSpec& a : spec->attrs) r.attrs[a.name] = a.default_value;
  auto rnd = [&](std::vector<int64_t> shape) { return RandomTensor(dtype, std::move(shape), rng, -1.0f, 1.0f); };
  auto ints = [](std::vector<int64_t> values) {
    const int64_t n = static_cast<int64_t>(values.size());
    return HostTensor::FromInt64(DType::kI64, {n}, values);
  };
  if (op == "rms_norm" || op == "add_rms_norm" || op == "add_rms_norm_silu" || op == "layer_norm") {
    const int64_t M = key[0], H = key[1];
    r.inputs["x"] = rnd({M, H});
    r.inputs["weight"] = RandomTensor(dtype, {H}, rng, 0.5f, 1.5f);
    if (op != "rms_norm" && op != "layer_norm") r.inputs["residual"] = rnd({M, H});
    if (op == "layer_norm") r.inputs["bias"] = rnd({H});
  } else if (op == "softmax" || op == "gelu") {
    r.inputs["x"] = rnd({key[0], key[1]});
  } else if (op == "silu_and_mul") {
    r.inputs["x"] = rnd({key[0], 2 * key[1]});
  } else if (op == "rope") {
    const int64_t T = key[0], Hq = key[1], Hkv = key[2], D = key[3];
    r.inputs["q"] = rnd({T, Hq, D});
    r.inputs["k"] = rnd({T, Hkv, D});
    std::vector<int64_t> pos(T);
    for (int64_t t = 0; t < T; ++t) pos[t] = t;
    r.inputs["positions"] = ints(pos);
  } else if (op == "linear") {
    const int64_t M = key[0], N = key[1], K = key[2];
    const float s = 1.0f / std::sqrt(static_cast<float>(K));
    r.inputs["x"] = rnd({M, K});
    r.inputs["weight"] = RandomTensor(dtype, {N, K}, rng, -s, s);
  } else if (op == "swiglu_mlp") {
    const int64_t M = key[0], D = key[1], I = key[2];
    const float sd = 1.0f / std::sqrt(static_cast<float>(D)), si = 1.0f / std::sqrt(static_cast<float>(I));
    r.inputs["x"] = rnd({M, D});
    r.inputs["gate_up"] = RandomTensor(dtype, {2 * I, D}, rng, -sd, sd);
    r.inputs["down"] = RandomTensor(dtype, {D, I}, rng, -si, si);
  } else if (op == "attention") {
    const int64_t T = key[0], Hq = key[1], Hkv = key[2], D = key[3];
    r.inputs["q"] = rnd({T, Hq, D});
    r.inputs["k"] = rnd({T, Hkv, D});
    r.inputs["v"] = rnd({T, Hkv, D});
    r.inputs["seq_lens"] = ints({T});
    r.attrs["scale"] = 1.0 / std::sqrt(static_cast<double>(D));
  } else if (op == "attention_decode") {
    const int64_t B = key[0], L = key[1], Hq = key[2], Hkv = key[3], D = key[4];
    r.inputs["q"] = rnd({B, Hq, D});
    r.inputs["k_cache"] = rnd({B, L, Hkv, D});
    r.inputs["v_cache"] = rnd({B, L, Hkv, D});
    r.inputs["lengths"] = ints(std::vector<int64_t>(B, L));
    r.attrs["scale"] = 1.0 / std::sqrt(static_cast<double>(D));
  }
  return r;
}

}  // namespace fusedserve
