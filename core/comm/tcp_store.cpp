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
#include "core/comm/tcp_store.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/comm/errors.h"

namespace distlab {

namespace {

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

// Waits until fd is ready for `events` or the deadline passes. false: timed out (or the socket broke).
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

enum class Got { ok, closed, timed_out, too_big, busy };

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

// One message: its first byte may take until `first_by`; once it started, the rest must follow within
// kMessageWithin (or by `first_by`, if that is later: a client waiting for a reply). At most `cap` bytes;
// with `held` (the server's), its size is counted there before it is allocated, and stays counted until
// the caller releases it (on ok) — a read that fails releases it here.
Got read_message(int fd, std::vector<char>& out, Clock::time_point first_by, uint32_t cap = kMaxMessage,
                 std::atomic<uint64_t>* held = nullptr) {
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

bool same_token(const std::string& a, const std::string& b) {  // in time independent of where they differ
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

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string token, Millis hello_within)
    : token_(std::move(token)), hello_within_(hello_within), data_(Millis(0)) {
  if (port < 0 || port > 65535) throw StoreError(fmt::format("port {} is not in 0..65535", port), "pick a port in 1024..65535, or 0 for a free one");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr = resolve_ipv4(host, "the store's listening address");
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // never inherited by the workers
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // Every rank connects at start, at once: connections past the listen queue are dropped and their SYN is
  // sent again a second later. A queue of 128 cost 1,000 clients connecting together five such seconds;
  // SOMAXCONN asks for the most the kernel allows (net.core.somaxconn: 4096 here).
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, SOMAXCONN) != 0) {
    int e = errno;
    ::close(listen_fd_);
    throw StoreError(fmt::format("cannot listen on {}:{}: {}", host, port, std::strerror(e)),
                     e == EADDRINUSE       ? "another job holds this port: pick another --master-port, or 0 for a free one"
                     : e == EADDRNOTAVAIL ? "--master-addr must be an address of this machine (node 0 hosts the store)"
                                          : "");
  }
  socklen_t len = sizeof a;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& c : conns_)
      if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
  }
  data_.abort_waits();  // wakes blocked waits so their threads can finish
  for (auto& c : conns_) c.thread.join();
}

void TcpStoreServer::reap_finished() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (it->done) {
      it->thread.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpStoreServer::accept_loop() {
  while (!stopping_) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_) return;
      // out of file descriptors (EMFILE/ENFILE) or a transient error: the store keeps accepting, after a
      // pause in which silent and finished connections get closed
      if (errno != EINTR && errno != ECONNABORTED) std::this_thread::sleep_for(Millis(50));
      std::lock_guard<std::mutex> g(mu_);
      reap_finished();
      continue;
    }
    no_delay(fd);
    std::lock_guard<std::mutex> g(mu_);
    reap_finished();
    int silent = 0, trusted = 0;
    for (const Conn& c : conns_)
      if (!c.done && !c.evicted) (c.trusted ? trusted : silent)++;
    if (!token_.empty() && silent >= kMaxUnauthenticated) {
      for (Conn& c : conns_)  // accepted first, so the oldest silent one first
        if (!c.done && !c.evicted && !c.trusted) {
          c.evicted = true;
          evicted_++;
          ::shutdown(c.fd, SHUT_RDWR);  // its thread sees the end and closes it
          break;
        }
    }
    if (trusted >= kMaxConnections) {
      rejected_++;
      ::close(fd);
      continue;
    }
    accepted_++;
    conns_.emplace_back();
    Conn& c = conns_.back();
    c.fd = fd;
    c.thread = std::thread([this, &c, fd] {
      serve(fd, c.trusted);
      std::lock_guard<std::mutex> g(mu_);  // the destructor shuts down only fds still open
      ::close(fd);
      c.fd = -1;
      c.done = true;
    });
  }
}

