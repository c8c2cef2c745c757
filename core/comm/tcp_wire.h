// The TCP store's wire: its message format, its limits and the socket helpers both sides use (the server:
// tcp_store_server.cpp; the client: tcp_store.cpp).
//
// Wire format. A message is a u32 length (at most kMaxMessage) and that many bytes: an opcode, then its
// fields (strings are u32 length + bytes, integers 8 bytes, little-endian). Every reply starts with a
// status byte: 0 ok, 1 timed out (a get or wait), 2 refused (followed by the reason).
//
//   hello  token                        -> ok | refused (wrong token: the connection is closed)
//   set    key value                    -> ok
//   get    1 key timeout_ms             -> ok value | timed out
//   wait   n key... timeout_ms          -> ok | timed out
//   add    key delta                    -> ok new_value | refused (the key holds no integer)
//   check  n key...                     -> ok present(u8)
//
// The server closes a connection after a malformed message (short, long, unknown opcode, too many
// keys), a wrong or missing token, a message that stops half-way for kMessageWithin, or, when a token is
// required, no hello within hello_within (10 s). A refused add keeps the connection: it is the caller's mistake,
// not garbage.
#pragma once
#include <netinet/in.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/comm/store.h"

namespace distlab::store_wire {

enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCheck = 5, kHello = 6 };
enum Status : uint8_t { kOk = 0, kTimedOut = 1, kRefused = 2 };

constexpr uint32_t kMaxMessage = 16u << 20;  // Gloo's addresses and our keys are bytes to kilobytes
// Before its token a connection may send a hello only: an opcode and a token of at most 1024 bytes. A
// longer length prefix is refused before anything is allocated for it.
constexpr uint32_t kMaxHello = 2048;
// What the large messages (over kMaxHello) being read and served may hold at once, over every connection:
// past it such a message is refused ("busy") and its connection closed, so that many large messages can't
// exhaust the launcher. Small ones are bounded by kMaxConnections x kMaxHello.
constexpr uint64_t kMaxHeld = uint64_t(256) << 20;
constexpr int64_t kMaxKeys = 4096;
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr int64_t kMaxWaitMs = int64_t(7) * 24 * 3600 * 1000;
constexpr int kMaxConnections = 1024;  // connections that said their hello (a job's ranks, each a few)
// Connections that have not said their hello yet. A port scan, or a program that opens connections to
// MASTER_PORT and sends nothing, could otherwise hold every slot while the ranks connect (1,030 idle ones
// failed a 2-rank job's rendezvous): past this many, the oldest silent one is closed for each new one. A
// rank says its hello as soon as it connects, so it is the newest, not the oldest, and keeps its slot;
// one closed all the same connects again (TcpStore's constructor).
constexpr int kMaxUnauthenticated = 256;
constexpr Millis kMessageWithin(30000);
constexpr Millis kReplySlack(30000);  // a get or wait is answered at most this long after its own timeout

using Clock = std::chrono::steady_clock;
const Clock::time_point kNever = Clock::time_point::max();

struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Writer {
  std::vector<char> buf = std::vector<char>(4);
  Writer& u8(uint8_t v) { buf.push_back(char(v)); return *this; }
  Writer& i64(int64_t v) { buf.insert(buf.end(), reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + 8); return *this; }
  Writer& bytes(const std::vector<char>& v) {
    uint32_t n = uint32_t(v.size());
    buf.insert(buf.end(), reinterpret_cast<char*>(&n), reinterpret_cast<char*>(&n) + 4);
    buf.insert(buf.end(), v.begin(), v.end());
    return *this;
  }
  Writer& str(const std::string& s) { return bytes(std::vector<char>(s.begin(), s.end())); }
  std::vector<char> done() {
    uint32_t n = uint32_t(buf.size() - 4);
    std::memcpy(buf.data(), &n, 4);
    return std::move(buf);
  }
};

struct Reader {
  const std::vector<char>& buf;
  size_t pos = 0;
  void need(size_t n) const {
    if (n > buf.size() - pos) throw Malformed(fmt::format("a message of {} bytes ends early", buf.size()));
  }
  uint8_t u8() { need(1); return uint8_t(buf[pos++]); }
  int64_t i64() { need(8); int64_t v; std::memcpy(&v, &buf[pos], 8); pos += 8; return v; }
  std::vector<char> bytes(uint32_t cap = kMaxMessage) {
    need(4);
    uint32_t n;
    std::memcpy(&n, &buf[pos], 4);
    pos += 4;
    if (n > cap) throw Malformed(fmt::format("a field of {} bytes (at most {})", n, cap));
    need(n);
    std::vector<char> v(buf.begin() + long(pos), buf.begin() + long(pos + n));
    pos += n;
    return v;
  }
  std::string str(uint32_t cap = kMaxMessage) { auto v = bytes(cap); return std::string(v.begin(), v.end()); }
  std::string key() { return str(kMaxKeyBytes); }
  std::vector<std::string> keys(bool exactly_one = false) {
    const int64_t n = i64();
    if (n < 1 || n > kMaxKeys || (exactly_one && n != 1)) throw Malformed(fmt::format("{} keys in one request (1..{})", n, kMaxKeys));
    std::vector<std::string> k;
    for (int64_t i = 0; i < n; i++) k.push_back(key());
    return k;
  }
  Millis timeout() {
    const int64_t ms = i64();
    if (ms < 0 || ms > kMaxWaitMs) throw Malformed(fmt::format("a timeout of {} ms", ms));
    return Millis(ms);
  }
  void end() const {
    if (pos != buf.size()) throw Malformed(fmt::format("{} bytes after the end of a request", buf.size() - pos));
  }
};

enum class Got { ok, closed, timed_out, too_big, busy };

// Waits until fd is ready for `events` or the deadline passes. false: timed out (or the socket broke).
bool ready(int fd, short events, Clock::time_point deadline);
bool write_all(int fd, const std::vector<char>& m, Clock::time_point deadline);
Got read_exact(int fd, char* p, size_t n, Clock::time_point deadline);
// One message: its first byte may take until `first_by`; once it started, the rest must follow within
// kMessageWithin (or by `first_by`, if that is later: a client waiting for a reply). At most `cap` bytes;
// with `held` (the server's), its size is counted there before it is allocated, and stays counted until
// the caller releases it (on ok) — a read that fails releases it here.
Got read_message(int fd, std::vector<char>& out, Clock::time_point first_by, uint32_t cap = kMaxMessage,
                 std::atomic<uint64_t>* held = nullptr);
std::vector<char> refusal(const std::string& why);
bool same_token(const std::string& a, const std::string& b);  // in time independent of where they differ
void no_delay(int fd);
in_addr resolve_ipv4(const std::string& host, const char* what);

}  // namespace distlab::store_wire
