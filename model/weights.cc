// Safetensors reader (mmap), checkpoint validation and random weights.
#include "model/weights.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "warmup/regular_file.h"

namespace fusedserve {
namespace {

using nlohmann::json;

// Element size of every safetensors dtype (0: unknown).
size_t SafetensorsDTypeSize(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

std::string ShapeStr(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// splitmix64: a tiny, well-mixed generator for reproducible random weights.
uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

int64_t WeightTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> WeightTensor::ToFloat() const {
  if (shape.size() == 2) return ToFloatBlock(0, shape[0], 0, shape[1]);
  return ToFloatBlock(0, 1, 0, numel());
}

std::vector<float> WeightTensor::ToFloatBlock(int64_t row, int64_t rows, int64_t col, int64_t cols) const {
  const int64_t width = shape.size() == 2 ? shape[1] : numel();
  std::vector<float> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = (row + r) * width + col;
    float* o = out.data() + r * cols;
    switch (dtype) {
      case DType::kF32:
        std::memcpy(o, data + 4 * first, cols * 4);
        break;
      case DType::kBF16:
        for (int64_t i = 0; i < cols; ++i) {
          uint16_t h;
          std::memcpy(&h, data + 2 * (first + i), 2);
          o[i] = Bf16ToFloat(h);
        }
        break;
      case DType::kF16:
        for (int64_t i = 0; i < cols; ++i) {
          uint16_t h;
          std::memcpy(&h, data + 2 * (first + i), 2);
          o[i] = HalfToFloat(h);
        }
        break;
      default:
        break;
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<RegularFile> opened = OpenRegularFile(path, kMaxSafetensorsFileBytes);
  if (!opened.ok()) return opened.status();
  const size_t size = static_cast<size_t>(opened->size());
  if (size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a safetensors file (", size, " bytes)"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, opened->fd(), 0);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(errno)));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->map_size_ = size;
  const uint8_t* base = static_cast<const uint8_t*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  if (header_len > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": safetensors header length ", header_len,
                                                   " exceeds the limit of ", kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (header_len > size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": safetensors header length ", header_len, " exceeds the file (", size, " bytes)"));
  }
  const uint8_t* data = base + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  json header = json::parse(base + 8, base + 8 + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": safetensors header is not a JSON object"));
  }
  struct Span {
    uint64_t begin, end;
    std::string name;
    bool operator<(const Span& o) const { return begin != o.begin ? begin < o.begin : end < o.end; }
  };
  std::vector<Span> spans;  // non-empty tensors' byte ranges, to find overlaps
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "': ", what));
    };
    const json& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return bad("header entry needs dtype, shape and data_offsets [begin, end]");
    }
    WeightTensor t;
    t.dtype_name = e["dtype"].get<std::string>();
    const size_t elem = SafetensorsDTypeSize(t.dtype_name);
    if (elem == 0) return bad(absl::StrCat("unknown dtype '", t.dtype_name, "'"));
    if (t.dtype_name == "F32" || t.dtype_name == "F16" || t.dtype_name == "BF16") {
      t.is_float = true;
      t.dtype = t.dtype_name == "F32" ? DType::kF32 : t.dtype_name == "F16" ? DType::kF16 : DType::kBF16;
    }
    uint64_t numel = 1;
    for (const json& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad("shape entries must be integers >= 0");
      const uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > (uint64_t{1} << 50) / v) return bad("shape too large");
      numel *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const json& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) return bad("data_offsets must be integers >= 0");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] outside the data section (", data_size,
                              " bytes): truncated file?"));
    }
    if (end - begin != numel * elem) {
      return bad(absl::StrCat("data_offsets span ", end - begin, " bytes but ", t.dtype_name, " ", ShapeStr(t.shape),
                              " needs ", numel * elem));
    }
    t.data = data + begin;
    t.bytes = end - begin;
    if (t.bytes != 0) spans.push_back({begin, end, name});
    file->tensors_.emplace(name, std::move(t));
  }
  // Two tensors sharing bytes would alias each other's weights: a forged or
  // broken file, never what a writer produces.
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    const Span& a = spans[i - 1];
    const Span& b = spans[i];
    if (b.begin < a.end) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensors '", a.name, "' [", a.begin, ", ", a.end,
                                                     ") and '", b.name, "' [", b.begin, ", ", b.end,
                                                     ") overlap in the data section"));
    }
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ExpectedTensors(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab, c.hidden}});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    out.push_back({p + "input_layernorm.weight", {c.hidden}});
    out.push_back({p + "self_attn.q_proj.weight", {c.q_dim(), c.hidden}});
    out.push_back({p + "self_attn.k_proj.weight", {c.kv_dim(), c.hidden}});
    out.push_back({p + "self_attn.v_proj.weight", {c.kv_dim(), c.hidden}});
    out.push_back({p + "self_attn.o_proj.weight", {c.hidden, c.q_dim()}});
    out.push_back({p + "post_attention_layernorm.weight", {c.hidden}});
    out.push_back({p + "mlp.gate_proj.weight", {c.intermediate, c.hidden}});
    out.push_back({p + "mlp.up_proj.weight", {c.intermediate, c.hidden}});
    out.push_back({p + "mlp.down_proj.weight", {c.hidden, c.intermediate}});
  }
  out.push_back({"model.norm.weight", {c.hidden}});
  if (!c.tied_embeddings) out.push_back({"lm_head.weight", {c.vocab, c.hidden}});
  return out;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::LoadCheckpoint(const std::string& dir) {
  absl::StatusOr<ModelConfig> config = ConfigFromHfFile(dir + "/config.json");
  if (absl::IsNotFound(config.status())) {
    return absl::NotFoundError(absl::StrCat("--model=", dir, ": no config.json (", config.status().message(), ")"));
  }
  if (!config.ok()) return config.status();
  config->name = dir;

  // Which files hold the weights: the index's weight_map, or the single file.
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;  // tensor -> shard (index only)
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (FileExists(index_path)) {
    absl::StatusOr<std::string> text = ReadRegularFile(index_path, kMaxSafetensorsIndexBytes);
    if (!text.ok()) return text.status();
    json index = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": expected a JSON object with a 'weight_map'"));
    }
    std::set<std::string> seen;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map['", it.key(), "'] is not a file name"));
      }
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": shard name '", shard, "' must be a plain file name"));
      }
      weight_map[it.key()] = shard;
      if (seen.insert(shard).second) shard_names.push_back(shard);
    }
  } else if (FileExists(dir + "/model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(
        absl::StrCat("--model=", dir, ": neither model.safetensors nor model.safetensors.index.json found"));
  }

  std::vector<std::unique_ptr<SafetensorsFile>> files;
  for (const std::string& shard : shard_names) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(dir + "/" + shard);
    if (!f.ok()) return f.status();
    // The index must agree with the shards: a tensor listed for this shard must be in it.
    for (const auto& [name, file] : weight_map) {
      if (file == shard && (*f)->tensors().count(name) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "': listed in ", index_path, " for ", shard, " but not in that file"));
      }
    }
    files.push_back(*std::move(f));
  }
  return FromFiles(*std::move(config), std::move(files));
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::FromFiles(
    ModelConfig config, std::vector<std::unique_ptr<SafetensorsFile>> files) {
  std::unique_ptr<ModelWeights> w(new ModelWeights());
  std::map<std::string, std::string> where;  // tensor -> file path
  for (const auto& f : files) {
    for (const auto& [name, t] : f->tensors()) {
      if (auto it = where.find(name); it != where.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "' appears in both ", it->second, " and ", f->path()));
      }
      where[name] = f->path();
      w->tensors_[name] = t;
    }
  }
  std::set<std::string> expected_names;
  for (const auto& [name, shape] : ExpectedTensors(config)) {
    expected_names.insert(name);
    auto it = w->tensors_.find(name);
    if (it == w->tensors_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", config.name, ": missing tensor '", name,
                                                     "' (expected shape ", ShapeStr(shape), ")"));
    }
    const WeightTensor& t = it->second;
    if (!t.is_float) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in ", where[name], " has dtype ",
                                                     t.dtype_name, "; expected BF16, F16 or F32"));
    }
    if (t.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in ", where[name], " has shape ",
                                                     ShapeStr(t.shape), "; the config needs ", ShapeStr(shape)));
    }
  }
  for (auto it = w->tensors_.begin(); it != w->tensors_.end();) {
    const std::string& name = it->first;
    if (expected_names.count(name) != 0) {
      ++it;
      continue;
    }
    // Tolerated leftovers: rotary inv_freq buffers of old exports, and an
    // lm_head copy saved next to tied embeddings (ignored: the tie wins).
    if (name.find("rotary_emb.inv_freq") != std::string::npos || (name == "lm_head.weight" && config.tied_embeddings)) {
      it = w->tensors_.erase(it);
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", config.name, ": unexpected tensor '", name, "' in ",
                                                   where[name], " (not part of a ", config.layers,
                                                   "-layer LLaMA with this config.json)"));
  }
  w->config_ = std::move(config);
  w->files_ = std::move(files);
  return w;
}

