// ProcessGroup collectives with ranks as threads: every collective against a locally computed reference,
// on world sizes 1-4 and awkward sizes (0, 1, primes, not divisible by the world size).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <cstring>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>

#include "core/comm/errors.h"
#include "core/tensor/dtype.h"
#include "core/comm/tcp_store.h"
#include "dist_harness.h"

using namespace distlab;
using namespace distlab::testing;

namespace {
const std::vector<int64_t> kSizes = {0, 1, 2, 7, 13, 1000, 4099};
float value(int rank, int64_t i) { return float((rank + 1) * 1000 + i % 97) * 0.5f + float(i % 3) * 0.25f; }
}  // namespace

TEST_CASE("all_reduce sum, avg and max equal the reference", "[dist]") {
  for (int world = 1; world <= 4; world++) {
    run_ranks(world, [&](ProcessGroup& pg) {
      for (int64_t n : kSizes) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          std::vector<float> x(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; i++) x[size_t(i)] = value(pg.rank(), i);
          pg.all_reduce(x.data(), n, op);
          for (int64_t i = 0; i < n; i++) {
            double s = 0, m = -1e30;
            for (int r = 0; r < world; r++) {
              s += value(r, i);
              m = std::max(m, double(value(r, i)));
            }
            double want = op == ReduceOp::sum ? s : op == ReduceOp::avg ? s / world : m;
            if (std::abs(x[size_t(i)] - want) > 1e-3 * std::abs(want)) FAIL("all_reduce " << reduce_op_name(op) << " n=" << n << " world=" << world);
          }
        }
      }
    });
  }
}

TEST_CASE("reduce_scatter gives each rank the reduction of its slot", "[dist]") {
  // worlds 1..8; a pipeline segment of 7 floats, so that every size but 0..7 crosses segment boundaries
  ProcessGroupOptions tiny_segments;
  tiny_segments.segment_floats = 7;
  std::atomic<int64_t> checked{0};
  for (int world = 1; world <= 8; world++) {
    run_ranks(world, [&](ProcessGroup& pg) {
      for (int64_t n : world > 4 ? std::vector<int64_t>{0, 1, 7, 8, 13, 1000} : kSizes) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          std::vector<float> in(static_cast<size_t>(n * world)), out(static_cast<size_t>(n), -1.0f);
          for (int64_t i = 0; i < n * world; i++) in[size_t(i)] = value(pg.rank(), i);
          pg.reduce_scatter(out.data(), in.data(), n, op);
          for (int64_t i = 0; i < n; i++) {
            const int64_t g = pg.rank() * n + i;
            double s = 0, m = -1e30;
            for (int r = 0; r < world; r++) {
              s += value(r, g);
              m = std::max(m, double(value(r, g)));
            }
            double want = op == ReduceOp::sum ? s : op == ReduceOp::avg ? s / world : m;
            if (std::abs(out[size_t(i)] - want) > 1e-3 * std::abs(want)) FAIL("reduce_scatter n=" << n << " world=" << world);
            checked++;
          }
        }
      }
    }, tiny_segments);
  }
  // every element of every rank, for 3 ops: sizes summing to 5122 on worlds 1..4, to 1029 on worlds 5..8
  CHECK(checked == 3 * (5122 * (1 + 2 + 3 + 4) + 1029 * (5 + 6 + 7 + 8)));
}

TEST_CASE("all_gather and broadcast from every root", "[dist]") {
  for (int world = 1; world <= 4; world++) {
    run_ranks(world, [&](ProcessGroup& pg) {
      for (int64_t n : kSizes) {
        std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n * world));
        for (int64_t i = 0; i < n; i++) in[size_t(i)] = value(pg.rank(), i);
        pg.all_gather(out.data(), in.data(), n);
        for (int r = 0; r < world; r++)
          for (int64_t i = 0; i < n; i++) REQUIRE(out[size_t(r * n + i)] == value(r, i));
        for (int root = 0; root < world; root++) {
          std::vector<float> b(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; i++) b[size_t(i)] = value(pg.rank(), i);
          pg.broadcast(b.data(), n, root);
          for (int64_t i = 0; i < n; i++) REQUIRE(b[size_t(i)] == value(root, i));
        }
      }
      pg.barrier();
    });
  }
}

