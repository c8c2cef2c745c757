// Lab 01's checks. Each rank of a ring is the student's plugin in a sandbox of its own; the only way
// between them is this file's relay, which delivers every send to its recv, counts every byte and message,
// and sees a deadlock for what it is (every rank waiting, nothing on its way). Results are compared with
// sums the grader computes itself; traffic and modeled time come from the relay's counts.
// Read next: host.cpp beside it (the plugin's side of the relay).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <set>
#include <poll.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <deque>
#include <map>
#include <random>

#include "core/perf/cost_model.h"
#include "core/perf/hardware.h"
#include "grader/check.h"

namespace distlab::grader {

namespace checks01 {  // named: a unity build (CMakeLists.txt) puts several labs' checks in one unit

const std::vector<int> kWorlds = {2, 3, 4};
// 2^18 + 3 floats is a megabyte per rank (4 MB for a reduce-scatter on 4 ranks): every message outgrows a
// socket's buffer, so partial sends and receives happen, as they did at 2^20 + 3 at a quarter of the bytes
// relayed (the largest share of a grading's time); the traffic checks below count exact bytes.
const std::vector<int64_t> kSizes = {0, 1, 7, 1000, 1002, (1 << 18) + 3};  // 1002: remainder 2 on 3 and on 4 ranks  // and one size drawn per world (sizes_for)
// What the relay holds for a plugin: no message (or answer) larger than the whole N·n buffer, and no more than
// twice that sent and not yet received over all ranks (a ring has at most one chunk per rank on its way), so
// a plugin that floods costs the grader a few times the buffer, not gigabytes outside any cgroup.
uint64_t whole_buffer_bytes(int world, int64_t n) { return uint64_t(std::max<int64_t>(n, 1)) * uint64_t(world) * 4; }

// The awkward sizes every grading tries, and one more drawn from the grading's seed.
std::vector<int64_t> sizes_for(CheckContext& ctx, labproto::Fn fn, int world) {
  std::vector<int64_t> v = kSizes;
  auto gen = ctx.rng({fn, world, -1});
  v.push_back(std::uniform_int_distribution<int64_t>(2, 5000)(gen));
  return v;
}

struct Traffic {
  int64_t bytes_sent = 0, bytes_received = 0;
  std::map<int, int64_t> messages_to;  // per destination rank
};

struct RingRun {
  std::vector<std::vector<float>> out;  // per rank
  std::vector<Traffic> traffic;         // per rank, this call only
  std::vector<std::set<int>> sent_to;   // per rank: the ranks it sent to (a ring: its neighbours)
};

// "" when every rank sent only to its ring neighbours, r + 1 and r - 1: a ring turning either way, or both
// at once (NCCL runs a ring each way over full-duplex links, half the bytes each). Else who sent to whom.
// A direct all-to-all moves the same bytes in the same number of messages, but over N - 1 links a rank
// where the ring uses its two neighbours' (on 3 ranks the two are the same thing; 4 tell them apart).
std::string not_a_ring(const RingRun& run, int world) {
  if (world <= 2) return "";
  std::string who;
  for (int r = 0; r < world; r++) {
    const std::set<int>& to = run.sent_to[size_t(r)];
    const bool neighbours = std::all_of(to.begin(), to.end(), [&](int d) { return d == (r + 1) % world || d == (r + world - 1) % world; });
    if (!neighbours)
      who += fmt::format("{}rank {} sent to rank{} {}", who.empty() ? "" : "; ", r, to.size() > 1 ? "s" : "", fmt::join(to, ", "));
  }
  return who;
}

const char* fn_name(labproto::Fn fn) {
  return fn == labproto::kRingReduceScatter ? "ring_reduce_scatter" : fn == labproto::kRingAllGather ? "ring_all_gather" : "ring_all_reduce";
}

// N plugin processes and the relay between them.
class Ring {
 public:
  Ring(CheckContext& ctx, int world) : ctx_(ctx), world_(world) {
    for (int r = 0; r < world; r++) procs_.push_back(std::make_unique<PluginProcess>(ctx.launch(fmt::format("rank {} of {}", r, world))));
    for (auto& p : procs_) p->wait_ready(ctx.deadline);
  }

