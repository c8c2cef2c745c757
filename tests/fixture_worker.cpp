// A small worker for launcher and failure tests: joins the job like distlab train does, then misbehaves
// the way argv[1] says.
//   ok             one all_reduce, prints the sum, exits 0
//   extra          rank 0 calls one more all_reduce than the others (a hang without timeouts)
//   mismatch       rank 0 calls all_reduce, rank 1 broadcast, as collective #1
//   fail-rank R    rank R prints a line and exits 3 after the first all_reduce; the others wait in the next
//   flaky FILE     fails on the first attempt (when FILE doesn't exist yet, it creates it), then succeeds
//   op-mismatch, root-mismatch, size-mismatch   the ranks disagree on a collective's op, root or size
//   stop-self R    rank R stops itself (SIGSTOP) after the first all_reduce; the others call another
//   fuzz-store     rank 0 throws garbage at the job's store (random bytes, no token, half messages, 300
//                  silent connections) while both ranks run 50 all_reduces and store round trips; then a
//                  fresh client must still be served
//   sleep          sleeps 60 s
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <atomic>

#include "core/comm/env.h"
#include "core/comm/errors.h"
#include "core/comm/error_file.h"
#include "core/comm/process_group.h"
#include "core/comm/tcp_store.h"
#include "core/comm/watchdog.h"

using namespace distlab;

namespace {

// A connection to the store that finishes within 1 s or not at all (a full backlog drops SYNs).
int connect_within(const std::string& host, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  if (poll(&p, 1, 1000) != 1) {
    close(fd);
    return -1;
  }
  return fd;
}

void fuzz_store(const LaunchEnv& env, std::atomic<int64_t>& sent) {
  uint64_t seed = 12345;
  auto next = [&] { return seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; };
  auto blast = [&](const std::string& bytes) {
    int fd = connect_within(env.master_addr, env.store_port);
    if (fd < 0) return;
    [[maybe_unused]] ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    sent++;
    close(fd);
  };
  auto u32 = [](uint32_t v) { return std::string(reinterpret_cast<char*>(&v), 4); };
  for (int i = 0; i < 200; i++) {  // random bytes, random lengths
    std::string b(next() % 4096 + 1, '\0');
    for (auto& c : b) c = char(next() >> 56);
    blast(b);
  }
  blast(u32(0xFFFFFFFFu) + "x");                              // a 4 GiB length
  blast(u32(17) + std::string(1, '\x02') + std::string(16, '\0'));  // a get of zero keys, no token
  blast(u32(1) + std::string(1, '\x09'));                       // an unknown request
  blast(u32(100) + "half");                                    // half a message
  std::vector<int> silent;                                     // connections that never say anything
  for (int i = 0; i < 300; i++) {
    int fd = connect_within(env.master_addr, env.store_port);
    if (fd >= 0) silent.push_back(fd);
  }
  sent += int64_t(silent.size());
  std::this_thread::sleep_for(std::chrono::seconds(2));
  for (int fd : silent) close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  install_terminate_handler();
  try {
    LaunchEnv env = read_launch_env();
    const char* t = std::getenv("FIXTURE_TIMEOUT_MS");
    Millis timeout(t ? std::atoi(t) : 3000);
    LauncherWatchdog watchdog(env.launcher_pid, timeout, fmt::format("rank {}", env.rank));
    TcpStore store(env.master_addr, env.store_port, timeout, env.store_token);
    ProcessGroupOptions o = options_from_env(timeout);
    ProcessGroup pg(store, env.rank, env.world_size, o);
    float x[4096];
    for (auto& v : x) v = float(env.rank + 1);
    pg.all_reduce(x, 4096);
    std::cout << fmt::format("rank {} of {}: sum {}", env.rank, env.world_size, x[0]) << std::endl;
    if (mode == "extra") {
      if (env.rank == 0) pg.all_reduce(x, 4096);
      else std::this_thread::sleep_for(std::chrono::seconds(30));  // alive but never joins
    } else if (mode == "mismatch") {
      if (env.rank == 0) pg.all_reduce(x, 4096);
      else pg.broadcast(x, 10, 0);
    } else if (mode == "fail-rank") {
      if (env.rank == std::atoi(argv[2])) {
        std::cout << "about to fail on purpose" << std::endl;
        return 3;
      }
      pg.all_reduce(x, 4096);
    } else if (mode == "flaky") {
      if (env.rank == 0 && !std::filesystem::exists(argv[2])) {
        std::ofstream(argv[2]) << "attempt 1 failed\n";
        std::cout << "first attempt fails" << std::endl;
        return 5;
      }
      pg.barrier();
    } else if (mode == "op-mismatch") {  // rank 0 sums, rank 1 takes the max
      pg.all_reduce(x, 4096, env.rank == 0 ? ReduceOp::sum : ReduceOp::max);
    } else if (mode == "root-mismatch") {  // each rank believes it is the root
      pg.broadcast(x, 4096, env.rank);
    } else if (mode == "size-mismatch") {  // rank 1 reduces fewer elements
      pg.all_reduce(x, env.rank == 0 ? 4096 : 1000);
    } else if (mode == "stop-self") {
      if (env.rank == std::atoi(argv[2])) {
        std::cout << "stopping myself" << std::endl;
        raise(SIGSTOP);
      }
      pg.all_reduce(x, 4096);
    } else if (mode == "fuzz-store") {
      rlimit l;  // our own soft limit may be low (the test lowers the launcher's): take the hard one
      getrlimit(RLIMIT_NOFILE, &l);
      l.rlim_cur = l.rlim_max;
      setrlimit(RLIMIT_NOFILE, &l);
      std::atomic<int64_t> sent{0};
      std::thread fuzz;
      if (env.rank == 0) fuzz = std::thread([&] { fuzz_store(env, sent); });
      for (int i = 0; i < 50; i++) {
        for (auto& v : x) v = float(env.rank + i);
        pg.all_reduce(x, 4096);
        if (x[0] != float(2 * i + 1)) throw CommError(fmt::format("all_reduce {} gave {}", i, x[0]));
        store.set_string(fmt::format("fuzz/{}/{}", env.rank, i), "v");
        if (store.get_string(fmt::format("fuzz/{}/{}", 1 - env.rank, i)) != "v") throw StoreError("lost a key");
      }
      if (fuzz.joinable()) fuzz.join();
      // the store still accepts: a fresh client (its connect retries while silent ones are dropped)
      TcpStore fresh(env.master_addr, env.store_port, Millis(30000), env.store_token);
      fresh.set_string(fmt::format("fresh/{}", env.rank), "ok");
      fresh.wait({"fresh/0", "fresh/1"});
      pg.barrier();
      std::cout << fmt::format("rank {}: fuzz-store done, {} hostile connections", env.rank, sent.load()) << std::endl;
    } else if (mode == "sleep") {
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
  } catch (const std::exception& e) {
    std::cerr << "fixture: " << e.what() << std::endl;
    record_worker_error(e);
    return 1;
  }
  return 0;
}
