// Files written so that a failure never leaves a half-written file under the final name, and never
// clobbers what was there: write "<path>.partial", fsync, then rename over <path>.
#pragma once
#include <cstdio>
#include <string>

namespace distlab {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // opens <path>.partial for writing; IoError if it can't
  ~AtomicFile();                          // not committed: the .partial file stays for inspection, unless a write failed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  void flush();
  void sync();    // flush + fsync: what was written survives a crash (still under the .partial name)
  void commit();  // fsync + rename to the final path
  const std::string& path() const { return path_; }
  std::string partial_path() const { return path_ + ".partial"; }

 private:
  [[noreturn]] void fail(const char* during);
  std::string path_;
  FILE* f_ = nullptr;
  bool committed_ = false;
  bool failed_ = false;
};

// Before a run: the folder that will hold `path` exists and is writable, and `path` is not a folder
// (IoError naming `what`, e.g. "--save"). A run that trains for an hour must not fail at the end on this.
void check_output_path(const std::string& path, const std::string& what);

}  // namespace distlab
