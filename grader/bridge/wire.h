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
#include <sys/uio.h>
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

// Reads exactly n bytes. What is already there is taken at once (recv without waiting); poll() only when
// the socket has nothing, so a frame costs one or two system calls, not a poll before every read. A peer that
// trickles bytes still meets the deadline at each wait.
inline Io read_full(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) return Io::eof;
    if (got > 0) {
      p += got;
      n -= size_t(got);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno == ECONNRESET ? Io::eof : Io::error;
    if (Io w = wait_fd(fd, POLLIN, deadline); w != Io::ok) return w;
  }
  return Io::ok;
}

// Writes the n bytes of each of `parts` in order (a header and its payload: one sendmsg, so the reader
// wakes once for the frame), waiting for room only when the socket is full.
inline Io write_all(int fd, iovec* parts, int count, Clock::time_point deadline) {
  while (count > 0 && parts[0].iov_len == 0) parts++, count--;
  while (count > 0) {
    msghdr m{};
    m.msg_iov = parts;
    m.msg_iovlen = size_t(count);
    const ssize_t put = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (put < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return errno == EPIPE || errno == ECONNRESET ? Io::eof : Io::error;
      if (Io w = wait_fd(fd, POLLOUT, deadline); w != Io::ok) return w;
      continue;
    }
    size_t left = size_t(put);  // past the parts sent whole, into the one sent in part
    while (count > 0 && left >= parts[0].iov_len) {
      left -= parts[0].iov_len;
      parts++, count--;
    }
    if (count > 0) {
      parts[0].iov_base = static_cast<char*>(parts[0].iov_base) + left;
      parts[0].iov_len -= left;
    }
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
  iovec parts[2] = {{&f, sizeof f}, {const_cast<void*>(payload), size_t(bytes)}};
  return write_all(fd, parts, bytes ? 2 : 1, deadline);
}

inline Clock::time_point after_seconds(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace distlab::wire
