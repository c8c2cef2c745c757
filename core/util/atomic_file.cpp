#include "core/util/atomic_file.h"

#include <fmt/format.h>
#include <fcntl.h>
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
  // a write that failed (a full disk, a quota) leaves nothing behind: its bytes are cut short anyway, and
  // they would hold on to the space the disk lacks. One never finished for another reason (a run that
  // crashed or was stopped) stays for inspection: the grader reads a failed run's metrics from it
  if (failed_ && !committed_) std::remove(partial_path().c_str());
}

// Every failure is remembered: a stream whose buffered bytes were lost once (a full disk) must never
// be renamed into place, even if a later flush of an empty buffer reports success.
void AtomicFile::fail(const char* during) {
  const int e = errno;
  failed_ = true;
  throw IoError(fmt::format("{} '{}' failed: {}", during, partial_path(), std::strerror(e)),
                fmt::format("is the disk full, or over a quota? '{}' is left as it was", path_));
}

void AtomicFile::write(const void* data, size_t n) {
  if (failed_) throw IoError(fmt::format("'{}' already failed to write", partial_path()));
  if ((n && std::fwrite(data, 1, n, f_) != n) || std::ferror(f_)) fail("writing");
}

void AtomicFile::flush() {
  if (failed_) throw IoError(fmt::format("'{}' already failed to write", partial_path()));
  if (std::fflush(f_) != 0 || std::ferror(f_)) fail("writing");
}

void AtomicFile::sync() {
  flush();
  if (fsync(fileno(f_)) != 0) fail("syncing");
}

void AtomicFile::commit() {
  if (failed_) throw IoError(fmt::format("'{}' failed to write earlier: not renamed to '{}'", partial_path(), path_));
  if (std::fflush(f_) != 0 || std::ferror(f_)) fail("writing");
  if (fsync(fileno(f_)) != 0) fail("syncing");
  FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0) {
    failed_ = true;
    throw IoError(fmt::format("closing '{}' failed: {}", partial_path(), std::strerror(errno)), "is the disk full?");
  }
  std::error_code ec;
  std::filesystem::rename(partial_path(), path_, ec);
  if (ec) throw IoError(fmt::format("cannot rename '{}' to '{}': {}", partial_path(), path_, ec.message()));
  // the rename itself reaches the disk with the folder's entry
  const std::string dir = std::filesystem::path(path_).parent_path().empty() ? "." : std::filesystem::path(path_).parent_path().string();
  if (int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  committed_ = true;
}

void check_output_path(const std::string& path, const std::string& what) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw IoError(fmt::format("{} '{}': the folder '{}' does not exist", what, path, dir.string()),
                  fmt::format("create it first (mkdir -p {}), or write elsewhere", dir.string()));
  if (::access(dir.c_str(), W_OK) != 0)
    throw IoError(fmt::format("{} '{}': the folder '{}' is not writable: {}", what, path, dir.string(), std::strerror(errno)),
                  "write somewhere you can write");
  if (fs::is_directory(p, ec)) throw IoError(fmt::format("{} '{}' is a folder", what, path), "give a file name");
}

}  // namespace distlab
