#include "core/ckpt/atomic_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/util/error.h"

namespace distlab {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  f_ = std::fopen(partial_path().c_str(), "wb");
  if (!f_)
    throw IoError(fmt::format("cannot write '{}': {}", partial_path(), std::strerror(errno)),
                  "check that the folder exists and is writable");
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
}

void AtomicFile::write(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, f_) != n)
    throw IoError(fmt::format("writing '{}' failed: {}", partial_path(), std::strerror(errno)), "is the disk full?");
}

void AtomicFile::flush() { std::fflush(f_); }

void AtomicFile::commit() {
  if (std::fflush(f_) != 0 || fsync(fileno(f_)) != 0)
    throw IoError(fmt::format("writing '{}' failed: {}", partial_path(), std::strerror(errno)), "is the disk full?");
  std::fclose(f_);
  f_ = nullptr;
  std::error_code ec;
  std::filesystem::rename(partial_path(), path_, ec);
  if (ec) throw IoError(fmt::format("cannot rename '{}' to '{}': {}", partial_path(), path_, ec.message()));
  committed_ = true;
}

}  // namespace distlab
