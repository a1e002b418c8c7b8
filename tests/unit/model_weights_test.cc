// Model config parsing and the safetensors checkpoint loader: files written
// here byte by byte (header length, JSON header, data), single-file and
// sharded checkpoints, every start-up error naming its tensor, and hostile
// files (absurd sizes, overlapping tensors, FIFOs) refused without blocking
// or allocating.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/config.h"
#include "model/weights.h"
#include "nlohmann/json.hpp"
#include "tests/unit/run_in_child.h"

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
    header[name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
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
  EXPECT_NE(std::string(ConfigFromHfJson(j.dump(), "cfg").status().message()).find("vocab_size"), std::string::npos);
  EXPECT_FALSE(ConfigFromHfJson("{not json", "cfg").ok());
}

// Every size field has a cap, checked on config.json alone; the error names
// the field and the limit.
TEST(ModelConfigTest, RejectsAbsurdSizesNamingFieldAndLimit) {
  const std::vector<std::pair<std::string, int64_t>> cases = {{"num_hidden_layers", kMaxLayers},
                                                              {"hidden_size", kMaxHidden},
                                                              {"intermediate_size", kMaxIntermediate},
                                                              {"num_attention_heads", kMaxHeads},
                                                              {"num_key_value_heads", kMaxHeads},
                                                              {"head_dim", kMaxHeadDim},
                                                              {"vocab_size", kMaxVocab},
                                                              {"max_position_embeddings", kMaxPositions}};
  for (const auto& [field, limit] : cases) {
    for (const json& value : {json(1000000000), json(limit + 1), json(uint64_t{18446744073709551615u})}) {
      json j = TinyConfigJson();
      j[field] = value;
      absl::StatusOr<ModelConfig> c = ConfigFromHfJson(j.dump(), "config.json");
      ASSERT_FALSE(c.ok()) << field << " = " << value.dump();
      EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
      const std::string msg(c.status().message());
      EXPECT_NE(msg.find(field), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(limit)), std::string::npos) << msg;
    }
    // The limit itself is accepted as far as this field goes.
    json j = TinyConfigJson();
    j[field] = limit;
    absl::StatusOr<ModelConfig> c = ConfigFromHfJson(j.dump(), "config.json");
    if (!c.ok()) {
      EXPECT_EQ(std::string(c.status().message()).find(field + " ="), std::string::npos) << c.status();
    }
  }
  // Every field within its cap, the total not: refused by the parameter bound.
  json j = TinyConfigJson();
  j["num_hidden_layers"] = kMaxLayers;
  j["hidden_size"] = kMaxHidden;
  j["intermediate_size"] = kMaxIntermediate;
  j["num_attention_heads"] = 512;
  j["num_key_value_heads"] = 8;
  absl::StatusOr<ModelConfig> c = ConfigFromHfJson(j.dump(), "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find(std::to_string(kMaxParameters)), std::string::npos) << c.status();
  // Sizes must be integers (a float would be cast without a range check).
  j = TinyConfigJson();
  j["max_position_embeddings"] = 1e30;
  c = ConfigFromHfJson(j.dump(), "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("max_position_embeddings"), std::string::npos) << c.status();
}

// The current address-space size of this process, in bytes.
int64_t VirtualMemoryBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  statm >> pages;
  return pages * sysconf(_SC_PAGESIZE);
}

