// Model config parsing and the safetensors checkpoint loader: files written
// here byte by byte (header length, JSON header, data), single-file and
// sharded checkpoints, and every start-up error naming its tensor.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/model_config.h"
#include "server/model_weights.h"

namespace fusedserve {
namespace {

using nlohmann::json;

struct RawTensor {
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  std::string bytes;
};

RawTensor F32Tensor(std::vector<int64_t> shape, float start) {
  RawTensor t;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.bytes.resize(n * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = start + 0.001f * static_cast<float>(i);
    std::memcpy(&t.bytes[i * 4], &v, 4);
  }
  return t;
}

RawTensor Bf16Tensor(std::vector<int64_t> shape, float value) {
  RawTensor t;
  t.dtype = "BF16";
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.bytes.resize(n * 2);
  const uint16_t h = FloatToBf16(value);
  for (int64_t i = 0; i < n; ++i) std::memcpy(&t.bytes[i * 2], &h, 2);
  return t;
}

// Writes a safetensors file: u64 LE header length, JSON header, data.
void WriteSafetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors,
                      std::string header_override = "") {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string h = header_override.empty() ? header.dump() : header_override;
  while (h.size() % 8 != 0) h += ' ';
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << h << data;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/fs_model_test_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf " + path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

json TinyConfigJson() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 8},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"intermediate_size", 12},
          {"vocab_size", 16},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", false},
          {"torch_dtype", "float32"},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 128}};
}

std::map<std::string, RawTensor> TensorsFor(const ModelConfig& c) {
  std::map<std::string, RawTensor> out;
  float start = 0.0f;
  for (const auto& [name, shape] : ExpectedTensors(c)) {
    out[name] = F32Tensor(shape, start);
    start += 1.0f;
  }
  return out;
}

void WriteConfig(const std::string& dir, const json& j) { std::ofstream(dir + "/config.json") << j.dump(2); }

TEST(ModelConfigTest, PresetsValidate) {
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ModelConfig> c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
  }
  absl::StatusOr<ModelConfig> tiny = PresetConfig("tiny");
  EXPECT_EQ(tiny->hidden, 64);
  EXPECT_EQ(tiny->layers, 2);
  EXPECT_EQ(tiny->q_heads, 4);
  EXPECT_EQ(tiny->kv_heads, 2);
  EXPECT_EQ(tiny->vocab, 512);
  absl::StatusOr<ModelConfig> one_b = PresetConfig("llama-3.2-1b");
  // Llama-3.2-1B has 1.236 B parameters (embeddings tied).
  EXPECT_NEAR(one_b->NumParameters() / 1e9, 1.236, 0.01);
  EXPECT_FALSE(PresetConfig("gpt2").ok());
  EXPECT_NE(std::string(PresetConfig("gpt2").status().message()).find("tiny"), std::string::npos);
}

TEST(ModelConfigTest, ParsesHfConfig) {
  json j = TinyConfigJson();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 64}};
  j["tie_word_embeddings"] = true;
  j["torch_dtype"] = "bfloat16";
  absl::StatusOr<ModelConfig> c = ConfigFromHfJson(j.dump(), "cfg");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_EQ(c->kv_heads, 1);
  EXPECT_TRUE(c->tied_embeddings);
  EXPECT_EQ(c->dtype, DType::kBF16);
  EXPECT_TRUE(c->rope_scaling.enabled);
  EXPECT_EQ(c->rope_scaling.original_max_position, 64);
  // Llama-3.1 scaling: the highest frequency is kept, the lowest divided by factor.
  const std::vector<double> inv = c->RopeInvFreq();
  ASSERT_EQ(inv.size(), 2u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[1], std::pow(10000.0, -0.5) / 8.0, 1e-12);  // wavelength 628 > 64
}

TEST(ModelConfigTest, RejectsUnsupported) {
  json j = TinyConfigJson();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(std::string(ConfigFromHfJson(j.dump(), "cfg").status().message()).find("num_key_value_heads"),
            std::string::npos);
  j = TinyConfigJson();
  j["hidden_act"] = "gelu";
  EXPECT_FALSE(ConfigFromHfJson(j.dump(), "cfg").ok());
  j = TinyConfigJson();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(std::string(ConfigFromHfJson(j.dump(), "cfg").status().message()).find("yarn"), std::string::npos);
  j = TinyConfigJson();
  j.erase("vocab_size");
  EXPECT_NE(std::string(ConfigFromHfJson(j.dump(), "cfg").status().message()).find("vocab_size"),
            std::string::npos);
  EXPECT_FALSE(ConfigFromHfJson("{not json", "cfg").ok());
}

