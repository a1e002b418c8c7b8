// attention: packed variable-length sequences, causal or not, GQA.
//   q, o [T, Hq, D]; k, v [T, Hkv, D]; seq_lens [B] (sums to T)
// attention_decode: one query per sequence over its KV cache.
//   q, o [B, Hq, D]; k_cache, v_cache [B, L, Hkv, D]; lengths [B] (1..L)
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/reference.h"
#include "kernels/ops/ops.h"

namespace fusedserve::ops {
namespace {

absl::Status CheckShapes(const OpRequest& r, bool decode) {
  if (auto s = CheckShape(r, "q", {-1, -1, -1}); !s.ok()) return s;
  const HostTensor& q = r.in("q");
  const int64_t rows = q.dim(0), Hq = q.dim(1), D = q.dim(2);
  const std::string kn = decode ? "k_cache" : "k", vn = decode ? "v_cache" : "v";
  if (decode) {
    if (auto s = CheckShape(r, kn, {rows, -1, -1, D}); !s.ok()) return s;
  } else {
    if (auto s = CheckShape(r, kn, {rows, -1, D}); !s.ok()) return s;
  }
  if (r.in(vn).shape != r.in(kn).shape) {
    return Invalid(absl::StrCat(r.op, ": input '", vn, "' has shape ", ShapeStr(r.in(vn).shape),
                                ", expected the shape of '", kn, "' ", ShapeStr(r.in(kn).shape)));
  }
  const int64_t Hkv = r.in(kn).dim(-2);
  if (Hq % Hkv != 0) {
    return Invalid(absl::StrCat(r.op, ": q heads (", Hq, ") must be a multiple of kv heads (", Hkv, ")"));
  }
  if (decode) {
    if (auto s = CheckShape(r, "lengths", {rows}); !s.ok()) return s;
    return CheckIndexValues(r, "lengths", 1, r.in(kn).dim(1));
  }
  if (auto s = CheckShape(r, "seq_lens", {-1}); !s.ok()) return s;
  if (auto s = CheckIndexValues(r, "seq_lens", 1, rows); !s.ok()) return s;
  int64_t total = 0;
  for (int64_t v : r.in("seq_lens").ToInt64()) total += v;
  if (total != rows) {
    return Invalid(absl::StrCat(r.op, ": input 'seq_lens' sums to ", total, ", expected T = ", rows, " (rows of 'q')"));
  }
  return absl::OkStatus();
}

absl::Status CheckScale(const OpRequest& r) {
  const double scale = r.f("scale");
  if (!(scale >= 0) || !std::isfinite(scale)) {
    return Invalid(absl::StrCat(r.op, ": attribute 'scale' is ", scale, ", expected a finite value > 0"));
  }
  return absl::OkStatus();
}

void ResolveScale(OpRequest& r) { r.attrs["scale"] = AttentionScale(r); }

// Scores and the weighted sum of V: 4 * D flops per (query head, key) pair.
void AttentionCost(const OpRequest& r, OpCost* c) {
  const HostTensor& q = r.in("q");
  const double per_pair = 4.0 * static_cast<double>(q.dim(1)) * static_cast<double>(q.dim(2));
  double pairs = 0;
  if (r.has("lengths")) {
    for (int64_t len : r.in("lengths").ToInt64()) pairs += static_cast<double>(len);
  } else {
    const bool causal = r.b("causal");
    for (int64_t len : r.in("seq_lens").ToInt64()) {
      const double n = static_cast<double>(len);
      pairs += causal ? n * (n + 1) / 2 : n * n;
    }
  }
  c->flops = per_pair * pairs;
}

// One sequence of T tokens.
std::vector<InputDesc> PrefillInputs(const std::vector<int64_t>& k) {
  const int64_t T = k[0], Hq = k[1], Hkv = k[2], D = k[3];
  InputDesc seq_lens{"seq_lens", {1}};
  seq_lens.values = {T};
  return {{"q", {T, Hq, D}, true}, {"k", {T, Hkv, D}, true}, {"v", {T, Hkv, D}, true}, seq_lens};
}

// B sequences of L cached tokens each.
std::vector<InputDesc> DecodeInputs(const std::vector<int64_t>& k) {
  const int64_t B = k[0], L = k[1], Hq = k[2], Hkv = k[3], D = k[4];
  InputDesc lengths{"lengths", {B}, true};
  lengths.values.assign(B, L);
  return {{"q", {B, Hq, D}, true}, {"k_cache", {B, L, Hkv, D}, true}, {"v_cache", {B, L, Hkv, D}, true}, lengths};
}

absl::Status RunPrefill(const cpu::OpCall& c) {
  const OpRequest& r = c.r;
  const HostTensor& q = r.in("q");
  const HostTensor& k = r.in("k");
  const HostTensor& sl = r.in("seq_lens");
  const auto qv = c.In("q"), kv = c.In("k"), vv = c.In("v");
  const std::vector<int64_t> seq_lens = sl.ToInt64();
  const float scale = static_cast<float>(AttentionScale(r));
  float* o = c.Out("o");
  return c.ForEachChunk(q.dim(0), [&](int64_t b, int64_t e) {
    cpu::AttentionRows(qv.data(), kv.data(), vv.data(), seq_lens.data(), sl.dim(0), q.dim(0), q.dim(1), k.dim(1),
                       q.dim(2), r.b("causal"), scale, b, e, o);
  });
}

absl::Status RunDecode(const cpu::OpCall& c) {
  const OpRequest& r = c.r;
  const HostTensor& q = r.in("q");
  const HostTensor& kc = r.in("k_cache");
  const int64_t L = kc.dim(1), Hq = q.dim(1), Hkv = kc.dim(2), D = q.dim(2);
  const auto qv = c.In("q"), kcv = c.In("k_cache"), vcv = c.In("v_cache");
  const std::vector<int64_t> lengths = r.in("lengths").ToInt64();
  const float scale = static_cast<float>(AttentionScale(r));
  float* o = c.Out("o");
  return c.ForEachChunk(q.dim(0), [&](int64_t b, int64_t e) {
    cpu::AttentionDecode(qv.data() + b * Hq * D, kcv.data() + b * L * Hkv * D, vcv.data() + b * L * Hkv * D,
                         lengths.data() + b, e - b, L, Hq, Hkv, D, scale, o + b * Hq * D);
  });
}

OpSpec AttentionOp(std::string name) {
  OpSpec s;
  s.name = std::move(name);
  s.outputs = {"o"};
  s.check_attrs = CheckScale;
  s.resolve_attrs = ResolveScale;
  s.output_shapes = [](const OpRequest& r) { return OutputShapeList{{"o", r.in("q").shape}}; };
  s.add_cost = AttentionCost;
  return s;
}

}  // namespace

std::vector<OpSpec> AttentionOps() {
  // scale 0 means 1/sqrt(D), resolved by validation.
  OpSpec prefill = AttentionOp("attention");
  prefill.inputs = {"q", "k", "v", "seq_lens"};
  prefill.index_inputs = {"seq_lens"};
  prefill.attrs = {{"causal", true, {}}, {"scale", 0.0, {}}};
  prefill.key_dims = {"T", "Hq", "Hkv", "D"};
  // Sequences are independent given seq_lens, so packing more of them is exact.
  prefill.layout = RowLayout{false, {"q", "k", "v", "seq_lens"}, "q"};
  prefill.check_shapes = [](const OpRequest& r) { return CheckShapes(r, false); };
  prefill.tuning_key = [](const OpRequest& r) {
    const HostTensor& q = r.in("q");
    return std::vector<int64_t>{q.dim(0), q.dim(1), r.in("k").dim(1), q.dim(2)};
  };
  prefill.check_key = [](const std::vector<int64_t>& k) { return CheckGqaKey("attention", k[1], k[2]); };
  prefill.small_key = [](const std::vector<int64_t>& k) {
    std::vector<int64_t> small = {4};
    for (int64_t d : SmallHeads(k[1], k[2], k[3])) small.push_back(d);
    return small;
  };
  prefill.inputs_for_key = PrefillInputs;
  prefill.run_cpu = RunPrefill;

  OpSpec decode = AttentionOp("attention_decode");
  decode.inputs = {"q", "k_cache", "v_cache", "lengths"};
  decode.index_inputs = {"lengths"};
  decode.attrs = {{"scale", 0.0, {}}};
  decode.key_dims = {"B", "L", "Hq", "Hkv", "D"};
  decode.bucket_dims = {0, 1};
  decode.layout = RowLayout{false, {"q", "k_cache", "v_cache", "lengths"}, "q"};
  decode.check_shapes = [](const OpRequest& r) { return CheckShapes(r, true); };
  decode.tuning_key = [](const OpRequest& r) {
    const HostTensor& q = r.in("q");
    const HostTensor& kc = r.in("k_cache");
    return std::vector<int64_t>{q.dim(0), kc.dim(1), q.dim(1), kc.dim(2), q.dim(2)};
  };
  decode.check_key = [](const std::vector<int64_t>& k) { return CheckGqaKey("attention_decode", k[2], k[3]); };
  decode.small_key = [](const std::vector<int64_t>& k) {
    std::vector<int64_t> small = {1, std::min<int64_t>(k[1], 64)};
    for (int64_t d : SmallHeads(k[2], k[3], k[4])) small.push_back(d);
    return small;
  };
  decode.inputs_for_key = DecodeInputs;
  decode.run_cpu = RunDecode;
  return {prefill, decode};
}

}  // namespace fusedserve::ops
