// OpenRegularFile / ReadRegularFile: hostile paths are refused without
// blocking (FIFO, directory, device), sizes are capped, errors name the path.
#include "warmup/regular_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace fusedserve {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/fs_regular_file_XXXXXX";
  return mkdtemp(tmpl);
}

TEST(RegularFile, ReadsARegularFileAndASymlinkToIt) {
  const std::string dir = TempDir();
  { std::ofstream(dir + "/a") << "hello"; }
  ASSERT_EQ(symlink((dir + "/a").c_str(), (dir + "/link").c_str()), 0);
  EXPECT_EQ(*ReadRegularFile(dir + "/a", 100), "hello");
  EXPECT_EQ(*ReadRegularFile(dir + "/link", 100), "hello");
}

TEST(RegularFile, RefusesFifoWithoutBlocking) {
  const std::string dir = TempDir();
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0644), 0);
  absl::StatusOr<std::string> r = ReadRegularFile(dir + "/fifo", 100);  // would block forever if opened plainly
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("FIFO"), std::string::npos) << r.status();
}

TEST(RegularFile, RefusesDirectoriesAndDevices) {
  const std::string dir = TempDir();
  EXPECT_EQ(ReadRegularFile(dir, 100).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadRegularFile("/dev/zero", 100).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RegularFile, MissingIsNotFoundAndTooLargeIsResourceExhausted) {
  const std::string dir = TempDir();
  EXPECT_EQ(ReadRegularFile(dir + "/none", 100).status().code(), absl::StatusCode::kNotFound);
  { std::ofstream(dir + "/big") << std::string(101, 'x'); }
  absl::StatusOr<std::string> r = ReadRegularFile(dir + "/big", 100);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find(dir + "/big"), std::string::npos);
}

TEST(RegularFile, UnreadableIsPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads any file";
  const std::string dir = TempDir();
  { std::ofstream(dir + "/secret") << "x"; }
  chmod((dir + "/secret").c_str(), 0);
  EXPECT_EQ(ReadRegularFile(dir + "/secret", 100).status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace fusedserve