TEST_CASE("send and recv around a ring, in order, with tags", "[dist]") {
  for (int world = 2; world <= 4; world++) {
    run_ranks(world, [&](ProcessGroup& pg) {
      const int right = (pg.rank() + 1) % world, left = (pg.rank() + world - 1) % world;
      for (int64_t n : {int64_t(1), int64_t(13), int64_t(4099)}) {
        std::vector<float> mine(static_cast<size_t>(n)), got(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; i++) mine[size_t(i)] = value(pg.rank(), i);
        // even ranks send first, odd ranks receive first: no deadlock on any ring
        if (pg.rank() % 2 == 0) {
          pg.send(mine.data(), n, right, 3);
          pg.recv(got.data(), n, left, 3);
        } else {
          pg.recv(got.data(), n, left, 3);
          pg.send(mine.data(), n, right, 3);
        }
        for (int64_t i = 0; i < n; i++) REQUIRE(got[size_t(i)] == value(left, i));
      }
      auto c = pg.counters();
      CHECK(c["send"].bytes_sent == 4 * (1 + 13 + 4099));
      CHECK(c["recv"].bytes_received == 4 * (1 + 13 + 4099));
    });
  }
}

TEST_CASE("async collectives complete in order and can overlap compute", "[dist]") {
  run_ranks(3, [](ProcessGroup& pg) {
    std::vector<std::vector<float>> bufs(5, std::vector<float>(1000));
    std::vector<std::shared_ptr<Work>> works;
    for (int b = 0; b < 5; b++) {
      for (int i = 0; i < 1000; i++) bufs[size_t(b)][size_t(i)] = float(pg.rank() + b);
      works.push_back(pg.all_reduce_async(bufs[size_t(b)].data(), 1000, ReduceOp::sum));
    }
    for (auto& w : works) w->wait();
    for (int b = 0; b < 5; b++) CHECK(bufs[size_t(b)][999] == float(0 + 1 + 2 + 3 * b));
    CHECK(pg.sequence() == 5);
  });
}

TEST_CASE("counters: a ring all_reduce sends 2(n-1)/n of the buffer per rank", "[dist]") {
  for (int world = 1; world <= 4; world++) {
    run_ranks(world, [&](ProcessGroup& pg) {
      std::vector<float> x(1200, 1.0f);
      pg.all_reduce(x.data(), 1200);
      auto c = pg.counters()["all_reduce"];
      CHECK(c.calls == 1);
      CHECK(c.bytes_sent == 2 * (world - 1) * 1200 * 4 / world);
      std::vector<float> out(1200);
      pg.reduce_scatter(out.data(), x.data(), 1200 / world);
      CHECK(pg.counters()["reduce_scatter"].bytes_sent == (world - 1) * (1200 / world) * 4);
    });
  }
}

