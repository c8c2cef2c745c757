// read_regular_file (core/util/read_file.h).
#include "core/util/read_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/util/error.h"

namespace distlab {

std::vector<uint8_t> read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what, bool follow_links) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow_links ? 0 : O_NOFOLLOW));
  if (fd < 0 && errno == ELOOP && !follow_links)
    throw IoError(fmt::format("{}: {} is a symbolic link (refused: it must be a regular file)", path, what));
  if (fd < 0) throw IoError(fmt::format("{}: cannot open {} ({})", path, what, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(fmt::format("{}: {} is not a regular file (a device, a FIFO or a folder: refused)", path, what));
  }
  if (uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    throw IoError(fmt::format("{}: {} is {} bytes, more than the {} it can be", path, what, st.st_size, max_bytes));
  }
  std::vector<uint8_t> bytes(size_t(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      throw IoError(fmt::format("{}: reading {}: {}", path, what, std::strerror(err)));
    }
    if (r == 0) break;  // shorter than it was: what is there
    got += size_t(r);
  }
  ::close(fd);
  bytes.resize(got);
  return bytes;
}

}  // namespace distlab
