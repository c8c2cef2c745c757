// The TCP rendezvous store. The server (hosted by `distlab run`, or by a test) keeps the keys; every rank
// holds one client connection. Each request and reply is one buffer written with one write() on a socket
// with TCP_NODELAY: Gloo's rendezvous does a dozen small round trips per rank, and Nagle's algorithm plus
// split writes made it 10-20x slower (225 ms instead of 12 ms for 2 ranks, measured here).
//
// The port is reachable by anything on the network it listens on, so the server trusts no byte: it binds
// the master address only (loopback for a one-node job), a client must first present the job's token
// (random, from the launcher, in DISTLAB_STORE_TOKEN), every message is size-capped and checked, a bad
// one is answered with an error and its connection closed, and a client that connects and says nothing
// is dropped after a few seconds. Wire format and limits: tcp_wire.h.
#pragma once
#include <netinet/in.h>

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/comm/store.h"

namespace distlab {

class TcpStoreServer {
 public:
  // Listens on host:port (port 0 picks a free one: see port()). host "0.0.0.0" listens on every address;
  // anything else must be an IPv4 address or a name of this machine. A non-empty token is required from
  // every client before any request.
  // A connection that has not sent its hello within `hello_within` (when a token is required) is closed:
  // 10 s, the launcher's; a test of that rule passes less.
  TcpStoreServer(const std::string& host, int port, std::string token = "", Millis hello_within = Millis(10000));
  ~TcpStoreServer();  // stops serving and closes every connection
  int port() const { return port_; }
  // connections served so far, and those closed for a bad message, a wrong token or silence (for tests)
  int64_t connections() const { return accepted_; }
  int64_t rejected() const { return rejected_; }
  // silent connections closed to make room for newer ones (past 256 that have not said hello)
  int64_t evicted() const { return evicted_; }

 private:
  struct Conn {
    int fd;
    std::thread thread;
    std::atomic<bool> done{false};
    std::atomic<bool> trusted{false};  // said its hello (or no token is needed)
    bool evicted = false;              // closed by the acceptor to make room (under mu_)
  };
  void accept_loop();
  void serve(int fd, std::atomic<bool>& said_hello);
  void reap_finished();  // joins the threads of closed connections (under mu_)
  int listen_fd_ = -1, port_ = 0;
  std::string token_;
  Millis hello_within_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> accepted_{0}, rejected_{0}, evicted_{0};
  std::atomic<uint64_t> held_{0};  // bytes of the messages being read and served, over every connection
  MemoryStore data_;
  std::mutex mu_;
  std::list<Conn> conns_;
  std::thread acceptor_;
};

// The store on the first of `ports` this machine can listen on at `host` (with `next_free`: whose next port
// is free too, the program's own), so that a job whose first port another job holds still starts. A bind
// that fails for another reason than a taken port is thrown as it is; all taken: StoreError listing them.
std::unique_ptr<TcpStoreServer> serve_on_first_free(const std::string& host, const std::vector<int>& ports, const std::string& token,
                                                    bool next_free);

class TcpStore : public Store {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start after us), and presents `token`.
  TcpStore(const std::string& host, int port, Millis timeout = Millis(300000), const std::string& token = "");
  // The store is on one of `ports`, and `token` tells it from another job's (a Slurm step's derived ports:
  // core/comm/slurm.h): each is tried in turn until one's store takes the token. A port nobody listens on,
  // another job's store (it refuses the token) or another program (no answer in a few seconds) is passed.
  TcpStore(const std::string& host, const std::vector<int>& ports, Millis timeout, const std::string& token);
  int port() const { return port_; }  // the port whose store took this client
  ~TcpStore() override;
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  // Sends one request and reads its reply within `reply_within`; throws StoreError for a lost
  // connection, a late reply or the server's error answer. Returns the reply after its status byte.
  std::vector<char> request(const std::vector<char>& msg, Millis reply_within, uint8_t* status = nullptr);
  // One try at host:port: connected and (with a token) greeted, or false with why in `why`. `hello_within`
  // bounds the wait for the hello's answer; `final_refusal` says a store refused the token.
  bool try_port(const sockaddr_in& a, const std::string& token, Millis hello_within, std::string& why, bool& final_refusal);
  std::string where_;
  int fd_ = -1, port_ = 0;
  std::mutex mu_;
};

}  // namespace distlab
