#include "core/comm/process_group.h"

#include "core/comm/error_file.h"

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/comm/errors.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

ProcessGroupOptions options_from_env(Millis timeout) {
  ProcessGroupOptions o;
  o.timeout = timeout;
  const char* d = std::getenv("DISTLAB_DEBUG");
  o.fingerprints = d && std::string(d) == "detail";
  return o;
}

// ---- Work ----

void Work::wait() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return done_; });
  if (on_wait_) {
    auto f = std::move(on_wait_);
    on_wait_ = nullptr;
    l.unlock();
    f();
    l.lock();
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::then(std::function<void()> f) {
  std::lock_guard<std::mutex> g(mu_);
  auto before = std::move(on_wait_);
  on_wait_ = [before = std::move(before), f = std::move(f)] {
    if (before) before();
    f();
  };
}

std::shared_ptr<Work> Work::elsewhere(std::function<void()> wait_for) {
  auto w = std::make_shared<Work>();
  w->done_ = true;
  w->on_wait_ = std::move(wait_for);
  return w;
}

bool Work::done() {
  std::lock_guard<std::mutex> g(mu_);
  return done_;
}

// ---- construction: Gloo's full mesh over our store ----

ProcessGroup::ProcessGroup(Store& store, int rank, int size, ProcessGroupOptions opts, Trace* trace, std::string name,
                           std::vector<int> global_ranks)
    : store_(store), keys_("pg/" + name, store), rank_(rank), size_(size), opts_(opts), trace_(trace),
      name_(std::move(name)), global_ranks_(std::move(global_ranks)) {
  if (size < 1 || rank < 0 || rank >= size)
    throw CommError(fmt::format("process group {}: rank {} is not in 0..{}", name_, rank, size - 1),
                    "RANK must be below WORLD_SIZE: start workers with distlab run");
  if (global_ranks_.empty())
    for (int r = 0; r < size; r++) global_ranks_.push_back(r);
  gloo::transport::tcp::attr attr;
  attr.hostname = opts_.host;
  attr.ai_family = AF_INET;
  device_ = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(opts_.timeout);  // before any options object copies it
  PrefixStore gloo_keys("gloo/" + name_, store_);
  try {
    ctx->connectFullMesh(gloo_keys, device_);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what(), message = fmt::format("rank {} could not connect process group '{}' of {} ranks: {}", rank, name_, size, what);
    // a peer that connected and then exited (its own error, found right after connecting): not the cause
    if (what.find("closed by peer") != std::string::npos || what.find("reset by peer") != std::string::npos ||
        what.find("Broken pipe") != std::string::npos)
      throw PeerLostError(message, "another rank failed or exited while the group was connecting: its own output says why (distlab run prints it)");
    throw CommError(message, "a rank did not start or could not be reached; check every rank's output and the network");
  }
  // Nobody leaves the connect phase before every rank has connected: Gloo's connectFullMesh returns when
  // THIS rank's pairs are up, and a rank that returned, failed at once (a config it refuses) and closed its
  // sockets would break a pair another rank is still completing ("closed by peer", blaming the wrong rank).
  if (size > 1) {
    keys_.set(fmt::format("connected/{}", rank), {});
    for (int r = 0; r < size; r++) {
      try {
        keys_.wait({fmt::format("connected/{}", r)}, opts_.timeout);
      } catch (const StoreError&) {
        CommError err(fmt::format("rank {}: process group '{}' connected, but rank {} did not finish connecting within {:.1f} s", rank,
                                  name_, r, opts_.timeout.count() / 1000.0),
                      "that rank is stuck or exited while connecting: its own output says why");
        err.waiting_for = {global_ranks_[size_t(r)]};
        throw err;
      }
    }
  }
  context_ = ctx;
  worker_ = std::thread([this] { run_loop(); });
}

ProcessGroup::ProcessGroup(Fake, int rank, int size, Trace* trace, std::string name)
    : own_store_(std::make_unique<MemoryStore>()), store_(*own_store_), keys_("pg/" + name, store_), fake_(true),
      rank_(rank), size_(size), trace_(trace), name_(std::move(name)) {
  if (size < 1 || rank < 0 || rank >= size)
    throw ConfigError(fmt::format("fake world '{}': rank {} is not in 0..{}", name_, rank, size - 1),
                      "dist.fake_world_size must be at least 1 and the rank below it");
  opts_.track_arrivals = false;
  for (int r = 0; r < size; r++) global_ranks_.push_back(r);
  worker_ = std::thread([this] { run_loop(); });
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard<std::mutex> g(queue_mu_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  worker_.join();
}

std::unique_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks) {
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end())
    throw CommError(fmt::format("rank {} called new_group({}) without being a member", rank_, fmt::join(ranks, ",")),
                    "only the members of a group create it");
  for (int r : ranks)
    if (r < 0 || r >= size_) throw CommError(fmt::format("new_group: rank {} is not in group '{}' of {} ranks", r, name_, size_));
  std::vector<int> global;
  for (int r : ranks) global.push_back(global_ranks_[size_t(r)]);
  std::string sub = fmt::format("{}.{}[{}]", name_, subgroups_++, fmt::join(ranks, ","));
  if (fake_) return std::make_unique<ProcessGroup>(Fake{}, int(it - ranks.begin()), int(ranks.size()), trace_, sub);
  return std::make_unique<ProcessGroup>(store_, int(it - ranks.begin()), int(ranks.size()), opts_, trace_, sub, global);
}

