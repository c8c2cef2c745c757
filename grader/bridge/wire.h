// Frames on a stream socket between two processes that do not trust each other: the grader (or a trainer)
// and the process a student's plugin is loaded into (grader/host/). Header-only, so that the plugin's host
// can use it without linking the engine.
//
// A frame is a fixed 80-byte header (an opcode, up to eight integer arguments, a payload length) and then
// the payload. Every read has a deadline and a cap on the payload: a peer that stalls, floods or lies about
// a length costs the reader a clean error, never a hang or a 4 GiB allocation.
#pragma once
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace distlab::wire {

using Clock = std::chrono::steady_clock;

struct Frame {
  uint32_t op = 0;
  uint32_t reserved = 0;
  uint64_t bytes = 0;  // payload that follows the header
  int64_t arg[8] = {};
};
static_assert(sizeof(Frame) == 80);

enum class Io { ok, eof, timeout, error, too_big };

inline const char* io_name(Io r) {
  switch (r) {
    case Io::ok: return "ok";
    case Io::eof: return "the other side closed the connection";
    case Io::timeout: return "no answer before the deadline";
    case Io::error: return "a socket error";
    case Io::too_big: return "a message over the size limit";
  }
  return "?";
}

// Waits until fd is readable (or writable) or the deadline passes.
inline Io wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Io::timeout;
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, int(std::min<int64_t>(left, 1000)));
    if (rc > 0) return Io::ok;
    if (rc < 0 && errno != EINTR) return Io::error;
  }
}

inline Io read_full(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (Io w = wait_fd(fd, POLLIN, deadline); w != Io::ok) return w;
    const ssize_t got = ::read(fd, p, n);
    if (got == 0) return Io::eof;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno == ECONNRESET ? Io::eof : Io::error;
    }
    p += got;
    n -= size_t(got);
  }
  return Io::ok;
}

inline Io write_full(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    if (Io w = wait_fd(fd, POLLOUT, deadline); w != Io::ok) return w;
    const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno == EPIPE || errno == ECONNRESET ? Io::eof : Io::error;
    }
    p += put;
    n -= size_t(put);
  }
  return Io::ok;
}

// One frame with its payload (read into `payload`, at most max_bytes).
inline Io read_frame(int fd, Frame& f, std::vector<char>& payload, uint64_t max_bytes, Clock::time_point deadline) {
  if (Io r = read_full(fd, &f, sizeof f, deadline); r != Io::ok) return r;
  if (f.bytes > max_bytes) return Io::too_big;
  payload.resize(size_t(f.bytes));
  return f.bytes ? read_full(fd, payload.data(), size_t(f.bytes), deadline) : Io::ok;
}

inline Io write_frame(int fd, Frame f, const void* payload, uint64_t bytes, Clock::time_point deadline) {
  f.bytes = bytes;
  if (Io r = write_full(fd, &f, sizeof f, deadline); r != Io::ok) return r;
  return bytes ? write_full(fd, payload, size_t(bytes), deadline) : Io::ok;
}

inline Clock::time_point after_seconds(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace distlab::wire