  RingRun run(labproto::Fn fn, int64_t n, const std::vector<std::vector<float>>& inputs) {
    const std::string during = fmt::format("{} on {} ranks with n = {}", fn_name(fn), world_, n);
    RingRun res;
    res.out.resize(size_t(world_));
    res.traffic.resize(size_t(world_));
    res.sent_to.resize(size_t(world_));
    using Queue = std::deque<std::vector<char>>;
    std::vector<std::vector<Queue>> queue(static_cast<size_t>(world_), std::vector<Queue>(static_cast<size_t>(world_)));
    std::vector<int> waits_for(size_t(world_), -1);  // the rank a blocked recv waits for
    std::vector<int64_t> wants(size_t(world_), 0);   // its count
    std::vector<bool> done(size_t(world_), false);
    uint64_t in_flight = 0;
    for (int r = 0; r < world_; r++) {
      wire::Frame f;
      f.op = labproto::kCall;
      f.arg[0] = fn;
      f.arg[1] = r;
      f.arg[2] = world_;
      f.arg[3] = n;
      procs_[size_t(r)]->send(f, inputs[size_t(r)].data(), inputs[size_t(r)].size() * 4, ctx_.deadline, during.c_str());
    }
    // hands the oldest message from src to dst, which is waiting for it
    auto deliver = [&](int src, int dst) {
      auto& q = queue[size_t(src)][size_t(dst)];
      std::vector<char> msg = std::move(q.front());
      q.pop_front();
      in_flight -= msg.size();
      if (int64_t(msg.size()) != wants[size_t(dst)] * 4)
        throw CheckAbort("error", fmt::format("during {}: rank {} receives {} floats from rank {}, but the message rank {} sent has {}",
                                              during, dst, wants[size_t(dst)], src, src, msg.size() / 4));
      wire::Frame f;
      f.op = labproto::kData;
      procs_[size_t(dst)]->send(f, msg.data(), msg.size(), ctx_.deadline, during.c_str());
      res.traffic[size_t(dst)].bytes_received += int64_t(msg.size());
      waits_for[size_t(dst)] = -1;
    };
    for (int remaining = world_; remaining > 0;) {
      // nothing can move: every rank still running waits for a message that nobody will send
      bool any_running = false;
      for (int r = 0; r < world_; r++)
        if (!done[size_t(r)] && waits_for[size_t(r)] < 0) any_running = true;
      if (!any_running) throw CheckAbort("deadlock", describe_deadlock(during, waits_for, done));
      std::vector<pollfd> fds;
      for (int r = 0; r < world_; r++)
        if (!done[size_t(r)]) fds.push_back({procs_[size_t(r)]->fd(), POLLIN, 0});
      const int left_ms = int(std::min(1000.0, ctx_.seconds_left() * 1000));
      if (left_ms <= 0) throw CheckAbort("timeout", describe_timeout(during, waits_for, done));
      if (poll(fds.data(), fds.size(), left_ms) <= 0) continue;
      for (const auto& pfd : fds) {
        if (!(pfd.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        int r = 0;
        while (procs_[size_t(r)]->fd() != pfd.fd) r++;
        wire::Frame f;
        std::vector<char> payload;
        procs_[size_t(r)]->receive(f, payload, ctx_.deadline, during.c_str(), whole_buffer_bytes(world_, n));
        if (f.op == labproto::kSend) {
          const int dst = int(f.arg[0]);
          if (dst < 0 || dst >= world_ || dst == r) throw CheckAbort("error", fmt::format("during {}: rank {} sent to rank {}", during, r, dst));
          in_flight += payload.size();
          if (in_flight > 2 * whole_buffer_bytes(world_, n) + (1 << 20))
            throw CheckAbort("error", fmt::format("during {}: more than {} MiB sent and not received: do the ranks ever recv?",
                                                  during, (2 * whole_buffer_bytes(world_, n) + (1 << 20)) >> 20));
          res.traffic[size_t(r)].bytes_sent += int64_t(payload.size());
          res.sent_to[size_t(r)].insert(dst);
          res.traffic[size_t(r)].messages_to[dst]++;
          queue[size_t(r)][size_t(dst)].push_back(std::move(payload));
          if (waits_for[size_t(dst)] == r) deliver(r, dst);
        } else if (f.op == labproto::kRecv) {
          const int src = int(f.arg[0]);
          if (src < 0 || src >= world_ || src == r || f.arg[1] < 0)
            throw CheckAbort("error", fmt::format("during {}: rank {} asked to receive from rank {}", during, r, src));
          waits_for[size_t(r)] = src;
          wants[size_t(r)] = f.arg[1];
          if (!queue[size_t(src)][size_t(r)].empty()) deliver(src, r);
        } else if (f.op == labproto::kReturn) {
          res.out[size_t(r)].resize(payload.size() / 4);
          if (!payload.empty()) std::memcpy(res.out[size_t(r)].data(), payload.data(), payload.size() / 4 * 4);
          done[size_t(r)] = true;
          remaining--;
        } else if (f.op == labproto::kRaised) {
          throw CheckAbort("error", fmt::format("rank {} threw during {}: {}", r, during,
                                                sanitize_output(std::string(payload.begin(), payload.end()), 1500)));
        } else {
          throw CheckAbort("error", fmt::format("during {}: rank {} sent opcode {}", during, r, f.op));
        }
      }
    }
    for (int s = 0; s < world_; s++)
      for (int d = 0; d < world_; d++)
        if (!queue[size_t(s)][size_t(d)].empty())
          throw CheckAbort("error", fmt::format("during {}: rank {} sent {} message(s) to rank {} that were never received", during, s,
                                                queue[size_t(s)][size_t(d)].size(), d));
    return res;
  }

 private:
  std::string describe_deadlock(const std::string& during, const std::vector<int>& waits_for, const std::vector<bool>& done) const {
    std::string who;
    bool all_waiting = true;
    for (int r = 0; r < world_; r++) {
      if (done[size_t(r)]) {
        all_waiting = false;
        continue;
      }
      who += fmt::format("{}rank {} waits in recv for rank {}{}", who.empty() ? "" : ", ", r, waits_for[size_t(r)],
                         done[size_t(waits_for[size_t(r)])] ? " (which has already returned)" : "");
    }
    return fmt::format("deadlock during {}: {}, and no message is on its way. {}", during, who,
                       all_waiting ? "Every rank is waiting to receive: order your sends and receives so that each recv has "
                                     "a send before it on the other side (in the ring: send to the right, then receive from the left)."
                                   : "A rank returned while its neighbour still expected a message from it: both sides must "
                                     "run the same number of steps.");
  }

  std::string describe_timeout(const std::string& during, const std::vector<int>& waits_for, const std::vector<bool>& done) const {
    std::string who;
    for (int r = 0; r < world_; r++)
      who += fmt::format("{}rank {} {}", who.empty() ? "" : ", ", r,
                         done[size_t(r)] ? "returned" : waits_for[size_t(r)] >= 0 ? fmt::format("waits for rank {}", waits_for[size_t(r)])
                                                                                 : std::string("is computing"));
    std::string tail;
    for (const auto& p : procs_)
      if (auto t = p->output_tail(300); !t.empty()) tail += "\n" + p->name() + ": " + t;
    return fmt::format("still running after {:.0f} s during {} ({}){}", ctx_.limit_s, during, who, tail);
  }

  CheckContext& ctx_;
  int world_;
  std::vector<std::unique_ptr<PluginProcess>> procs_;
};

// Every rank's input, drawn from the grading's seed: no rank can know another's values without receiving
// them. Integers in [-2^20, 2^20]: any order of adding up to four of them is exact in fp32, so the sums
// below are the only right answer whatever order the ring adds in; and at 21 bits a value they leave no
// room to pack two into a float's 32 (a gather to one rank that halves its bytes so).
std::vector<std::vector<float>> inputs_for(CheckContext& ctx, labproto::Fn fn, int world, int64_t n) {
  std::vector<std::vector<float>> in(static_cast<size_t>(world));
  const int64_t len = fn == labproto::kRingReduceScatter ? n * world : n;
  auto gen = ctx.rng({fn, world, n});
  std::uniform_int_distribution<int> q(-(1 << 20), 1 << 20);
  for (int r = 0; r < world; r++) {
    in[size_t(r)].resize(size_t(len));
    for (auto& x : in[size_t(r)]) x = float(q(gen));
  }
  return in;
}

// What every rank must end with, computed here from the inputs.
std::vector<float> expected(const std::vector<std::vector<float>>& in, labproto::Fn fn, int world, int rank, int64_t n) {
  std::vector<float> want;
  if (fn == labproto::kRingAllGather) {
    for (int q = 0; q < world; q++) want.insert(want.end(), in[size_t(q)].begin(), in[size_t(q)].begin() + n);
  } else {
    const int64_t off = fn == labproto::kRingReduceScatter ? rank * n : 0;
    for (int64_t i = 0; i < n; i++) {
      float s = 0;
      for (int q = 0; q < world; q++) s += in[size_t(q)][size_t(off + i)];
      want.push_back(s);
    }
  }
  return want;
}

// "" when every rank's output is right; else the first difference.
std::string first_difference(const RingRun& run, const std::vector<std::vector<float>>& in, labproto::Fn fn, int world, int64_t n) {
  for (int r = 0; r < world; r++) {
    const auto want = expected(in, fn, world, r, n);
    const auto& got = run.out[size_t(r)];
    if (got.size() != want.size()) return fmt::format("rank {} returned {} floats instead of {}", r, got.size(), want.size());
    for (size_t i = 0; i < want.size(); i++) {
      // a gather copies: bit for bit; a sum may add in any order: within 1e-5
      const bool ok = fn == labproto::kRingAllGather ? std::memcmp(&got[i], &want[i], 4) == 0
                                                     : std::abs(got[i] - want[i]) <= 1e-5f * std::max(1.0f, std::abs(want[i]));
      if (!ok) return fmt::format("rank {} element {}: {} instead of {}", r, i, got[i], want[i]);
    }
  }
  return "";
}

CheckResult compare(CheckContext& ctx, labproto::Fn fn) {
  const bool gather = fn == labproto::kRingAllGather;
  int cases = 0;
  for (int world : kWorlds) {
    Ring ring(ctx, world);
    for (int64_t n : sizes_for(ctx, fn, world)) {
      const auto in = inputs_for(ctx, fn, world, n);
      RingRun run = ring.run(fn, n, in);
      if (auto bad = first_difference(run, in, fn, world, n); !bad.empty())
        return {false, fmt::format("{} ({} on {} ranks, n = {})", gather ? "every rank's input, in rank order" : "the sum of the ranks' inputs",
                                   fn_name(fn), world, n), bad, ""};
      cases++;
    }
  }
  return {true, "", "", fmt::format("{} runs on {} ranks: {}", cases, fmt::join(kWorlds, ", "),
                                    gather ? "every rank ends with every rank's input in rank order, bit for bit" : "every element within 1e-5 of the sum")};
}

// Bytes each rank sends: the relay counted them. Optimal: (N−1)/N·S for reduce-scatter and all-gather
// (S: the N·n floats of the full buffer), 2(N−1)/N·S for all-reduce. Only a correct result counts.
CheckResult traffic(CheckContext& ctx, const std::vector<labproto::Fn>& fns) {
  std::string detail;
  for (int world : kWorlds) {
    Ring ring(ctx, world);
    for (labproto::Fn fn : fns) {
      // not divisible by 2, 3 or 4; the counts are exact, so their size only has to dwarf the slack of 4(N-1) bytes
      const int64_t n = fn == labproto::kRingAllReduce ? 100003 : 25001;
      const auto in = inputs_for(ctx, fn, world, n);
      RingRun run = ring.run(fn, n, in);
      if (auto bad = first_difference(run, in, fn, world, n); !bad.empty())
        return {false, fmt::format("a correct {} (traffic counts only then)", fn_name(fn)), bad, ""};
      if (const std::string who = not_a_ring(run, world); !who.empty())
        return {false, fmt::format("{} on {} ranks as a ring: every rank sends only to its neighbours r + 1 and r - 1", fn_name(fn), world),
                who, "", "a rank that sends to every other moves the ring's bytes over N - 1 links at once: the ring's point is that a "
                         "rank talks to its neighbours only, each chunk passed on to the next rank"};
      const double S = double(fn == labproto::kRingAllReduce ? n : n * world) * 4;
      const double phases = fn == labproto::kRingAllReduce ? 2 : 1;
      const double optimal = phases * (world - 1) / world * S, slack = phases * (world - 1) * 4.0;  // chunks differ by one float
      int64_t worst = 0;
      for (const auto& t : run.traffic) worst = std::max(worst, t.bytes_sent);
      if (std::abs(double(worst) - optimal) > slack)
        return {false,
                fmt::format("each rank sends {}(N-1)/N·S = {:.0f} bytes in {} on {} ranks (S = {:.0f})", phases > 1 ? "2" : "", optimal,
                            fn_name(fn), world, S),
                fmt::format("the busiest rank sent {} bytes ({:.2f}x the optimum)", worst, double(worst) / optimal), "",
                double(worst) > optimal ? "gathering to one rank and sending back moves (N-1)·S through the root: pass chunks of S/N "
                                          "around the ring instead"
                                        : "a rank must send every chunk it owns on: check the number of steps (N-1 per phase)"};
      detail += fmt::format("{}{} on {} ranks: the busiest rank sent {} bytes, {:.4f}x the optimum", detail.empty() ? "" : "; ", fn_name(fn),
                            world, worst, double(worst) / optimal);
    }
  }
  return {true, "", "", detail};
}

// The modeled time on four T4s over PCIe: a rank's messages to one neighbour go one after another, each
// paying the latency α (a ring turning both ways sends to its two neighbours at once, and pays α per step
// as a one-way ring does), and its bytes cross its link at the bus bandwidth, whichever of sent or received
// is larger. A ring comes out at exactly the formula 2(N−1)·α + 2(N−1)/N·S/B; gathering to a root and
// broadcasting back is (N−1) times slower.
CheckResult modeled_time(CheckContext& ctx) {
  const HardwareProfile hw = *find_profile("t4-pcie");
  const int world = 4;
  const int64_t n = 1 << 20;
  Ring ring(ctx, world);
  const auto in = inputs_for(ctx, labproto::kRingAllReduce, world, n);
  RingRun run = ring.run(labproto::kRingAllReduce, n, in);
  if (auto bad = first_difference(run, in, labproto::kRingAllReduce, world, n); !bad.empty())
    return {false, "a correct all_reduce (its time counts only then)", bad, ""};
  if (const std::string who = not_a_ring(run, world); !who.empty())  // the model charges a rank's links to its neighbours: a ring's
    return {false, "all_reduce on 4 ranks as a ring (the model below is a ring's: a rank's links to its two neighbours)", who, ""};
  double ours = 0;
  for (const auto& t : run.traffic) {
    int64_t serial = 0;  // the most messages sent down one link
    for (const auto& [to, count] : t.messages_to) serial = std::max(serial, count);
    ours = std::max(ours, double(serial) * hw.collective_latency_s + double(std::max(t.bytes_sent, t.bytes_received)) / hw.intra_node_busbw_bytes_per_s);
  }
  const double ring_s = collective_time("all_reduce", n * 4, world, hw);
  if (std::abs(ours - ring_s) > 0.05 * ring_s)
    return {false, fmt::format("the ring formula on t4-pcie: {:.1f} us for 4 MiB on 4 ranks", ring_s * 1e6),
            fmt::format("{:.1f} us ({:.2f}x)", ours * 1e6, ours / ring_s), ""};
  return {true, "", "", fmt::format("4 MiB on 4 ranks, modeled on t4-pcie: {:.1f} us, the ring formula's {:.1f} us ({:.3f}x)", ours * 1e6,
                                    ring_s * 1e6, ours / ring_s)};
}

}  // namespace checks01

std::map<std::string, CheckDef> lab01_checks() {
  using namespace checks01;
  return {
      {"reduce_scatter_equals_builtin", {[](CheckContext& c) { return compare(c, labproto::kRingReduceScatter); }}},
      {"all_gather_equals_builtin", {[](CheckContext& c) { return compare(c, labproto::kRingAllGather); }}},
      {"all_reduce_equals_builtin", {[](CheckContext& c) { return compare(c, labproto::kRingAllReduce); }}},
      {"reduce_scatter_all_gather_traffic",
       {[](CheckContext& c) { return traffic(c, {labproto::kRingReduceScatter, labproto::kRingAllGather}); }}},
      {"all_reduce_bandwidth_optimal", {[](CheckContext& c) { return traffic(c, {labproto::kRingAllReduce}); }}},
      {"all_reduce_modeled_time", {modeled_time}},
  };
}

}  // namespace distlab::grader