// ---- the queue: one operation at a time, in sequence order ----

std::shared_ptr<Work> ProcessGroup::submit(const char* op, int64_t count, int64_t payload_bytes, bool collective,
                                           std::function<void(int64_t seq)> body, std::string detail) {
  auto work = std::make_shared<Work>();
  const int64_t seq = collective ? next_seq_++ : -1;
  if (collective && !fake_) note_collective_entered();  // how far this rank got, for its launcher's blame (error_file.h)
  if (trace_ && collective) {
    TraceEvent e;
    e.name = op;
    e.kind = EventKind::collective;
    e.stream = Stream::comm;
    e.op = op;
    e.payload_bytes = payload_bytes;
    e.group_size = size_;
    e.seq = seq;
    e.group = name_;
    e.t_begin_us = e.t_end_us = trace_->now_us();
    trace_->record(e);
    Trace* t = trace_;
    std::string group = name_;
    work->on_wait_ = [t, seq, group, op] {
      TraceEvent w;
      w.name = std::string("wait ") + op;
      w.kind = EventKind::wait;
      w.stream = Stream::compute;
      w.op = op;
      w.seq = seq;
      w.group = group;
      w.t_begin_us = w.t_end_us = t->now_us();
      t->record(w);
    };
  }
  {
    std::lock_guard<std::mutex> g(queue_mu_);
    queue_.push_back(Call{op, seq, count, std::move(body), work, std::move(detail)});
  }
  queue_cv_.notify_one();
  return work;
}

void ProcessGroup::run_loop() {
  for (;;) {
    Call c;
    {
      std::unique_lock<std::mutex> l(queue_mu_);
      queue_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      c = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      execute(c);
    } catch (...) {
      std::lock_guard<std::mutex> g(c.work->mu_);
      c.work->error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> g(c.work->mu_);
      c.work->done_ = true;
    }
    c.work->cv_.notify_all();
  }
}

void ProcessGroup::execute(Call& c) {
  if (c.seq >= 0 && opts_.fingerprints) check_fingerprint(c);
  // the arrival says what this rank called: a timeout can then tell a missing rank from one that came to
  // the same place in the sequence with another collective (a rank-dependent extra or missing call before it)
  // (in one of kArrivalSlots slots, so a long run's store holds a bounded number of keys per group)
  if (c.seq >= 0 && opts_.track_arrivals && size_ > 1)
    keys_.set_string(fmt::format("arrive/{}/{}", c.seq % kArrivalSlots, rank_), fmt::format("#{} {}", c.seq, describe(c)));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c.body(wire_id(c));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> g(counters_mu_);
    counters_[c.op].seconds += took;
  } catch (const Error&) {
    throw;
  } catch (const gloo::IoException& e) {
    fail(c, e.what());
  } catch (const gloo::Exception& e) {
    fail(c, e.what());
  }
}

