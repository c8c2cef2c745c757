// The TCP store's server (core/comm/tcp_store.h): one thread accepts, one per connection serves its
// requests against an in-memory store, and no byte from the network is trusted (the limits: tcp_wire.h).
// Read next: core/comm/tcp_wire.cpp (how a message is read and written).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/comm/errors.h"
#include "core/comm/tcp_store.h"
#include "core/comm/tcp_wire.h"

namespace distlab {

using namespace store_wire;

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

}  // namespace distlab
