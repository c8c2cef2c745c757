// Lab 07's file service and load_state's answer (grader/bridge/lab_files.h). Read with
// grader/labs/07-checkpoint/bridge.cpp, which serves them during save_state and load_state.
#include "grader/bridge/lab_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <csignal>
#include <cstring>
#include <filesystem>

#include "grader/bridge/protocol.h"
#include "grader/bridge/sandbox.h"
#include "grader/bridge/lab_plugin.h"
#include "core/util/error.h"

namespace distlab {

namespace fs = std::filesystem;

namespace {

Error files_error(const std::string& what, const std::string& hint = "see labs/07-checkpoint/api.h and README.md") {
  return Error("lab 07: " + what, hint);
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 200 || n[0] == '.') return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

// an answer read front to back: a short one is the host's fault, an error, never a read past its end
struct Cursor {
  const std::vector<char>& in;
  size_t at;
  void copy(void* dst, size_t n) {
    if (n > in.size() - at) throw files_error("load_state: a broken answer from the plugin's host (shorter than what it says it holds)");
    if (n) std::memcpy(dst, in.data() + at, n);
    at += n;
  }
  template <class T>
  T take() {
    T v{};
    copy(&v, sizeof(T));
    return v;
  }
};

}  // namespace

std::string lab07_state_file(int rank) { return "rank-" + std::to_string(rank) + ".state"; }

LabFileServer::LabFileServer(LabPlugin& plugin, std::string dir, int rank, bool kill_on_write, std::ostream& log, uint64_t byte_quota)
    : plugin_(plugin), dir_(std::move(dir)), rank_(rank), kill_on_write_(kill_on_write), log_(log), quota_(byte_quota) {}

LabFileServer::~LabFileServer() {
  for (auto& [h, f] : open_) ::close(f.fd);
}

void LabFileServer::finish() {
  for (auto& [h, f] : open_) {
    ::close(f.fd);
    violations.push_back(fmt::format("{} was left open", f.name));
  }
  open_.clear();
}

void LabFileServer::serve(const wire::Frame& f, std::vector<char>& payload) {
  switch (f.op) {
    case labproto::kFileOpen: {
      const std::string name = checked(std::string(payload.begin(), payload.end()), "open");
      if (opened_ >= kMaxFiles)
        throw files_error(fmt::format("open(\"{}\"): more than {} files opened in one save_state", name, kMaxFiles),
                          "a state file and its temporary name are all a checkpoint needs");
      opened_++;
      if (name == lab07_state_file(rank_))
        violations.push_back(fmt::format("opened {}, the final name, for writing: a kill during the write leaves a torn file that looks complete",
                                         name));
      // O_NOFOLLOW: a name in the folder is a file of the folder, whatever was put there
      const int fd = ::open(path(name).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0) throw files_error(fmt::format("open(\"{}\"): {}", name, std::strerror(errno)));
      const int32_t h = next_++;
      open_[h] = {fd, name, false};
      return answer(&h, 4);
    }
    case labproto::kFileWrite: {
      Open& o = handle(f.arg[0], "write");
      const char* p = payload.data();
      size_t n = payload.size();
      if (n > quota_ - written_)
        throw files_error(fmt::format("write({}): {} bytes would take this save_state past its quota of {} bytes ({} written)", o.name, n,
                                      quota_, written_),
                          "a rank's state file holds its State once: a few times the snapshot save_state was given at most");
      written_ += n;
      if (kill_on_write_) {  // DISTLAB_TEST_FAULT: half of this write reaches the disk, then SIGKILL
        n /= 2;
        write_all(o, p, n);
        ::fsync(o.fd);
        const std::string note = fmt::format("DISTLAB_TEST_FAULT: rank {} kills itself with SIGKILL halfway through writing {}\n", rank_, o.name);
        [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, note.data(), note.size());
        log_.flush();
        ::raise(SIGKILL);
      }
      write_all(o, p, n);
      o.dirty = true;
      unsynced_.insert(o.name);
      return answer(nullptr, 0);
    }
    case labproto::kFileSync: {
      Open& o = handle(f.arg[0], "fsync");
      if (::fsync(o.fd) != 0) throw files_error(fmt::format("fsync({}): {}", o.name, std::strerror(errno)));
      o.dirty = false;
      unsynced_.erase(o.name);
      return answer(nullptr, 0);
    }
    case labproto::kFileClose: {
      Open& o = handle(f.arg[0], "close");
      const int rc = ::close(o.fd);
      const int err = errno;
      const std::string name = o.name;
      closed_dirty_[name] = unsynced_.count(name) > 0;
      open_.erase(int32_t(f.arg[0]));  // closed either way: a failed close(2) still frees the descriptor
      if (rc != 0) throw files_error(fmt::format("close({}): {}", name, std::strerror(err)));
      return answer(nullptr, 0);
    }
    case labproto::kFileRename: {
      const auto zero = std::find(payload.begin(), payload.end(), '\0');
      if (zero == payload.end()) throw files_error("rename: a broken request (no NUL between the two names)");
      const std::string from = checked(std::string(payload.begin(), zero), "rename"), to = checked(std::string(zero + 1, payload.end()), "rename");
      for (auto& [h, o] : open_)
        if (o.name == from) violations.push_back(fmt::format("renamed {} to {} while it was open", from, to));
      if (auto it = closed_dirty_.find(from); it != closed_dirty_.end() && it->second)
        violations.push_back(fmt::format("renamed {} to {} before fsync({}): after a crash the new name can hold a file the disk never got", from,
                                         to, from));
      std::error_code ec;
      fs::rename(path(from), path(to), ec);
      if (ec) throw files_error(fmt::format("rename(\"{}\", \"{}\"): {}", from, to, ec.message()));
      closed_dirty_.erase(from);
      if (unsynced_.erase(from)) unsynced_.insert(to);
      return answer(nullptr, 0);
    }
    case labproto::kFileExists: {
      const std::string name = checked(std::string(payload.begin(), payload.end()), "exists");
      std::error_code ec;
      const int32_t v = fs::is_regular_file(fs::symlink_status(path(name), ec));
      return answer(&v, 4);
    }
    case labproto::kFileRead: {
      const std::string name = checked(std::string(payload.begin(), payload.end()), "read");
      // opened first, then measured: what is read is the file that was checked (O_NOFOLLOW, a regular file)
      const int fd = ::open(path(name).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
      if (fd < 0) throw files_error(fmt::format("read(\"{}\"): {}", name, std::strerror(errno)), "check files.exists(name) first");
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw files_error(fmt::format("read(\"{}\"): not a regular file", name));
      }
      if (uint64_t(st.st_size) > labproto::kMaxPayload) {
        ::close(fd);
        throw files_error(fmt::format("read(\"{}\"): {} bytes, more than {} MiB", name, st.st_size, labproto::kMaxPayload >> 20));
      }
      std::vector<char> bytes(size_t(st.st_size));
      size_t got = 0;
      while (got < bytes.size()) {
        const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;  // shorter than it was: what is there
        got += size_t(r);
      }
      ::close(fd);
      bytes.resize(got);
      return answer(bytes.data(), bytes.size());
    }
    default:
      throw files_error(fmt::format("an unexpected request ({}) during save_state/load_state", f.op));
  }
}

std::string LabFileServer::checked(const std::string& name, const char* call) const {
  if (!valid_name(name))
    throw files_error(fmt::format("{}(\"{}\"): not a plain file name", call, sanitize_output(name.substr(0, 80), 100)),
                      "letters, digits, '.', '_' and '-', not starting with '.', at most 200 characters");
  if (name.rfind("model.safetensors", 0) == 0)
    throw files_error(fmt::format("{}(\"{}\"): the trainer's weights file, not the student's", call, name),
                      "your files are state_file(rank) and temporary names of your own");
  return name;
}

std::string LabFileServer::path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

LabFileServer::Open& LabFileServer::handle(int64_t h, const char* call) {
  auto it = h >= INT32_MIN && h <= INT32_MAX ? open_.find(int32_t(h)) : open_.end();
  if (it == open_.end()) throw files_error(fmt::format("{}({}): no file is open under that handle", call, h));
  return it->second;
}

void LabFileServer::write_all(Open& o, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(o.fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw files_error(fmt::format("write({}): {}", o.name, std::strerror(errno)), "is the disk full?");
    p += w;
    n -= size_t(w);
  }
}

void LabFileServer::answer(const void* data, size_t bytes) { plugin_.reply(labproto::kData, data, bytes, 0, "lab 07's files"); }

std::string parse_load_refusal(const std::vector<char>& answer) {
  Cursor r{answer, 0};
  const int32_t len = r.take<int32_t>();
  // the length is the plugin's: compared with what came before anything is allocated for it
  if (len < 0 || size_t(len) > answer.size() - r.at)
    throw files_error(fmt::format("load_state: a broken answer (a refusal of {} bytes in an answer of {})", len, answer.size()));
  std::string refusal(size_t(len), '\0');
  r.copy(refusal.data(), size_t(len));
  return refusal;
}

LabLoadAnswer parse_load_answer(const std::vector<char>& answer, const std::vector<int64_t>& numels, size_t names, size_t streams) {
  LabLoadAnswer a;
  a.refusal = parse_load_refusal(answer);
  Cursor r{answer, 4 + a.refusal.size()};
  a.steps_set = r.take<int64_t>() != 0;
  a.steps = r.take<int64_t>();
  if (a.steps_set && a.steps < 0) throw files_error(fmt::format("load_state set the optimizer's step count to {}", a.steps), "a count of steps is never negative");
  a.states.resize(numels.size() * names);
  a.state_set.assign(numels.size() * names, false);
  for (size_t i = 0; i < numels.size(); i++)
    for (size_t k = 0; k < names; k++) {
      const int64_t count = r.take<int64_t>();
      if (count < 0) continue;
      if (count != numels[i])
        throw files_error(fmt::format("load_state set an optimizer state of parameter {} to {} values; it has {}", i, count, numels[i]),
                          "set each state to exactly the parameter's number of values");
      auto& v = a.states[i * names + k];
      v.resize(size_t(count));
      r.copy(v.data(), size_t(count) * 4);
      a.state_set[i * names + k] = true;
    }
  a.rng_set = r.take<int64_t>() != 0;
  const int64_t ns = r.take<int64_t>();
  if (ns < 0 || uint64_t(ns) != streams)
    throw files_error(fmt::format("load_state: a broken answer ({} dropout streams, the model has {})", ns, streams));
  a.rng.resize(streams);
  for (auto& s : a.rng) s = r.take<uint64_t>();
  a.sampler_set = r.take<int64_t>() != 0;
  a.epoch = r.take<int64_t>();
  a.position = r.take<int64_t>();
  if (a.sampler_set && (a.epoch < 0 || a.position < 0))
    throw files_error(fmt::format("load_state set the sampler to epoch {}, batch {}", a.epoch, a.position), "neither is ever negative");
  if (r.at != answer.size()) throw files_error(fmt::format("load_state: a broken answer ({} bytes more than it holds)", answer.size() - r.at));
  return a;
}

}  // namespace distlab