void ProcessGroup::fail(const Call& c, const std::string& what) {
  std::string arrived = "unknown", missing, other_calls;
  std::vector<int> missing_ranks;
  const std::string mine = describe(c);
  if (opts_.track_arrivals && c.seq >= 0) {  // point to point: the one peer is named in the message
    arrived.clear();
    const std::string tag = fmt::format("#{} ", c.seq);  // the slot's note is this collective's, not an older one's
    for (int r = 0; r < size_; r++) {
      const std::string key = fmt::format("arrive/{}/{}", c.seq % kArrivalSlots, r);
      std::string theirs;
      try {
        if (keys_.check({key})) theirs = keys_.get_string(key);
      } catch (const Error&) {
        arrived = "unknown (the store is gone)";
        break;
      }
      const bool here = theirs.rfind(tag, 0) == 0;
      (here ? arrived : missing) += fmt::format("{}{}", (here ? arrived : missing).empty() ? "" : ", ", r);
      if (!here) missing_ranks.push_back(global_ranks_.empty() ? r : global_ranks_[size_t(r)]);
      theirs = here ? theirs.substr(tag.size()) : "";
      if (here && r != rank_ && theirs != mine) other_calls += fmt::format("\n  rank {} called {} as #{}", r, theirs, c.seq);
    }
  }
  const bool timed_out = what.find("Timed out") != std::string::npos || what.find("timeout") != std::string::npos;
  const bool peer_lost = what.find("closed by peer") != std::string::npos || what.find("reset by peer") != std::string::npos ||
                         what.find("Broken pipe") != std::string::npos;
  const std::string message = fmt::format("rank {}: {} {} of {} f32 ({}) on group '{}' {}: {}\n  ranks that arrived: {}{}", rank_, c.op,
                  c.seq >= 0 ? fmt::format("#{}", c.seq) : "(" + c.detail + ")", c.count, format_bytes(double(c.count) * 4), name_,
                  timed_out ? fmt::format("timed out after {:.1f} s", opts_.timeout.count() / 1000.0) : "failed", what,
                  arrived.empty() ? "none" : arrived, missing.empty() ? "" : "; missing: " + missing) +
                                (other_calls.empty() ? "" : fmt::format("\n  rank {} called {} as #{}{}", rank_, mine, c.seq, other_calls));
  if (peer_lost) throw PeerLostError(message, "another rank failed or exited first: its own output says why (distlab run prints it)");
  if (!other_calls.empty())  // every rank came, each to another collective: their sequences parted earlier
    throw CommError(message, "the ranks' sequences of collectives differ: a rank-dependent branch made an extra (or skipped a) "
                             "collective before this one, e.g. an all_reduce for logging under `if rank == 0`; every rank must "
                             "issue the same collectives in the same order");
  CommError err(message,
      timed_out ? "a rank never called this collective: a rank-dependent branch (an extra all_reduce on rank 0, an early "
                  "exit, a stuck loop)? rerun with DISTLAB_DEBUG=detail to compare every collective across ranks"
                : "another rank failed or exited: its own output says why (distlab run prints it)");
  if (timed_out) err.waiting_for = missing_ranks;
  throw err;
}

// What a collective's messages are tagged with: its place in the sequence (low 20 bits) and a 12-bit hash of
// what it is (op, count, reduce op or root). Two ranks that reach the same place with different collectives
// then wait on different tags and time out with a message naming both -- rather than Gloo receiving a
// message of another size, which aborts the whole process from its I/O thread.
uint32_t ProcessGroup::wire_id(const Call& c) {
  if (c.seq < 0) return 0;
  uint32_t h = 2166136261u;
  for (unsigned char ch : describe(c)) h = (h ^ ch) * 16777619u;
  return ((h & 0xfffu) << 20) | uint32_t(c.seq & 0xfffff);
}

std::string ProcessGroup::describe(const Call& c) {
  return fmt::format("{} of {} f32{}", c.op, c.count, c.detail.empty() ? "" : " (" + c.detail + ")");
}

