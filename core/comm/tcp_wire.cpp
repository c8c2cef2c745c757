// The TCP store's socket helpers (core/comm/tcp_wire.h): a message read and written whole within its
// deadline, a host resolved to IPv4. Read next: core/comm/tcp_store.cpp (the client).
#include "core/comm/tcp_wire.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "core/comm/errors.h"

namespace distlab::store_wire {

bool ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    int ms = -1;
    if (deadline != kNever) {
      const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      ms = int(std::min<int64_t>(left, 60000));
    }
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r > 0) return true;  // readable, writable, or hung up: the read/write says which
  }
}

bool write_all(int fd, const std::vector<char>& m, Clock::time_point deadline) {
  size_t off = 0;
  while (off < m.size()) {
    if (!ready(fd, POLLOUT, deadline)) return false;
    ssize_t n = ::send(fd, m.data() + off, m.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

Got read_exact(int fd, char* p, size_t n, Clock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    if (!ready(fd, POLLIN, deadline)) return Got::timed_out;
    ssize_t r = ::recv(fd, p + off, n - off, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return Got::closed;
    off += size_t(r);
  }
  return Got::ok;
}

Got read_message(int fd, std::vector<char>& out, Clock::time_point first_by, uint32_t cap, std::atomic<uint64_t>* held) {
  char len[4];
  Got g = read_exact(fd, len, 1, first_by);
  if (g != Got::ok) return g;
  const auto rest_by = std::max(first_by == kNever ? Clock::now() : first_by, Clock::now() + kMessageWithin);
  if ((g = read_exact(fd, len + 1, 3, rest_by)) != Got::ok) return g;
  uint32_t n;
  std::memcpy(&n, len, 4);
  if (n > cap) return Got::too_big;
  // small messages (a hello, a get, a key) are bounded by the connections' count; large ones by the budget
  const uint64_t counted = held && n > kMaxHello ? n : 0;
  if (counted && held->fetch_add(counted) + counted > kMaxHeld) {
    held->fetch_sub(counted);
    return Got::busy;
  }
  out.resize(n);
  g = n == 0 ? Got::ok : read_exact(fd, out.data(), n, rest_by);
  if (g != Got::ok && counted) held->fetch_sub(counted);
  return g;
}

std::vector<char> refusal(const std::string& why) { return Writer().u8(kRefused).str(why).done(); }

bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); i++) d |= uint8_t(a[i] ^ b[i]);
  return d == 0;
}

void no_delay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

in_addr resolve_ipv4(const std::string& host, const char* what) {
  in_addr a{};
  if (host == "0.0.0.0" || host.empty()) {
    a.s_addr = htonl(INADDR_ANY);
    return a;
  }
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return a;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res)
    throw StoreError(fmt::format("cannot resolve the rendezvous host '{}' ({})", host, what), "check MASTER_ADDR / --master-addr");
  a = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return a;
}

}  // namespace distlab::store_wire
