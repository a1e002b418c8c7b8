#include "warmup/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fusedserve {

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    size_ = other.size_;
    other.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path, int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    if (err == EISDIR || err == ENXIO || err == ELOOP) return absl::FailedPreconditionError(msg);
    return absl::InternalError(msg);
  }
  RegularFile file(fd, 0);  // closes fd on the error returns below
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device or special file";
    return absl::FailedPreconditionError(absl::StrCat(path, " is ", kind, ", not a regular file"));
  }
  if (st.st_size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, " has ", st.st_size, " bytes, more than the limit of ", max_bytes));
  }
  // Regular files ignore O_NONBLOCK; clear it anyway so reads behave plainly.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return RegularFile(file.release(), static_cast<int64_t>(st.st_size));
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path, max_bytes);
  if (!file.ok()) return file.status();
  std::string text;
  text.reserve(static_cast<size_t>(file->size()));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file->fd(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      const std::string msg = absl::StrCat("cannot read ", path, ": ", std::strerror(err));
      return err == EISDIR ? absl::FailedPreconditionError(msg) : absl::InternalError(msg);
    }
    if (n == 0) break;
    // A file that grows while read is still held to the cap.
    if (static_cast<int64_t>(text.size()) + n > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(path, " grew past the limit of ", max_bytes, " bytes"));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace fusedserve