// num_hidden_layers = 1e9 once made the loader list 9e9 expected tensors (GBs,
// then an abort). Now it is refused from config.json, before any allocation
// that scales with it: the load runs in a child allowed 256 MiB more address
// space than it starts with, and must answer within seconds.
TEST(CheckpointTest, AbsurdLayerCountIsRejectedBeforeAllocation) {
  TempDir dir;
  json j = TinyConfigJson();
  WriteSafetensors(dir.path() + "/model.safetensors", TensorsFor(*ConfigFromHfJson(j.dump(), "tiny")));
  j["num_hidden_layers"] = 1000000000;
  WriteConfig(dir.path(), j);
  const auto start = std::chrono::steady_clock::now();
  const int code = testing::RunInChild(
      [&] {
        const rlim_t cap = static_cast<rlim_t>(VirtualMemoryBytes() + (int64_t{256} << 20));
        const rlimit limit{cap, cap};
        if (setrlimit(RLIMIT_AS, &limit) != 0) return 10;
        absl::Status s = ModelWeights::LoadCheckpoint(dir.path()).status();
        if (s.code() != absl::StatusCode::kInvalidArgument) return 1;
        const std::string msg(s.message());
        if (msg.find("num_hidden_layers") == std::string::npos) return 2;
        if (msg.find(std::to_string(kMaxLayers)) == std::string::npos) return 3;
        return 0;
      },
      /*timeout_s=*/30);
  EXPECT_EQ(code, 0) << "-1: the child aborted (out of memory) or hung";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10);
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
  EXPECT_EQ(SafetensorsFile::Open(dir.path() + "/missing.safetensors").status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, RejectsOverlappingTensors) {
  TempDir dir;
  const std::string path = dir.path() + "/overlap.safetensors";
  // Two F32 [4] tensors (16 bytes each) sharing bytes 8..16 of a 24-byte data section.
  WriteSafetensors(path, {{"data", F32Tensor({6}, 0)}},
                   R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
                   R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})");
  absl::Status s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("overlap"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("'a'"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("'b'"), std::string::npos) << s;
  // The same range twice.
  WriteSafetensors(path, {{"data", F32Tensor({4}, 0)}},
                   R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
                   R"( "b": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})");
  s = SafetensorsFile::Open(path).status();
  EXPECT_NE(std::string(s.message()).find("overlap"), std::string::npos) << s;
  // Adjacent ranges and empty tensors are fine.
  WriteSafetensors(path, {{"data", F32Tensor({8}, 0)}},
                   R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
                   R"( "e": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},)"
                   R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}})");
  EXPECT_TRUE(SafetensorsFile::Open(path).ok()) << SafetensorsFile::Open(path).status();
}

// A header over kMaxSafetensorsHeaderBytes is refused before it is parsed,
// even when it is valid JSON and the file is that long.
TEST(SafetensorsTest, RejectsHugeHeader) {
  TempDir dir;
  const std::string path = dir.path() + "/huge.safetensors";
  const std::string header = "{" + std::string(static_cast<size_t>(kMaxSafetensorsHeaderBytes), ' ') + "}";
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header;
  }
  absl::Status s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find(std::to_string(kMaxSafetensorsHeaderBytes)), std::string::npos) << s;
}

// A FIFO as config.json or as a shard is refused at once; opening one for
// reading used to block start-up forever (no writer ever comes).
TEST(CheckpointTest, FifoFilesAreRefusedNotBlockedOn) {
  TempDir dir;
  ASSERT_EQ(mkfifo((dir.path() + "/config.json").c_str(), 0644), 0);
  ASSERT_EQ(mkfifo((dir.path() + "/shard.safetensors").c_str(), 0644), 0);
  const int code = testing::RunInChild(
      [&] {
        absl::Status s = ModelWeights::LoadCheckpoint(dir.path()).status();
        if (s.code() != absl::StatusCode::kFailedPrecondition) return 1;
        if (std::string(s.message()).find("FIFO") == std::string::npos) return 2;
        s = SafetensorsFile::Open(dir.path() + "/shard.safetensors").status();
        if (s.code() != absl::StatusCode::kFailedPrecondition) return 3;
        if (ConfigFromHfFile(dir.path() + "/config.json").ok()) return 4;
        return 0;
      },
      /*timeout_s=*/10);
  EXPECT_EQ(code, 0) << "-1: blocked on the FIFO";
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
      {"shape",
       [](auto& t) {
         t["model.layers.0.self_attn.k_proj.weight"] = F32Tensor({8, 8}, 0);
       },
       "'model.layers.0.self_attn.k_proj.weight'"},
      {"dtype",
       [](auto& t) {
         RawTensor r = F32Tensor({8}, 0);
         r.dtype = "I32";
         t["model.norm.weight"] = r;
       },
       "'model.norm.weight'"},
      {"extra",
       [](auto& t) {
         t["model.layers.2.mlp.up_proj.weight"] = F32Tensor({12, 8}, 0);
       },
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
