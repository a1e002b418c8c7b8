// Opening files that come from outside the process (the tuning cache, a model
// directory, TLS material) without letting a hostile path stall or exhaust
// it: a FIFO or device node at the path must never block open() or read(),
// and a file larger than its cap is refused before it is read.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace fusedserve {

// An open regular file; closes on destruction.
class RegularFile {
 public:
  RegularFile() = default;
  RegularFile(int fd, int64_t size) : fd_(fd), size_(size) {}
  RegularFile(RegularFile&& other) noexcept : fd_(other.fd_), size_(other.size_) { other.fd_ = -1; }
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  int fd() const { return fd_; }
  int64_t size() const { return size_; }
  // Gives up ownership of the descriptor.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
  int64_t size_ = 0;
};

// Opens `path` read-only with O_NONBLOCK (so a FIFO cannot block the open),
// then requires a regular file (symbolic links to one are fine: checkpoint
// caches are made of them) of at most max_bytes.
//   NOT_FOUND: missing; PERMISSION_DENIED: not readable;
//   FAILED_PRECONDITION: not a regular file (directory, FIFO, device, socket);
//   RESOURCE_EXHAUSTED: larger than max_bytes; INTERNAL: any other error.
// Every message names the path.
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path, int64_t max_bytes);

// OpenRegularFile, then reads the whole file.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes);

}  // namespace fusedserve