TEST_CASE("16 bits on the wire: reduce_scatter, all_reduce and all_gather in bf16 and fp16 are 16-bit results near the sum, for half the bytes", "[dist]") {
  // Every hop rounds what it passes on (NCCL's 16-bit ring), so the result is within about N roundings of the
  // exact sum: 2^-8 relative per hop in bf16, 2^-11 in fp16. All-gather rounds once and is exact for values
  // that are 16-bit already.
  ProcessGroupOptions tiny_segments;
  tiny_segments.segment_floats = 7;
  for (DType wire : {DType::bf16, DType::f16}) {
    const double per_hop = wire == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
    for (int world = 1; world <= 4; world++) {
      run_ranks(world, [&](ProcessGroup& pg) {
        for (int64_t n : kSizes) {
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
            auto want = [&](int64_t g) {
              double s = 0, m = -1e30;
              for (int r = 0; r < world; r++) {
                s += value(r, g);
                m = std::max(m, double(value(r, g)));
              }
              return op == ReduceOp::sum ? s : op == ReduceOp::avg ? s / world : m;
            };
            std::vector<float> in(static_cast<size_t>(n * world)), out(static_cast<size_t>(n));
            for (int64_t i = 0; i < n * world; i++) in[size_t(i)] = value(pg.rank(), i);
            pg.reduce_scatter(out.data(), in.data(), n, op, wire);
            std::vector<float> x(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; i++) x[size_t(i)] = value(pg.rank(), i);
            pg.all_reduce(x.data(), n, op, wire);
            for (int64_t i = 0; i < n; i++) {
              const double tol = (world + 1) * per_hop * std::abs(want(pg.rank() * n + i));
              if (std::abs(out[size_t(i)] - want(pg.rank() * n + i)) > tol) FAIL("reduce_scatter " << dtype_name(wire) << " n=" << n << " world=" << world);
              if (round_to(out[size_t(i)], wire) != out[size_t(i)]) FAIL("reduce_scatter's result is not a 16-bit value");
              if (std::abs(x[size_t(i)] - want(i)) > (world + 1) * per_hop * std::abs(want(i))) FAIL("all_reduce " << dtype_name(wire) << " n=" << n << " world=" << world);
            }
            // every rank holds the same all_reduce result
            std::vector<float> all(static_cast<size_t>(n * world));
            pg.all_gather(all.data(), x.data(), n);
            for (int r = 1; r < world; r++)
              for (int64_t i = 0; i < n; i++) REQUIRE(all[size_t(r * n + i)] == all[size_t(i)]);
          }
          std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n * world));
          for (int64_t i = 0; i < n; i++) in[size_t(i)] = round_to(value(pg.rank(), i), wire);
          pg.all_gather(out.data(), in.data(), n, wire);
          for (int r = 0; r < world; r++)
            for (int64_t i = 0; i < n; i++) REQUIRE(out[size_t(r * n + i)] == round_to(value(r, i), wire));
        }
        // half the bytes of f32 (all_reduce: two phases over chunks of ceil(n/N))
        pg.reset_counters();
        std::vector<float> x(1200, 1.0f), out(1200);
        pg.all_reduce(x.data(), 1200, ReduceOp::sum, wire);
        pg.reduce_scatter(out.data(), x.data(), 1200 / world, ReduceOp::sum, wire);
        pg.all_gather(x.data(), out.data(), 1200 / world, wire);
        CHECK(pg.counters()["all_reduce"].bytes_sent == 2 * (world - 1) * (1200 / world) * 2);
        CHECK(pg.counters()["reduce_scatter"].bytes_sent == (world - 1) * (1200 / world) * 2);
        CHECK(pg.counters()["all_gather"].bytes_sent == (world - 1) * (1200 / world) * 2);
      }, tiny_segments);
    }
  }
}

TEST_CASE("subgroups from lists of ranks", "[dist]") {
  run_ranks(4, [](ProcessGroup& pg) {
    std::vector<int> members = pg.rank() % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto sub = pg.new_group(members);
    CHECK(sub->size() == 2);
    CHECK(sub->rank() == pg.rank() / 2);
    CHECK(sub->global_ranks() == members);
    float x = float(pg.rank());
    sub->all_reduce(&x, 1);
    CHECK(x == float(pg.rank() % 2 == 0 ? 0 + 2 : 1 + 3));
    float y = 1.0f;
    pg.all_reduce(&y, 1);  // the parent group still works
    CHECK(y == 4.0f);
  });
  CHECK_THROWS_AS(run_ranks(2, [](ProcessGroup& pg) { pg.new_group({1 - pg.rank()}); }), CommError);
}

TEST_CASE("a collective that one rank never joins times out on the others, naming it", "[dist][failure]") {
  ProcessGroupOptions o;
  o.timeout = Millis(1500);
  auto t0 = std::chrono::steady_clock::now();
  auto errors = run_ranks_collect(2, [](ProcessGroup& pg) {
    float x[4096] = {};
    pg.all_reduce(x, 4096);
    if (pg.rank() == 0) pg.all_reduce(x, 4096);                             // the extra one
    else std::this_thread::sleep_for(std::chrono::milliseconds(3000));     // alive, but never joins
  }, o);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 8.0);
  REQUIRE(errors[0]);
  std::string m = message_of(errors[0]);
  CHECK_THAT(m, Catch::Contains("all_reduce #1") && Catch::Contains("4096 f32") && Catch::Contains("rank 0"));
  CHECK_THAT(m, Catch::Contains("arrived: 0") && Catch::Contains("missing: 1"));
  CHECK_FALSE(errors[1]);
}