void TcpStoreServer::serve(int fd, std::atomic<bool>& said_hello) {
  bool trusted = token_.empty();
  said_hello = trusted;
  const auto hello_by = trusted ? kNever : Clock::now() + hello_within_;
  const auto reply_by = [] { return Clock::now() + kMessageWithin; };
  std::vector<char> msg;
  while (!stopping_) {
    // a message taken out of held_ when served, and its buffer given back if it was a large one
    struct Release {
      std::atomic<uint64_t>& held;
      std::vector<char>& msg;
      uint64_t n = 0;
      ~Release() {
        if (msg.capacity() > (64u << 10)) std::vector<char>().swap(msg);
        held.fetch_sub(n);
      }
    };
    const uint32_t cap = trusted ? kMaxMessage : kMaxHello;
    const Got got = read_message(fd, msg, trusted ? kNever : hello_by, cap, &held_);
    if (got == Got::too_big)
      write_all(fd, refusal(trusted ? fmt::format("a message over {} bytes", kMaxMessage)
                                    : "a first message longer than a hello: this store needs the job's token first (DISTLAB_STORE_TOKEN)"),
                reply_by());
    if (got == Got::busy) write_all(fd, refusal(fmt::format("the store holds {} MiB of messages at once: try again", kMaxHeld >> 20)), reply_by());
    if (got != Got::ok) {
      if (got != Got::closed) rejected_++;
      return;
    }
    Release release{held_, msg, msg.size() > kMaxHello ? msg.size() : 0};
    Writer w;
    try {
      Reader r{msg};
      const uint8_t op = r.u8();
      if (!trusted && op != kHello) {
        rejected_++;
        write_all(fd, refusal("this store needs the job's token first (DISTLAB_STORE_TOKEN, set by distlab run)"), reply_by());
        return;
      }
      switch (op) {
        case kHello: {
          const std::string t = r.str(1024);
          r.end();
          if (!token_.empty() && !same_token(t, token_)) {
            rejected_++;
            write_all(fd, refusal("wrong token: this worker belongs to another job (DISTLAB_STORE_TOKEN)"), reply_by());
            return;
          }
          trusted = true;
          said_hello = true;
          w.u8(kOk);
          break;
        }
        case kSet: {
          std::string k = r.key();
          std::vector<char> v = r.bytes();
          r.end();
          data_.set(k, v);
          w.u8(kOk);
          break;
        }
        case kGet:
        case kWait: {
          const auto keys = r.keys(op == kGet);
          const Millis timeout = r.timeout();
          r.end();
          try {
            data_.wait(keys, timeout);
            w.u8(kOk);
            if (op == kGet) w.bytes(data_.get(keys[0]));
          } catch (const StoreError&) {
            if (stopping_) return;
            w.u8(kTimedOut);
          }
          break;
        }
        case kAdd: {
          std::string k = r.key();
          const int64_t delta = r.i64();
          r.end();
          try {
            const int64_t v = data_.add(k, delta);
            w.u8(kOk).i64(v);
          } catch (const StoreError& e) {  // the caller's mistake, answered; the connection stays
            w = Writer();
            w.u8(kRefused).str(e.what());
          }
          break;
        }
        case kCheck: {
          const auto keys = r.keys();
          r.end();
          w.u8(kOk).u8(data_.check(keys) ? 1 : 0);
          break;
        }
        default:
          throw Malformed(fmt::format("unknown request {}", int(op)));
      }
    } catch (const Malformed& e) {
      rejected_++;
      write_all(fd, refusal(std::string("malformed request: ") + e.what()), reply_by());
      return;
    }
    if (!write_all(fd, w.done(), reply_by())) return;
  }
}

// Nothing listens on `port` on any address of this machine (a bind of every address would fail).
static bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