std::unique_ptr<ModelWeights> ModelWeights::Random(const ModelConfig& config, uint64_t seed) {
  std::unique_ptr<ModelWeights> w(new ModelWeights());
  w->config_ = config;
  const auto expected = ExpectedTensors(config);
  w->owned_.resize(expected.size());
  std::vector<WeightTensor> made(expected.size());
  // Each tensor has its own generator state (seed and name), so tensors fill
  // in parallel with the same values: an 8B preset is 8e9 draws, ~25 s on one
  // core.
  auto fill = [&](size_t k) {
    const auto& [name, shape] = expected[k];
    WeightTensor& t = made[k];
    t.is_float = true;
    t.dtype = config.dtype;
    t.dtype_name = config.dtype == DType::kF32 ? "F32" : config.dtype == DType::kF16 ? "F16" : "BF16";
    t.shape = shape;
    const int64_t n = t.numel();
    const size_t elem = DTypeSize(config.dtype);
    std::string& buf = w->owned_[k];
    buf.resize(n * elem);
    const bool is_norm = shape.size() == 1;
    const bool is_embedding = name == "model.embed_tokens.weight";
    const double std = is_norm ? 0.0 : is_embedding ? 1.0 : 1.0 / std::sqrt(static_cast<double>(shape[1]));
    const double half_width = std * std::sqrt(3.0);
    uint64_t state = seed ^ HashName(name);
    for (int64_t i = 0; i < n; ++i) {
      float v = 1.0f;
      if (!is_norm) {
        const double u = static_cast<double>(SplitMix(state) >> 11) * 0x1.0p-53;  // [0, 1)
        v = static_cast<float>((2.0 * u - 1.0) * half_width);
      }
      char* dst = buf.data() + i * elem;
      if (config.dtype == DType::kF32) {
        std::memcpy(dst, &v, 4);
      } else {
        const uint16_t h = config.dtype == DType::kBF16 ? FloatToBf16(v) : FloatToHalf(v);
        std::memcpy(dst, &h, 2);
      }
    }
    t.data = reinterpret_cast<const uint8_t*>(buf.data());
    t.bytes = buf.size();
  };
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t k = next++; k < expected.size(); k = next++) fill(k);
  };
  const size_t n_threads = std::min<size_t>(expected.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n_threads; ++i) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  for (size_t k = 0; k < expected.size(); ++k) w->tensors_[expected[k].first] = std::move(made[k]);
  return w;
}

}  // namespace fusedserve
