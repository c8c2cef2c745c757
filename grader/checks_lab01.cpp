// Lab 01's checks: the student's ring collectives against the engine's built-in ones, their traffic
// against the bandwidth-optimal 2(N−1)/N·S, and their modeled time against the ring formula.
#include <dlfcn.h>
#include <fmt/format.h>

#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "core/dist/errors.h"
#include "core/perf/cost_model.h"
#include "core/perf/hardware.h"
#include "grader/check.h"
#include "labs/01-collectives/api.h"

namespace distlab::grader {

namespace {

const std::vector<int> kWorlds = {2, 3, 4};
const std::vector<int64_t> kSizes = {0, 1, 7, 1000, (1 << 20) + 3};

float value(int rank, int64_t i) { return float((rank + 1) * 3 + i % 11) * 0.25f; }

// Runs fn on `world` thread ranks; the first failure (rank order) is rethrown.
void on_ranks(int world, const std::function<void(ProcessGroup&)>& fn) {
  MemoryStore store(Millis(10000));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  ProcessGroupOptions o;
  o.timeout = Millis(10000);
  o.track_arrivals = false;
  for (int r = 0; r < world; r++)
    ts.emplace_back([&, r] {
      try {
        ProcessGroup pg(store, r, world, o);
        fn(pg);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

const Lab01Api& api(void* h) { return *static_cast<Lab01Api*>(plugin_symbol(h, "distlab_lab01")); }

// Compares the student's op with the engine's on every world size and size; the first mismatch fails.
CheckResult compare(void* h, const std::string& op) {
  const Lab01Api& a = api(h);
  for (int world : kWorlds) {
    for (int64_t n : kSizes) {
      std::string bad;
      std::mutex mu;
      on_ranks(world, [&](ProcessGroup& pg) {
        const int r = pg.rank();
        std::vector<float> in, ours, ref;
        if (op == "all_reduce") {
          in.resize(size_t(n));
          for (int64_t i = 0; i < n; i++) in[size_t(i)] = value(r, i);
          ours = in;
          ref = in;
          a.all_reduce(pg, ours.data(), n);
          pg.all_reduce(ref.data(), n);
        } else if (op == "all_gather") {
          in.resize(size_t(n));
          for (int64_t i = 0; i < n; i++) in[size_t(i)] = value(r, i);
          ours.assign(size_t(n * world), -1.0f);
          ref = ours;
          a.all_gather(pg, ours.data(), in.data(), n);
          pg.all_gather(ref.data(), in.data(), n);
        } else {
          in.resize(size_t(n * world));
          for (int64_t i = 0; i < n * world; i++) in[size_t(i)] = value(r, i);
          ours.assign(size_t(n), -1.0f);
          ref = ours;
          a.reduce_scatter(pg, ours.data(), in.data(), n);
          pg.reduce_scatter(ref.data(), in.data(), n);
        }
        for (size_t i = 0; i < ref.size(); i++)
          if (std::abs(ours[i] - ref[i]) > 1e-5f * std::max(1.0f, std::abs(ref[i]))) {
            std::lock_guard<std::mutex> g(mu);
            if (bad.empty()) bad = fmt::format("rank {} element {}: {} instead of {}", r, i, ours[i], ref[i]);
            break;
          }
      });
      if (!bad.empty())
        return {false, fmt::format("the built-in {} result on {} ranks, {} elements", op, world, n), bad, ""};
    }
  }
  return {true, "", "", ""};
}

// Bytes each rank sends in one all_reduce of S bytes, read from the process group's send counters.
CheckResult traffic(void* h) {
  const Lab01Api& a = api(h);
  for (int world : kWorlds) {
    const int64_t n = 1000003;  // not divisible by 2, 3 or 4
    const double S = double(n) * 4, optimal = 2.0 * (world - 1) / world * S;
    std::vector<double> sent(static_cast<size_t>(world));
    on_ranks(world, [&](ProcessGroup& pg) {
      std::vector<float> x(static_cast<size_t>(n), 1.0f);
      a.all_reduce(pg, x.data(), n);
      sent[size_t(pg.rank())] = double(pg.counters()["send"].bytes_sent);
    });
    const double worst = *std::max_element(sent.begin(), sent.end());
    const double slack = 2.0 * (world - 1) * 4;  // chunks may differ by one element
    if (std::abs(worst - optimal) > slack)
      return {false, fmt::format("each rank sends 2(N-1)/N·S = {:.0f} bytes on {} ranks (S = {:.0f})", optimal, world, S),
              fmt::format("the busiest rank sent {:.0f} bytes ({:.2f}x the optimum)", worst, worst / optimal), ""};
  }
  return {true, "", "", ""};
}

// The modeled time on two T4s over PCIe: each rank's messages each pay the latency α, and its bytes cross
// its link at the bus bandwidth, whichever of sent or received is larger. A ring comes out at exactly the
// formula 2(N−1)·α + 2(N−1)/N·S/B; gathering to a root and broadcasting back is (N−1) times slower.
CheckResult modeled_time(void* h) {
  const Lab01Api& a = api(h);
  const HardwareProfile hw = *find_profile("t4-pcie");
  const int world = 4;
  const int64_t n = 1 << 20;
  std::vector<double> t(static_cast<size_t>(world));
  on_ranks(world, [&](ProcessGroup& pg) {
    std::vector<float> x(static_cast<size_t>(n), 1.0f);
    a.all_reduce(pg, x.data(), n);
    auto c = pg.counters();
    const double msgs = double(c["send"].calls), bytes = double(std::max(c["send"].bytes_sent, c["recv"].bytes_received));
    t[size_t(pg.rank())] = msgs * hw.collective_latency_s + bytes / hw.intra_node_busbw_bytes_per_s;
  });
  const double ours = *std::max_element(t.begin(), t.end());
  const double ring = collective_time("all_reduce", n * 4, world, hw);
  if (std::abs(ours - ring) > 0.05 * ring)
    return {false, fmt::format("the ring formula on t4-pcie: {:.1f} us for 4 MiB on 4 ranks", ring * 1e6),
            fmt::format("{:.1f} us ({:.2f}x)", ours * 1e6, ours / ring), ""};
  return {true, "", "", ""};
}

}  // namespace

std::map<std::string, CheckFn> lab01_checks() {
  return {
      {"reduce_scatter_equals_builtin", [](void* h) { return compare(h, "reduce_scatter"); }},
      {"all_gather_equals_builtin", [](void* h) { return compare(h, "all_gather"); }},
      {"all_reduce_equals_builtin", [](void* h) { return compare(h, "all_reduce"); }},
      {"all_reduce_bandwidth_optimal", traffic},
      {"all_reduce_modeled_time", modeled_time},
  };
}

std::map<std::string, CheckFn> checks_for_lab(const std::string& id) {
  if (id == "01") return lab01_checks();
  if (id == "02") return lab02_checks();
  return {};
}

void* plugin_symbol(void* handle, const char* symbol) {
  void* p = dlsym(handle, symbol);
  if (!p) throw Error(fmt::format("the plugin has no symbol '{}'", symbol), "keep the table at the bottom of the lab's file");
  return p;
}

}  // namespace distlab::grader