TEST(SafetensorsTest, ReadsHeaderAndData) {
  TempDir dir;
  const std::string path = dir.path() + "/a.safetensors";
  WriteSafetensors(path, {{"x", F32Tensor({2, 3}, 1.0f)}, {"y", Bf16Tensor({4}, 0.5f)}});
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const WeightTensor& x = (*f)->tensors().at("x");
  EXPECT_EQ(x.shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> xv = x.ToFloat();
  EXPECT_FLOAT_EQ(xv[0], 1.0f);
  EXPECT_FLOAT_EQ(xv[5], 1.005f);
  const WeightTensor& y = (*f)->tensors().at("y");
  EXPECT_EQ(y.dtype, DType::kBF16);
  EXPECT_FLOAT_EQ(y.ToFloat()[3], 0.5f);
}

TEST(SafetensorsTest, RejectsCorruptFiles) {
  TempDir dir;
  const std::string path = dir.path() + "/bad.safetensors";
  // Offsets past the end of the data (a truncated file).
  WriteSafetensors(path, {}, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})");
  absl::Status s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("'w'"), std::string::npos) << s;
  // Span inconsistent with dtype x shape.
  WriteSafetensors(path, {{"w", F32Tensor({4}, 0)}},
                   R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})");
  s = SafetensorsFile::Open(path).status();
  EXPECT_NE(std::string(s.message()).find("needs 12"), std::string::npos) << s;
  // Header length larger than the file.
  {
    std::ofstream out(path, std::ios::binary);
    const char len[8] = {static_cast<char>(0xff), static_cast<char>(0xff), 0, 0, 0, 0, 0, 0};
    out.write(len, 8);
    out << "{}";
  }
  EXPECT_FALSE(SafetensorsFile::Open(path).ok());
  // Not JSON.
  WriteSafetensors(path, {}, "[1, 2");
  EXPECT_FALSE(SafetensorsFile::Open(path).ok());
  EXPECT_EQ(SafetensorsFile::Open(dir.path() + "/missing.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CheckpointTest, LoadsSingleFile) {
  TempDir dir;
  WriteConfig(dir.path(), TinyConfigJson());
  absl::StatusOr<ModelConfig> c = ConfigFromHfJson(TinyConfigJson().dump(), "x");
  ASSERT_TRUE(c.ok());
  WriteSafetensors(dir.path() + "/model.safetensors", TensorsFor(*c));
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = ModelWeights::LoadCheckpoint(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config().name, dir.path());
  const WeightTensor& q = (*w)->Get("model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{8, 8}));
  EXPECT_TRUE((*w)->Has("lm_head.weight"));
}

TEST(CheckpointTest, LoadsShardsThroughTheIndex) {
  TempDir dir;
  json cj = TinyConfigJson();
  cj["tie_word_embeddings"] = true;
  WriteConfig(dir.path(), cj);
  absl::StatusOr<ModelConfig> c = ConfigFromHfJson(cj.dump(), "x");
  std::map<std::string, RawTensor> all = TensorsFor(*c), a, b;
  json weight_map = json::object();
  for (auto& [name, t] : all) {
    const bool first = name.find("layers.1.") == std::string::npos;
    (first ? a : b)[name] = t;
    weight_map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  // An old-style rotary buffer is tolerated and ignored.
  b["model.layers.1.self_attn.rotary_emb.inv_freq"] = F32Tensor({2}, 0);
  WriteSafetensors(dir.path() + "/model-00001-of-00002.safetensors", a);
  WriteSafetensors(dir.path() + "/model-00002-of-00002.safetensors", b);
  std::ofstream(dir.path() + "/model.safetensors.index.json")
      << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = ModelWeights::LoadCheckpoint(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE((*w)->Has("lm_head.weight"));
  EXPECT_TRUE((*w)->Has("model.layers.1.mlp.down_proj.weight"));
  EXPECT_FALSE((*w)->Has("model.layers.1.self_attn.rotary_emb.inv_freq"));

  // An index entry whose shard lacks the tensor.
  weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors";
  std::ofstream(dir.path() + "/model.safetensors.index.json") << json{{"weight_map", weight_map}}.dump();
  absl::Status s = ModelWeights::LoadCheckpoint(dir.path()).status();
  EXPECT_NE(std::string(s.message()).find("model.norm.weight"), std::string::npos) << s;
}

// Each broken checkpoint fails with a message naming the tensor.
TEST(CheckpointTest, ErrorsNameTheTensor) {
  absl::StatusOr<ModelConfig> c = ConfigFromHfJson(TinyConfigJson().dump(), "x");
  struct Case {
    std::string what;
    std::function<void(std::map<std::string, RawTensor>&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"missing", [](auto& t) { t.erase("model.layers.1.mlp.up_proj.weight"); },
       "missing tensor 'model.layers.1.mlp.up_proj.weight'"},
      {"shape", [](auto& t) { t["model.layers.0.self_attn.k_proj.weight"] = F32Tensor({8, 8}, 0); },
       "'model.layers.0.self_attn.k_proj.weight'"},
      {"dtype",
       [](auto& t) {
         RawTensor r = F32Tensor({8}, 0);
         r.dtype = "I32";
         t["model.norm.weight"] = r;
       },
       "'model.norm.weight'"},
      {"extra", [](auto& t) { t["model.layers.2.mlp.up_proj.weight"] = F32Tensor({12, 8}, 0); },
       "unexpected tensor 'model.layers.2.mlp.up_proj.weight'"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    TempDir dir;
    WriteConfig(dir.path(), TinyConfigJson());
    std::map<std::string, RawTensor> t = TensorsFor(*c);
    k.edit(t);
    WriteSafetensors(dir.path() + "/model.safetensors", t);
    absl::Status s = ModelWeights::LoadCheckpoint(dir.path()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find(k.expect), std::string::npos) << s;
  }
  TempDir empty;
  EXPECT_NE(std::string(ModelWeights::LoadCheckpoint(empty.path()).status().message()).find("config.json"),
            std::string::npos);
  WriteConfig(empty.path(), TinyConfigJson());
  EXPECT_NE(std::string(ModelWeights::LoadCheckpoint(empty.path()).status().message()).find("model.safetensors"),
            std::string::npos);
}

TEST(CheckpointTest, RandomWeightsAreReproducible) {
  absl::StatusOr<ModelConfig> c = PresetConfig("tiny");
  auto a = ModelWeights::Random(*c, 7), b = ModelWeights::Random(*c, 7), d = ModelWeights::Random(*c, 8);
  const std::string n = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_EQ(a->Get(n).ToFloat(), b->Get(n).ToFloat());
  EXPECT_NE(a->Get(n).ToFloat(), d->Get(n).ToFloat());
  EXPECT_EQ(a->Get("model.norm.weight").ToFloat(), std::vector<float>(64, 1.0f));
}

}  // namespace
}  // namespace fusedserve
