// The TCP rendezvous store. The server (hosted by `distlab run`, or by a test) keeps the keys; every rank
// holds one client connection. Each request and reply is one buffer written with one write() on a socket
// with TCP_NODELAY: Gloo's rendezvous does a dozen small round trips per rank, and Nagle's algorithm plus
// split writes made it 10-20x slower (225 ms instead of 12 ms for 2 ranks, measured here).
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/dist/store.h"

namespace distlab {

class TcpStoreServer {
 public:
  // Listens on host:port (port 0 picks a free one: see port()). host "" or "0.0.0.0" listens everywhere.
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();  // stops serving and closes every connection
  int port() const { return port_; }

 private:
  void accept_loop();
  void serve(int fd);
  int listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stopping_{false};
  MemoryStore data_;
  std::mutex mu_;
  std::vector<int> client_fds_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

class TcpStore : public Store {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start after us).
  TcpStore(const std::string& host, int port, Millis timeout = Millis(300000));
  ~TcpStore() override;
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  std::vector<char> request(const std::vector<char>& msg);
  std::string where_;
  int fd_ = -1;
  std::mutex mu_;
};

}  // namespace distlab
