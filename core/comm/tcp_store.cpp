// The TCP store's client (core/comm/tcp_store.h): one connection per rank, a hello with the job's token,
// then one request and one reply at a time. The wire and its limits: tcp_wire.h; the server:
// tcp_store_server.cpp.
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
#include "core/comm/tcp_wire.h"

namespace distlab {

using namespace store_wire;

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
