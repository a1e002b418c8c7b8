// Start-up against hostile or broken files, with the real binary on the CPU
// backend:
//   model     a config.json declaring num_hidden_layers = 1e9 (next to a
//             model.safetensors, so loading gets past the file lookup): the
//             server exits 1 within seconds, its log naming the field and the
//             limit, instead of allocating GBs and aborting;
//   cache     a FIFO as --tuning_cache: start-up does not block on it; the
//             server reaches SERVING with a memory-only cache, and
//             GetServerInfo and the rejected metric say "unreadable".
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace fusedserve {
namespace {

using testing::ServerProcess;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/fs_hostile_files_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf " + path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(HostileFiles, AbsurdLayerCountExitsPromptlyNamingTheField) {
  TempDir dir;
  std::ofstream(dir.path() + "/config.json") << R"({"model_type": "llama", "hidden_size": 64,
    "num_hidden_layers": 1000000000, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 176, "vocab_size": 512, "torch_dtype": "float32"})";
  {
    // A well-formed safetensors file with no tensors: 8-byte length, "{}" padded.
    std::ofstream st(dir.path() + "/model.safetensors", std::ios::binary);
    const char len[8] = {8, 0, 0, 0, 0, 0, 0, 0};
    st.write(len, 8);
    st << "{}      ";
  }
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<ServerProcess> server = ServerProcess::Spawn({"--model=" + dir.path()});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->WaitExit(30), 1) << server->Log();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30);
  const std::string log = server->Log();
  EXPECT_NE(log.find("num_hidden_layers = 1000000000 exceeds the limit of 1024"), std::string::npos) << log;
}

TEST(HostileFiles, FifoAsTuningCacheStillServes) {
  TempDir dir;
  const std::string fifo = dir.path() + "/cache.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--tuning_cache=" + fifo}, /*timeout_s=*/60);
  ASSERT_NE(server, nullptr);

  grpc::ClientContext ctx;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(server->stub()->GetServerInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.tuning_cache().state(), "unreadable");
  const std::string metrics = testing::HttpGet(server->metrics_port(), "/metrics");
  EXPECT_NE(metrics.find("fusedserve_tuning_cache_rejected_total{reason=\"unreadable\"} 1"), std::string::npos)
      << metrics;
  const std::string log = server->Log();
  EXPECT_NE(log.find("is a FIFO"), std::string::npos) << log;
  struct stat st;
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));  // left in place
}

}  // namespace
}  // namespace fusedserve
