#include "core/dist/tcp_store.h"

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

#include "core/dist/errors.h"

namespace distlab {

namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCheck = 5 };

// Messages: u32 length, then the payload. Strings are u32 length + bytes; integers are 8 bytes.
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
    if (pos + n > buf.size()) throw StoreError("malformed rendezvous store message", "are two different programs using the same port?");
  }
  uint8_t u8() { need(1); return uint8_t(buf[pos++]); }
  int64_t i64() { need(8); int64_t v; std::memcpy(&v, &buf[pos], 8); pos += 8; return v; }
  std::vector<char> bytes() {
    need(4);
    uint32_t n;
    std::memcpy(&n, &buf[pos], 4);
    pos += 4;
    need(n);
    std::vector<char> v(buf.begin() + long(pos), buf.begin() + long(pos + n));
    pos += n;
    return v;
  }
  std::string str() { auto v = bytes(); return std::string(v.begin(), v.end()); }
};

bool write_all(int fd, const std::vector<char>& m) {
  size_t off = 0;
  while (off < m.size()) {
    ssize_t n = ::send(fd, m.data() + off, m.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

bool read_all(int fd, char* p, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::recv(fd, p + off, n - off, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    off += size_t(r);
  }
  return true;
}

bool read_message(int fd, std::vector<char>& out) {
  uint32_t n;
  if (!read_all(fd, reinterpret_cast<char*>(&n), 4)) return false;
  out.resize(n);
  return n == 0 || read_all(fd, out.data(), n);
}

void no_delay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port) : data_(Millis(0)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!host.empty() && host != "0.0.0.0" && inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 128) != 0) {
    int e = errno;
    ::close(listen_fd_);
    throw StoreError(fmt::format("cannot listen on port {}: {}", port, std::strerror(e)),
                     e == EADDRINUSE ? "another job holds this port: pick another --master-port, or 0 for a free one" : "");
  }
  socklen_t len = sizeof a;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  acceptor_.join();
  {
    std::lock_guard<std::mutex> g(mu_);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  data_.abort_waits();  // wakes blocked waits so their threads can finish
  for (auto& t : threads_) t.join();
}

void TcpStoreServer::accept_loop() {
  while (!stopping_) {
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    no_delay(fd);
    std::lock_guard<std::mutex> g(mu_);
    client_fds_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void TcpStoreServer::serve(int fd) {
  std::vector<char> msg;
  while (!stopping_ && read_message(fd, msg)) {
    try {
      Reader r{msg};
      Writer w;
      switch (r.u8()) {
        case kSet: {
          std::string k = r.str();
          data_.set(k, r.bytes());
          w.u8(0);
          break;
        }
        case kGet:
        case kWait: {
          int64_t n = r.i64();
          std::vector<std::string> keys;
          for (int64_t i = 0; i < n; i++) keys.push_back(r.str());
          Millis timeout(r.i64());
          try {
            data_.wait(keys, timeout);
            w.u8(0);
            if (msg[0] == kGet) w.bytes(data_.get(keys[0]));
          } catch (const StoreError&) {
            if (stopping_) return;
            w.u8(1);
          }
          break;
        }
        case kAdd: {
          std::string k = r.str();
          w.i64(data_.add(k, r.i64()));
          break;
        }
        case kCheck: {
          int64_t n = r.i64();
          std::vector<std::string> keys;
          for (int64_t i = 0; i < n; i++) keys.push_back(r.str());
          w.u8(data_.check(keys) ? 1 : 0);
          break;
        }
        default: return;
      }
      if (!write_all(fd, w.done())) return;
    } catch (const Error&) {
      return;  // a malformed message: drop the connection
    }
  }
}

TcpStore::TcpStore(const std::string& host, int port, Millis timeout) : Store(timeout) {
  where_ = fmt::format("{}:{}", host, port);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw StoreError(fmt::format("cannot resolve the rendezvous host '{}'", host), "check MASTER_ADDR");
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int last_errno = 0;
  for (;;) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd_, res->ai_addr, res->ai_addrlen) == 0) break;
    last_errno = errno;
    ::close(fd_);
    fd_ = -1;
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(Millis(20));
  }
  freeaddrinfo(res);
  if (fd_ < 0)
    throw StoreError(fmt::format("cannot reach the rendezvous store at {} within {:.1f} s: {}", where_, timeout.count() / 1000.0,
                                 std::strerror(last_errno)),
                     "is the launcher (rank 0's node) running? check MASTER_ADDR and MASTER_PORT, and that the port is "
                     "open in the firewall");
  no_delay(fd_);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<char> TcpStore::request(const std::vector<char>& msg) {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<char> reply;
  if (!write_all(fd_, msg) || !read_message(fd_, reply))
    throw StoreError(fmt::format("lost the connection to the rendezvous store at {}", where_),
                     "the launcher hosting it has exited: another rank probably failed first");
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) { request(Writer().u8(kSet).str(key).bytes(value).done()); }

std::vector<char> TcpStore::get(const std::string& key) {
  auto reply = request(Writer().u8(kGet).i64(1).str(key).i64(timeout_.count()).done());
  Reader r{reply};
  if (r.u8() != 0) store_timeout({key}, timeout_, "store get at " + where_);
  return r.bytes();
}

void TcpStore::wait(const std::vector<std::string>& keys, const Millis& timeout) {
  Writer w;
  w.u8(kWait).i64(int64_t(keys.size()));
  for (const auto& k : keys) w.str(k);
  auto reply = request(w.i64(timeout.count()).done());
  Reader r{reply};
  if (r.u8() != 0) {
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (!check({k})) missing.push_back(k);
    store_timeout(missing, timeout, "store wait at " + where_);
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto reply = request(Writer().u8(kAdd).str(key).i64(delta).done());
  Reader r{reply};
  return r.i64();
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  Writer w;
  w.u8(kCheck).i64(int64_t(keys.size()));
  for (const auto& k : keys) w.str(k);
  auto reply = request(w.done());
  Reader r{reply};
  return r.u8() == 1;
}

}  // namespace distlab