std::unique_ptr<TcpStoreServer> serve_on_first_free(const std::string& host, const std::vector<int>& ports, const std::string& token,
                                                    bool next_free) {
  std::string taken;
  for (int p : ports) {
    if (!next_free || port_free(p + 1)) {
      try {
        return std::make_unique<TcpStoreServer>(host, p, token);
      } catch (const StoreError& e) {
        if (std::string(e.what()).find(std::strerror(EADDRINUSE)) == std::string::npos) throw;
      }
    }
    taken += fmt::format("{}{}", taken.empty() ? "" : ", ", p);
  }
  throw StoreError(fmt::format("every port this step may use is taken on this node: {}{}", taken, next_free ? " (or the port after each)" : ""),
                   "export MASTER_PORT=<a free port> before srun");
}

TcpStore::TcpStore(const std::string& host, int port, Millis timeout, const std::string& token) : Store(timeout), port_(port) {
  where_ = fmt::format("{}:{}", host, port);
  if (port < 1 || port > 65535)
    throw StoreError(fmt::format("the rendezvous store's port {} is not in 1..65535", port), "check MASTER_PORT / DISTLAB_STORE_PORT");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr = resolve_ipv4(host, "MASTER_ADDR");
  auto deadline = Clock::now() + timeout;
  for (int closed = 0;; closed++) {
    int last_errno = 0;
    for (;;) {
      fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
      last_errno = errno;
      ::close(fd_);
      fd_ = -1;
      if (Clock::now() > deadline) break;
      std::this_thread::sleep_for(Millis(20));
    }
    if (fd_ < 0)
      throw StoreError(fmt::format("cannot reach the rendezvous store at {} within {:.1f} s: {}", where_, timeout.count() / 1000.0,
                                   std::strerror(last_errno)),
                       "is the launcher (rank 0's node) running? check MASTER_ADDR and MASTER_PORT, and that the port is "
                       "open in the firewall");
    no_delay(fd_);
    if (token.empty()) return;
    try {
      request(Writer().u8(kHello).str(token).done(), timeout_);
      return;
    } catch (const StoreError& e) {
      // closed before the hello was answered: the store was full of connections that never said theirs (a
      // scan of MASTER_PORT, another program) and closed the oldest; this one connects again. A refusal
      // (a wrong token) is final
      if (std::string(e.what()).find("refused") != std::string::npos) throw;
      ::close(fd_);
      fd_ = -1;
      if (Clock::now() > deadline)
        throw StoreError(fmt::format("the rendezvous store at {} closed this worker's connection {} times before its hello was answered, "
                                     "for {:.1f} s", where_, closed + 1, timeout.count() / 1000.0),
                         "the store closes the oldest of its connections that have not said hello when over "
                         "256: something else keeps connecting to MASTER_PORT (a port scanner, another program); pick another port");
      std::this_thread::sleep_for(Millis(20));
    }
  }
}

bool TcpStore::try_port(const sockaddr_in& a, const std::string& token, Millis hello_within, std::string& why, bool& final_refusal) {
  final_refusal = false;
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    why = std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    return false;
  }
  no_delay(fd_);
  try {
    request(Writer().u8(kHello).str(token).done(), hello_within);
    return true;
  } catch (const StoreError& e) {
    final_refusal = std::string(e.what()).find("refused") != std::string::npos;
    why = final_refusal ? "another job's store (it refused this job's token)" : "no store's answer to the hello";
    ::close(fd_);
    fd_ = -1;
    return false;
  }
}

