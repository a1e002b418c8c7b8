// Default shape envelope and the envelope file parser (format in envelope.h).
#include "warmup/envelope.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/op.h"
#include "nlohmann/json.hpp"
#include "warmup/regular_file.h"
#include "warmup/tuning_cache.h"

namespace fusedserve {

absl::Status ValidateTuningKey(const std::string& op, const std::vector<int64_t>& key) {
  const OpSpec* spec = FindOpSpec(op);
  if (spec == nullptr) return absl::InvalidArgumentError("unknown op '" + op + "'");
  const std::vector<std::string>& names = spec->key_dims;
  if (key.size() != names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " key must have ", names.size(), " dims (", FormatTuningKey(op, {}), "), got ", key.size()));
  }
  for (size_t i = 0; i < key.size(); ++i) {
    if (key[i] <= 0 || key[i] > (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(absl::StrCat(op, " key dim ", names[i], " = ", key[i], " is out of range"));
    }
  }
  return spec->check_key ? spec->check_key(key) : absl::OkStatus();
}

std::string FormatTuningKey(const std::string& op, const std::vector<int64_t>& key) {
  const OpSpec* spec = FindOpSpec(op);
  if (spec == nullptr) return "";
  std::string out;
  for (size_t i = 0; i < spec->key_dims.size(); ++i) {
    if (i > 0) out += " ";
    out += spec->key_dims[i];
    if (i < key.size()) absl::StrAppend(&out, "=", key[i]);
  }
  return out;
}

std::vector<int64_t> SmallTuningKey(const std::string& op, const std::vector<int64_t>& key) {
  const OpSpec* spec = FindOpSpec(op);
  return spec != nullptr ? spec->small_key(key) : key;
}

namespace {

// The entries of one model shape, for every token bucket.
void AddShapeEntries(const EnvelopeShape& shape, DType dtype, const std::vector<int64_t>& buckets,
                     std::vector<EnvelopeEntry>* env) {
  const int64_t H = shape.hidden_size, I = shape.intermediate_size, Hq = shape.num_q_heads, Hkv = shape.num_kv_heads,
                D = shape.head_dim, V = shape.vocab_size;
  auto add = [&](const std::string& op, std::vector<int64_t> rest) {
    for (int64_t m : buckets) {
      std::vector<int64_t> key{m};
      key.insert(key.end(), rest.begin(), rest.end());
      env->push_back({op, dtype, key});
    }
  };
  for (const char* op : {"rms_norm", "add_rms_norm", "add_rms_norm_silu", "layer_norm"}) add(op, {H});
  add("silu_and_mul", {I});
  add("gelu", {I});
  add("softmax", {V});
  add("rope", {Hq, Hkv, D});
  add("linear", {(Hq + 2 * Hkv) * D, H});
  add("linear", {H, Hq * D});
  add("swiglu_mlp", {H, I});
  // The flash-attention kernels take head dims 64 and 128 only
  // (kernels/cuda/attention.h); other models' attention runs elsewhere.
  const bool attention_kernels = D == 64 || D == 128;
  if (!attention_kernels) return;
  add("attention", {Hq, Hkv, D});
  // Decode batches: the KV cache of B sequences of L tokens (K and V) within 2 GiB.
  constexpr int64_t kMaxKvBytes = int64_t{2} << 30;
  for (int64_t L : {1024, 4096}) {
    for (int64_t B : buckets) {
      const int64_t kv_bytes = 2 * B * L * Hkv * D * static_cast<int64_t>(DTypeSize(dtype));
      if (B > 256 || kv_bytes > kMaxKvBytes) break;
      env->push_back({"attention_decode", dtype, {B, L, Hq, Hkv, D}});
    }
  }
}

}  // namespace

std::vector<EnvelopeEntry> DefaultEnvelope(const WarmupOptions& o) {
  std::vector<int64_t> buckets;
  const int64_t max_bucket = RoundUpPow2(std::max<int64_t>(1, o.max_tokens));
  for (int64_t m = 1; m <= max_bucket; m *= 2) buckets.push_back(m);

  std::vector<EnvelopeShape> shapes;
  if (o.model_entries.empty() || o.model_shapes.empty()) {
    shapes.push_back({o.hidden_size, o.intermediate_size, o.num_q_heads, o.num_kv_heads, o.head_dim, o.vocab_size});
  }
  shapes.insert(shapes.end(), o.model_shapes.begin(), o.model_shapes.end());
  std::vector<EnvelopeEntry> env;
  std::set<std::string> seen;
  auto add = [&](EnvelopeEntry e) {
    e.key = BucketKey(e.op, e.key);
    if (seen.insert(EntryId(e.op, e.dtype, e.key)).second) env.push_back(std::move(e));
  };
  for (const EnvelopeEntry& e : o.model_entries) add(e);
  for (const EnvelopeShape& shape : shapes) {
    std::vector<EnvelopeEntry> entries;
    AddShapeEntries(shape, o.dtype, buckets, &entries);
    for (EnvelopeEntry& e : entries) add(std::move(e));
  }
  return env;
}

absl::StatusOr<std::vector<EnvelopeEntry>> ParseEnvelope(const std::string& text) {
  using json = nlohmann::json;
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("envelope is not valid JSON");
  if (!doc.is_array()) return absl::InvalidArgumentError("envelope must be a JSON list of {op, dtype, key}");
  std::vector<EnvelopeEntry> env;
  std::set<std::string> seen;
  for (size_t i = 0; i < doc.size(); ++i) {
    const json& j = doc[i];
    const std::string where = absl::StrCat("envelope[", i, "]");
    if (!j.is_object()) return absl::InvalidArgumentError(where + " is not an object");
    auto op = j.find("op"), dtype = j.find("dtype"), key = j.find("key");
    if (op == j.end() || !op->is_string()) return absl::InvalidArgumentError(where + ".op must be a string");
    EnvelopeEntry e;
    e.op = op->get<std::string>();
    if (dtype == j.end() || !dtype->is_string() || !ParseDTypeFileName(dtype->get<std::string>(), &e.dtype)) {
      return absl::InvalidArgumentError(where + ".dtype must be \"bf16\", \"f16\" or \"f32\"");
    }
    if (key == j.end() || !key->is_array()) return absl::InvalidArgumentError(where + ".key must be a list");
    for (const json& d : *key) {
      if (!d.is_number_integer()) return absl::InvalidArgumentError(where + ".key must hold integers");
      e.key.push_back(d.get<int64_t>());
    }
    if (absl::Status s = ValidateTuningKey(e.op, e.key); !s.ok()) {
      return absl::InvalidArgumentError(where + ": " + std::string(s.message()));
    }
    e.key = BucketKey(e.op, e.key);
    if (seen.insert(EntryId(e.op, e.dtype, e.key)).second) env.push_back(std::move(e));
  }
  return env;
}

absl::StatusOr<std::vector<EnvelopeEntry>> LoadEnvelopeFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, kMaxEnvelopeFileBytes);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<EnvelopeEntry>> env = ParseEnvelope(*text);
  if (!env.ok()) return absl::InvalidArgumentError(path + ": " + std::string(env.status().message()));
  return env;
}

}  // namespace fusedserve