void ProcessGroup::check_fingerprint(const Call& c) {
  // the op, its place in the sequence, the element count and type, and the reduce op or root
  const std::string mine = fmt::format("{} #{} of {} f32{}", c.op, c.seq, c.count, c.detail.empty() ? "" : " (" + c.detail + ")");
  keys_.set_string(fmt::format("fp/{}/{}", c.seq, rank_), mine);
  for (int r = 0; r < size_; r++) {
    if (r == rank_) continue;
    const std::string key = fmt::format("fp/{}/{}", c.seq, r);
    try {
      keys_.wait({key}, opts_.timeout);
    } catch (const StoreError&) {
      CommError err(fmt::format("rank {}: {} on group '{}': rank {} did not reach collective #{} within {:.1f} s", rank_, mine,
                                name_, r, c.seq, opts_.timeout.count() / 1000.0),
                    "that rank is stuck, exited, or runs fewer collectives: compare the ranks' code paths");
      err.waiting_for = {global_ranks_.empty() ? r : global_ranks_[size_t(r)]};
      throw err;
    }
    std::string theirs = keys_.get_string(key);
    if (theirs != mine)
      throw MismatchError(fmt::format("collective mismatch on group '{}': rank {} called {}; rank {} called {}", name_,
                                      rank_, mine, r, theirs),
                          "every rank must issue the same collectives in the same order with the same sizes");
  }
}

void ProcessGroup::count(const char* op, int64_t sent, int64_t received) {
  std::lock_guard<std::mutex> g(counters_mu_);
  auto& k = counters_[op];
  k.calls++;
  k.bytes_sent += sent;
  k.bytes_received += received;
}

std::map<std::string, CommCounters> ProcessGroup::counters() const {
  std::lock_guard<std::mutex> g(counters_mu_);
  return counters_;
}

CommCounters ProcessGroup::total_counters() const {
  std::lock_guard<std::mutex> g(counters_mu_);
  CommCounters t;
  for (const auto& [op, k] : counters_) t += k;
  return t;
}

void ProcessGroup::reset_counters() {
  std::lock_guard<std::mutex> g(counters_mu_);
  counters_.clear();
}

// ---- the collectives ----

std::shared_ptr<Work> ProcessGroup::all_reduce_async(float* data, int64_t n, ReduceOp op, DType wire) {
  if (wire != DType::f32) return all_reduce_16_async(data, n, op, wire);
  // Gloo's ring: reduce-scatter then all-gather, each rank sending 2(n-1)/n of the buffer
  const int64_t moved = size_ > 1 ? 2 * (size_ - 1) * n * 4 / size_ : 0;
  if (fake_) return submit("all_reduce", n, n * 4, true, [=, this](int64_t) { count("all_reduce", moved, moved); }, reduce_op_name(op));
  return submit("all_reduce", n, n * 4, true, [=, this](int64_t seq) {
    if (size_ > 1 && n > 0) {
      gloo::AllreduceOptions o(context_);
      o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      o.setOutput(data, size_t(n));
      o.setTag(uint32_t(seq));
      o.setTimeout(opts_.timeout);
      if (op == ReduceOp::max)
        o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<float>));
      else
        o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(o);
    }
    if (op == ReduceOp::avg && size_ > 1) {
      const float inv = 1.0f / float(size_);
      for (int64_t i = 0; i < n; i++) data[i] *= inv;
    }
    count("all_reduce", moved, moved);
  }, reduce_op_name(op));
}