TcpStore::TcpStore(const std::string& host, const std::vector<int>& ports, Millis timeout, const std::string& token) : Store(timeout) {
  if (ports.empty() || token.empty())
    throw StoreError("a store on one of several ports needs the ports and the job's token", "core/comm/slurm.h: slurm_master_ports");
  for (int p : ports)
    if (p < 1 || p > 65535) throw StoreError(fmt::format("the rendezvous store's port {} is not in 1..65535", p), "check MASTER_PORT");
  const in_addr ip = resolve_ipv4(host, "MASTER_ADDR");
  // another program on a port may take the hello and never answer: a few seconds each, then the next port
  const Millis hello_within = std::min(timeout, Millis(3000));
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> why(ports.size());
  for (;;) {
    for (size_t k = 0; k < ports.size(); k++) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(uint16_t(ports[k]));
      a.sin_addr = ip;
      where_ = fmt::format("{}:{}", host, ports[k]);
      bool refused = false;
      if (try_port(a, token, hello_within, why[k], refused)) {
        port_ = ports[k];
        return;
      }
    }
    if (Clock::now() > deadline) {
      std::string tried;
      for (size_t k = 0; k < ports.size(); k++) tried += fmt::format("{}{}: {}", k ? "; " : "", ports[k], why[k]);
      throw StoreError(fmt::format("no store of this job on {} within {:.1f} s (ports {})", host, timeout.count() / 1000.0, tried),
                       "is rank 0's task running? with several jobs on a node, export MASTER_PORT=<a free port> before srun");
    }
    std::this_thread::sleep_for(Millis(20));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<char> TcpStore::request(const std::vector<char>& msg, Millis reply_within, uint8_t* status) {
  std::lock_guard<std::mutex> g(mu_);
  const auto deadline = Clock::now() + reply_within;
  std::vector<char> reply;
  if (!write_all(fd_, msg, deadline))
    throw StoreError(fmt::format("lost the connection to the rendezvous store at {}", where_),
                     "the launcher hosting it has exited: another rank probably failed first");
  const Got got = read_message(fd_, reply, deadline);
  if (got == Got::timed_out)
    throw StoreError(fmt::format("the rendezvous store at {} did not answer within {:.1f} s", where_, reply_within.count() / 1000.0),
                     "the launcher hosting it is stopped or overloaded: is it suspended (Ctrl-Z, SIGSTOP)?");
  if (got != Got::ok || reply.empty())
    throw StoreError(fmt::format("lost the connection to the rendezvous store at {}", where_),
                     "the launcher hosting it has exited: another rank probably failed first");
  if (uint8_t(reply[0]) == kRefused) {
    std::vector<char> body(reply.begin() + 1, reply.end());
    std::string why = "(no reason)";
    try {
      Reader r{body};
      why = r.str();
    } catch (const Malformed&) {
    }
    throw StoreError(fmt::format("the rendezvous store at {} refused a request: {}", where_, why),
                     "only the workers of the job that started the store may use it (distlab run sets DISTLAB_STORE_TOKEN)");
  }
  if (status) *status = uint8_t(reply[0]);
  reply.erase(reply.begin());
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) { request(Writer().u8(kSet).str(key).bytes(value).done(), timeout_); }

std::vector<char> TcpStore::get(const std::string& key) {
  uint8_t st = 0;
  auto reply = request(Writer().u8(kGet).i64(1).str(key).i64(timeout_.count()).done(), timeout_ + kReplySlack, &st);
  if (st != kOk) store_timeout({key}, timeout_, "store get at " + where_);
  try {
    Reader r{reply};
    return r.bytes();
  } catch (const Malformed&) {
    throw StoreError(fmt::format("a malformed reply from the rendezvous store at {}", where_), "is another program listening on that port?");
  }
}

void TcpStore::wait(const std::vector<std::string>& keys, const Millis& timeout) {
  Writer w;
  w.u8(kWait).i64(int64_t(keys.size()));
  for (const auto& k : keys) w.str(k);
  uint8_t st = 0;
  request(w.i64(timeout.count()).done(), timeout + kReplySlack, &st);
  if (st != kOk) {
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (!check({k})) missing.push_back(k);
    store_timeout(missing, timeout, "store wait at " + where_);
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto reply = request(Writer().u8(kAdd).str(key).i64(delta).done(), timeout_);
  if (reply.size() != 8) throw StoreError(fmt::format("a malformed reply from the rendezvous store at {}", where_));
  int64_t v;
  std::memcpy(&v, reply.data(), 8);
  return v;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  Writer w;
  w.u8(kCheck).i64(int64_t(keys.size()));
  for (const auto& k : keys) w.str(k);
  auto reply = request(w.done(), timeout_);
  return reply.size() == 1 && reply[0] == 1;
}

}  // namespace distlab