TEST_CASE("a long run keeps a bounded number of store keys per group, and a timeout after thousands of collectives still names the missing rank", "[dist][failure]") {
  // 2500 collectives: more than kArrivalSlots, so every slot is reused; the extra one on rank 0 then finds
  // an older collective's note in rank 1's slot, which is not an arrival
  MemoryStore store(Millis(20000));
  ProcessGroupOptions o;
  o.timeout = Millis(1500);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; r++)
    ranks.emplace_back([&, r] {
      try {
        ProcessGroup pg(store, r, 2, o);
        float x = 1.0f;
        for (int i = 0; i < 2500; i++) pg.all_reduce(&x, 1);
        if (r == 0) pg.all_reduce(&x, 1);
        else std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      } catch (const Error& e) {
        errors[size_t(r)] = e.full();
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(store.size() <= size_t(2 * kArrivalSlots + 64));  // the arrivals' slots, and the rendezvous' few keys
  CHECK_THAT(errors[0], Catch::Contains("all_reduce #2500") && Catch::Contains("arrived: 0") && Catch::Contains("missing: 1"));
  CHECK(errors[1].empty());
}

TEST_CASE("an extra collective on rank 0 only: the timeout names what each rank called at that place", "[dist][failure]") {
  // Every rank arrives at #2, each with another call: rank 0's extra logging all_reduce and rank 1's next
  // step. Without fingerprints the ranks find out only at the timeout, which then says what each one called.
  ProcessGroupOptions o;
  o.timeout = Millis(1500);
  auto errors = run_ranks_collect(2, [](ProcessGroup& pg) {
    std::vector<float> grads(4096);
    float norm = 0;
    for (int step = 0; step < 2; step++) {
      pg.all_reduce(grads.data(), 4096);
      if (pg.rank() == 0) pg.all_reduce(&norm, 1);  // "log the norm" from rank 0 only
    }
  }, o);
  bool named = false;
  for (int r = 0; r < 2; r++) {
    if (!errors[size_t(r)]) continue;
    std::string m;
    try {
      std::rethrow_exception(errors[size_t(r)]);
    } catch (const Error& e) {
      m = e.full();
    }
    CHECK_THAT(m, Catch::Contains("arrived: 0, 1"));
    if (m.find("rank 0 called all_reduce of 1 f32") != std::string::npos &&
        m.find("rank 1 called all_reduce of 4096 f32") != std::string::npos && m.find("rank-dependent branch") != std::string::npos)
      named = true;
  }
  CHECK(named);
}

TEST_CASE("DISTLAB_DEBUG=detail: mismatched collectives fail at once naming both sides", "[dist][failure]") {
  ProcessGroupOptions o;
  o.fingerprints = true;
  o.timeout = Millis(5000);
  auto t0 = std::chrono::steady_clock::now();
  auto errors = run_ranks_collect(2, [](ProcessGroup& pg) {
    std::vector<float> x(4096);
    pg.all_reduce(x.data(), 10);  // #0 matches
    if (pg.rank() == 0) pg.all_reduce(x.data(), 4096);
    else pg.broadcast(x.data(), 10, 0);
  }, o);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 3.0);
  for (int r = 0; r < 2; r++) {
    REQUIRE(errors[size_t(r)]);
    std::string m = message_of(errors[size_t(r)]);
    CHECK_THAT(m, Catch::Contains("all_reduce #1 of 4096 f32") && Catch::Contains("broadcast #1 of 10 f32"));
  }
}

TEST_CASE("the TCP store: set, blocking get, add, wait, check, timeouts", "[dist][store]") {
  TcpStoreServer server("127.0.0.1", 0);
  REQUIRE(server.port() > 0);
  TcpStore a("127.0.0.1", server.port(), Millis(2000)), b("127.0.0.1", server.port(), Millis(2000));
  a.set_string("k", "v");
  CHECK(b.get_string("k") == "v");
  CHECK(a.add("n", 2) == 2);
  CHECK(b.add("n", 3) == 5);
  CHECK(a.check({"k", "n"}));
  CHECK_FALSE(a.check({"k", "nope"}));
  std::thread later([&] {
    std::this_thread::sleep_for(Millis(200));
    b.set_string("late", "x");
  });
  CHECK(a.get_string("late") == "x");  // blocked until set
  later.join();
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(a.wait({"never"}, Millis(300)), Catch::Contains("never") && Catch::Contains("timed out"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  CHECK_THROWS_AS(TcpStore("127.0.0.1", 1, Millis(200)), StoreError);  // nothing listens there
}

TEST_CASE("Gloo rendezvous through the TCP store", "[dist][store]") {
  TcpStoreServer server("127.0.0.1", 0);
  std::vector<std::thread> ts;
  std::vector<float> results(3);
  for (int r = 0; r < 3; r++)
    ts.emplace_back([&, r] {
      TcpStore s("127.0.0.1", server.port(), Millis(10000));
      ProcessGroup pg(s, r, 3);
      float x = float(r + 1);
      pg.all_reduce(&x, 1);
      results[size_t(r)] = x;
    });
  for (auto& t : ts) t.join();
  CHECK(results == std::vector<float>{6, 6, 6});
}

namespace {

// A client that speaks the store's wire format by hand (core/comm/tcp_store.cpp), to send what TcpStore
// never would.
struct RawClient {
  int fd = -1;
  explicit RawClient(int port) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~RawClient() { close(fd); }
  void send_bytes(const std::string& b) { REQUIRE(::send(fd, b.data(), b.size(), MSG_NOSIGNAL) == ssize_t(b.size())); }
  static std::string u32(uint32_t v) { return std::string(reinterpret_cast<char*>(&v), 4); }
  static std::string i64(int64_t v) { return std::string(reinterpret_cast<char*>(&v), 8); }
  static std::string str(const std::string& s) { return u32(uint32_t(s.size())) + s; }
  void message(const std::string& body) { send_bytes(u32(uint32_t(body.size())) + body); }
  // The reply's status byte (0 ok, 1 timed out, 2 refused), -1 when the server closed without a reply, -2 when
  // nothing came within `ms`.
  int reply(int ms = 5000, std::string* rest = nullptr) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return -2;
    char len[4];
    if (recv(fd, len, 4, MSG_WAITALL) != 4) return -1;
    uint32_t n;
    std::memcpy(&n, len, 4);
    std::string body(n, '\0');
    if (n && recv(fd, body.data(), n, MSG_WAITALL) != ssize_t(n)) return -1;
    if (rest) *rest = body.substr(1);
    return n ? uint8_t(body[0]) : -1;
  }
  bool closed_by_server(int ms = 5000) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return false;
    char c;
    return recv(fd, &c, 1, 0) == 0;
  }
};

}  // namespace

// This process's resident memory (the store's server runs in it), in MiB.
double rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

TEST_CASE("the TCP store's memory is bounded: 1,000 clients announcing 16 MiB before the token, 64 with it", "[dist][store]") {
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = std::max<rlim_t>(nofile.rlim_cur, std::min<rlim_t>(nofile.rlim_max, 8192));
  setrlimit(RLIMIT_NOFILE, &nofile);
  REQUIRE(nofile.rlim_cur >= 2200);  // 1,000 clients and the server's 1,000 ends
  TcpStoreServer server("127.0.0.1", 0, "s3cret");
  const int port = server.port();
  const double before = rss_mib();
  {
    // before the token only a hello (2 KiB) may come: a 16 MiB length is refused before anything is allocated
    std::vector<std::unique_ptr<RawClient>> idle;
    for (int i = 0; i < 1000; i++) {
      idle.push_back(std::make_unique<RawClient>(port));
      idle.back()->send_bytes(RawClient::u32(16u << 20) + std::string(4096, 'x'));
    }
    for (int ms = 0; ms < 20000 && server.rejected() < 1000; ms += 50) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(server.rejected() >= 1000);
    INFO(rss_mib() - before << " MiB more");
    WARN(fmt::format("1,000 clients announcing 16 MiB before the token: the store grew {:.1f} MiB", rss_mib() - before));
    CHECK(rss_mib() - before < 64);  // was 3.4 GB with 300 such clients
  }
  {
    // with the token, at most 256 MiB of messages at once over every connection: the rest are told "busy"
    std::vector<std::unique_ptr<RawClient>> big;
    int busy = 0;
    for (int i = 0; i < 64; i++) {
      big.push_back(std::make_unique<RawClient>(port));
      big.back()->message(std::string(1, '\x06') + RawClient::str("s3cret"));
      std::string why;
      const int status = big.back()->reply(5000, &why);
      INFO(why);
      REQUIRE(status == 0);
      // a 16 MiB set that never ends (a refused one is closed by the server: the send may stop short)
      const std::string part = RawClient::u32(16u << 20) + std::string(1 << 20, 'v');
      [[maybe_unused]] const ssize_t sent = ::send(big.back()->fd, part.data(), part.size(), MSG_NOSIGNAL);
    }
    for (auto& c : big) {
      std::string why;
      if (c->reply(200, &why) == 2 && why.find("try again") != std::string::npos) busy++;
    }
    INFO(rss_mib() - before << " MiB more");
    WARN(fmt::format("64 clients with the token, 16 MiB messages: {} told busy, the store grew {:.1f} MiB", busy, rss_mib() - before));
    CHECK(busy >= 64 - 16);  // 16 x 16 MiB fill the 256 MiB
    CHECK(rss_mib() - before < 256 + 64);
  }
  TcpStore ok("127.0.0.1", port, Millis(5000), "s3cret");  // and it serves on
  ok.set_string("k", "v");
  CHECK(ok.get_string("k") == "v");
}

TEST_CASE("the TCP store serves 4 ranks beside 10,000 idle connections: the oldest silent ones make room", "[dist][store]") {
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_max = std::max<rlim_t>(nofile.rlim_max, 16384);  // root may raise it; elsewhere the hard limit stands
  nofile.rlim_cur = std::max<rlim_t>(nofile.rlim_cur, std::min<rlim_t>(nofile.rlim_max, 16384));
  setrlimit(RLIMIT_NOFILE, &nofile);
  getrlimit(RLIMIT_NOFILE, &nofile);
  REQUIRE(nofile.rlim_cur >= 10400);  // this test's 10,000 ends (the server keeps 256 of its own)
  TcpStoreServer server("127.0.0.1", 0, "s3cret");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(server.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // before: 1,030 of these, opened before the ranks connected, failed the job's rendezvous
  std::vector<int> idle;
  for (int i = 0; i < 10000; i++) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      continue;
    }
    idle.push_back(fd);
  }
  CHECK(idle.size() == 10000);
  std::vector<std::thread> ranks;
  std::atomic<int> ok{0};
  std::string failure;
  std::mutex mu;
  for (int r = 0; r < 4; r++)
    ranks.emplace_back([&, r] {
      try {
        TcpStore store("127.0.0.1", server.port(), Millis(20000), "s3cret");
        store.set_string("addr/" + std::to_string(r), "rank " + std::to_string(r));
        for (int q = 0; q < 4; q++)
          if (store.get_string("addr/" + std::to_string(q)) != "rank " + std::to_string(q)) throw std::runtime_error("wrong value");
        ok++;
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(mu);
        failure = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  INFO(failure);
  CHECK(ok == 4);
  INFO(fmt::format("10,000 idle connections: {} closed to make room, {} served", server.evicted(), server.connections()));
  CHECK(server.evicted() >= 10000 - 256);
  for (int fd : idle) close(fd);
}

TEST_CASE("the TCP store answers garbage with errors, closes bad connections and keeps serving", "[dist][store]") {
  TcpStoreServer server("127.0.0.1", 0, "s3cret", Millis(1500));  // silent connections closed after 1.5 s (the launcher's: 10 s)
  const int port = server.port();
  const std::string hello = std::string(1, '\x06') + RawClient::str("s3cret");
  std::string why;
  SECTION("no token, a wrong token") {
    RawClient a(port);
    a.message(std::string(1, '\x01') + RawClient::str("k") + RawClient::str("v"));  // set without hello
    CHECK(a.reply(5000, &why) == 2);
    CHECK_THAT(why, Catch::Contains("token"));
    CHECK(a.closed_by_server());
    RawClient b(port);
    b.message(std::string(1, '\x06') + RawClient::str("guess"));
    CHECK(b.reply() == 2);
    CHECK(b.closed_by_server());
    CHECK_THROWS_WITH(TcpStore("127.0.0.1", port, Millis(2000), "guess"), Catch::Contains("wrong token"));
    TcpStore no_token("127.0.0.1", port, Millis(2000));
    CHECK_THROWS_WITH(no_token.set_string("k", "v"), Catch::Contains("needs the job's token"));
  }
  SECTION("zero keys, too many keys, negative timeouts, unknown opcodes, trailing bytes") {
    for (const std::string& bad : {std::string(1, '\x02') + RawClient::i64(0) + RawClient::i64(100),        // get of no key
                                   std::string(1, '\x03') + RawClient::i64(0) + RawClient::i64(100),        // wait for no key
                                   std::string(1, '\x03') + RawClient::i64(1 << 20) + RawClient::i64(100),  // a million keys
                                   std::string(1, '\x02') + RawClient::i64(2) + RawClient::str("a") + RawClient::str("b") + RawClient::i64(1),
                                   std::string(1, '\x03') + RawClient::i64(1) + RawClient::str("a") + RawClient::i64(-5),
                                   std::string(1, '\x09'),                                                   // no such request
                                   std::string(1, '\x05') + RawClient::i64(1) + RawClient::str("a") + "junk",
                                   std::string(1, '\x01') + RawClient::str(std::string(5000, 'k')) + RawClient::str("v"),
                                   std::string(1, '\x01') + RawClient::u32(0xFFFFFFF0u),                    // a field past the end
                                   std::string()}) {                                                         // an empty message
      RawClient c(port);
      c.message(hello);
      REQUIRE(c.reply() == 0);
      c.message(bad);
      CHECK(c.reply(5000, &why) == 2);
      CHECK_THAT(why, Catch::Contains("malformed"));
      CHECK(c.closed_by_server());
    }
  }
  SECTION("a 4 GiB length prefix is refused without allocating it") {
    RawClient c(port);
    c.message(hello);
    REQUIRE(c.reply() == 0);
    c.send_bytes(RawClient::u32(0xFFFFFFFFu));
    CHECK(c.reply(5000, &why) == 2);
    CHECK_THAT(why, Catch::Contains("over"));
  }
  SECTION("add on a text key is the caller's error; the connection stays") {
    TcpStore s("127.0.0.1", port, Millis(2000), "s3cret");
    s.set_string("text", "hello");
    CHECK_THROWS_WITH(s.add("text", 1), Catch::Contains("not an integer") && Catch::Contains("text"));
    CHECK(s.add("counter", 2) == 2);  // the same connection still works
    s.set_string("big", std::to_string(INT64_MAX));
    CHECK_THROWS_WITH(s.add("big", 1), Catch::Contains("overflows"));
  }
  SECTION("a silent client and a half message are dropped; many of them don't stop the store") {
    std::vector<std::unique_ptr<RawClient>> silent;
    for (int i = 0; i < 200; i++) silent.push_back(std::make_unique<RawClient>(port));
    RawClient half(port);
    half.message(hello);
    REQUIRE(half.reply() == 0);
    half.send_bytes(RawClient::u32(100) + "0123456789");  // and nothing more
    TcpStore s("127.0.0.1", port, Millis(5000), "s3cret");  // a worker among them is served at once
    s.set_string("k", "v");
    CHECK(s.get_string("k") == "v");
    CHECK(silent[0]->closed_by_server(15000));  // after the server's 1.5 s
    int closed = 0;
    for (auto& c : silent) closed += c->closed_by_server(5000);
    CHECK(closed == 200);
    CHECK(server.rejected() >= 200);  // each was counted before its close
  }
  // whatever came before, a well-behaved client is served
  TcpStore good("127.0.0.1", port, Millis(2000), "s3cret");
  good.set_string("after", "ok");
  CHECK(good.get_string("after") == "ok");
}

TEST_CASE("the TCP store listens on the address it is given, not everywhere", "[dist][store]") {
  TcpStoreServer server("127.0.0.1", 0);
  CHECK_THROWS_WITH(TcpStoreServer("192.0.2.1", 0), Catch::Contains("cannot listen on 192.0.2.1"));  // not an address of ours
  CHECK_THROWS_WITH(TcpStoreServer("127.0.0.1", 70000), Catch::Contains("70000"));
  sockaddr_in a{};
  socklen_t len = sizeof a;
  // the listening socket is not inherited by exec'd children (SOCK_CLOEXEC): checked through /proc
  bool found_cloexec = false;
  for (int fd = 3; fd < 256; fd++) {
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && a.sin_family == AF_INET && ntohs(a.sin_port) == server.port() &&
        a.sin_addr.s_addr == htonl(INADDR_LOOPBACK)) {
      found_cloexec = (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0;
      break;
    }
    len = sizeof a;
  }
  CHECK(found_cloexec);
}