// A 16-bit all-reduce (Gloo's ring has no bf16): our ring reduce-scatter over N chunks of ceil(n/N), then a
// 16-bit all-gather — the same two phases as Gloo's and NCCL's ring, 2 bytes a value on the wire.
std::shared_ptr<Work> ProcessGroup::all_reduce_16_async(float* data, int64_t n, ReduceOp op, DType wire) {
  const int64_t chunk = (n + size_ - 1) / size_, moved = size_ > 1 ? 2 * (size_ - 1) * chunk * 2 : 0;
  const std::string detail = fmt::format("{} {}", reduce_op_name(op), dtype_name(wire));
  if (fake_) return submit("all_reduce", n, n * 2, true, [=, this](int64_t) { count("all_reduce", moved, moved); }, detail);
  return submit("all_reduce", n, n * 2, true, [=, this](int64_t seq) {
    std::vector<float> padded(static_cast<size_t>(chunk * size_), 0.0f), mine(static_cast<size_t>(chunk));
    std::copy_n(data, n, padded.begin());
    ring_reduce_scatter(mine.data(), padded.data(), chunk, op, seq, wire);
    gather_16(padded.data(), mine.data(), chunk, wire, seq);
    std::copy_n(padded.begin(), n, data);
    count("all_reduce", moved, moved);
  }, detail);
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_async(float* out, const float* in, int64_t n, ReduceOp op, DType wire) {
  const int64_t bytes = dtype_size(wire), moved = (size_ - 1) * n * bytes;
  const std::string detail = wire == DType::f32 ? reduce_op_name(op) : fmt::format("{} {}", reduce_op_name(op), dtype_name(wire));
  if (fake_) return submit("reduce_scatter", n, n * size_ * bytes, true, [=, this](int64_t) { count("reduce_scatter", moved, moved); }, detail);
  return submit("reduce_scatter", n, n * size_ * bytes, true, [=, this](int64_t seq) {
    ring_reduce_scatter(out, in, n, op, seq, wire);
    count("reduce_scatter", moved, moved);
  }, detail);
}

std::shared_ptr<Work> ProcessGroup::all_gather_async(float* out, const float* in, int64_t n, DType wire) {
  const int64_t bytes = dtype_size(wire), moved = (size_ - 1) * n * bytes;
  const std::string detail = wire == DType::f32 ? "" : dtype_name(wire);  // ranks must agree on the wire's type too
  if (fake_) return submit("all_gather", n, n * size_ * bytes, true, [=, this](int64_t) { count("all_gather", moved, moved); }, detail);
  return submit("all_gather", n, n * size_ * bytes, true, [=, this](int64_t seq) {
    if (wire != DType::f32) {
      gather_16(out, in, n, wire, seq);
    } else if (size_ > 1 && n > 0) {
      gloo::AllgatherOptions o(context_);
      o.setInput(const_cast<float*>(in), size_t(n));
      o.setOutput(out, size_t(n * size_));
      o.setTag(uint32_t(seq));
      o.setTimeout(opts_.timeout);
      gloo::allgather(o);
    } else if (n > 0) {
      std::memcpy(out, in, size_t(n) * 4);
    }
    count("all_gather", moved, moved);
  }, detail);
}

// 16 bits on the wire: rounded once going in, exact coming out. Runs on the communication thread.
void ProcessGroup::gather_16(float* out, const float* in, int64_t n, DType wire, int64_t tag) {
  if (n <= 0) return;
  std::vector<uint16_t> in16(static_cast<size_t>(n)), out16(static_cast<size_t>(n * size_));
  convert(in, DType::f32, in16.data(), wire, n);
  if (size_ > 1) {
    gloo::AllgatherOptions o(context_);
    o.setInput(in16.data(), size_t(n));
    o.setOutput(out16.data(), size_t(n * size_));
    o.setTag(uint32_t(tag));
    o.setTimeout(opts_.timeout);
    gloo::allgather(o);
  } else {
    out16 = in16;
  }
  convert(out16.data(), wire, out, DType::f32, n * size_);
}

std::shared_ptr<Work> ProcessGroup::broadcast_async(float* data, int64_t n, int root) {
  if (root < 0 || root >= size_) throw CommError(fmt::format("broadcast: root {} is not a rank of group '{}' ({} ranks)", root, name_, size_));
  if (fake_)
    return submit("broadcast", n, n * 4, true, [=, this](int64_t) {
      count("broadcast", rank_ == root ? (size_ - 1) * n * 4 : 0, rank_ == root ? 0 : n * 4);
    }, fmt::format("root {}", root));
  return submit("broadcast", n, n * 4, true, [=, this](int64_t seq) {
    if (size_ > 1 && n > 0) {
      gloo::BroadcastOptions o(context_);
      o.setOutput(data, size_t(n));
      o.setRoot(root);
      o.setTag(uint32_t(seq));
      o.setTimeout(opts_.timeout);
      gloo::broadcast(o);
    }
    // one-to-all: the root sends the buffer to each other rank
    count("broadcast", rank_ == root ? (size_ - 1) * n * 4 : 0, rank_ == root ? 0 : n * 4);
  }, fmt::format("root {}", root));
}

void ProcessGroup::barrier() {
  submit("barrier", 0, 0, true, [=, this](int64_t seq) {
    if (size_ > 1 && !fake_) {
      gloo::BarrierOptions o(context_);
      o.setTag(uint32_t(seq));
      o.setTimeout(opts_.timeout);
      gloo::barrier(o);
    }
    count("barrier", 0, 0);
  })->wait();
}

}  // namespace distlab
