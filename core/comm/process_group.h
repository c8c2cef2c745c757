// ProcessGroup: the handful of collectives the strategies need, over Gloo (TCP; CPU tensors).
//
// Every operation gets the next sequence number of its group, in program order, so rank r's k-th
// collective pairs with every other rank's k-th. Operations run one at a time, in that order, on the
// group's communication thread: the blocking forms enqueue and wait, the async forms return a Work to
// wait() on later — that is what lets DDP overlap a bucket's all_reduce with the rest of backward.
//
// A collective that some rank never joins fails on the others after `timeout` with a CommError naming the
// operation, its sequence number, its size and the ranks that arrived. With DISTLAB_DEBUG=detail each
// collective first exchanges a fingerprint (op, sequence, count, dtype) through the store, so ranks that
// call different collectives fail at once, naming both sides.
//
// process_group.cpp: connecting, the queue, the timeouts and the collectives over Gloo's own algorithms;
// process_group_p2p.cpp: point-to-point send/recv and our ring reduce-scatter on Gloo's unbound buffers.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/store.h"
#include "core/perf/trace.h"
#include "core/tensor/dtype.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace distlab {

class DeviceGroup;  // core/comm/device_group.h

enum class ReduceOp { sum, avg, max };
const char* reduce_op_name(ReduceOp op);

struct CommCounters {
  int64_t calls = 0;
  int64_t bytes_sent = 0;      // by this rank, as the algorithm moves them (ring: 2(n-1)/n·S for all_reduce)
  int64_t bytes_received = 0;
  // measured: the time the collectives took on this rank, start to finish, waiting for late peers
  // included (Gloo: each one's run on the group's thread; NCCL: CUDA events around it on the GPU). The
  // cost model's modeled time is what to hold it against. 0 on the fake world, which moves nothing.
  double seconds = 0;
  CommCounters& operator+=(const CommCounters& o) {
    calls += o.calls;
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    seconds += o.seconds;
    return *this;
  }
};

struct ProcessGroupOptions {
  Millis timeout{300000};     // dist.timeout_s
  bool fingerprints = false;  // DISTLAB_DEBUG=detail
  bool track_arrivals = true; // note arrivals in the store, so a timeout can say who never came
  std::string host = "127.0.0.1";  // this rank's address for Gloo's connections
  int64_t segment_floats = 1 << 18;  // the ring reduce-scatter's pipeline unit (1 MiB of f32; tests use tiny ones)
};
// Options from the environment: DISTLAB_DEBUG=detail turns fingerprints on.
ProcessGroupOptions options_from_env(Millis timeout);

// Each rank notes in the store what it called at each place of its group's sequence, so a timeout can name
// what every rank called there. The notes live in this many slots (place % slots): a rank is never that
// many collectives ahead of another, and a run of a million steps keeps as many keys as one of ten.
constexpr int64_t kArrivalSlots = 1024;

class Work {
 public:
  void wait();  // blocks until the operation finished; rethrows its error
  bool done();
  // Runs f on the waiting thread once the operation has finished, after what was registered before it
  // (a cuda rank's staged collective copies its host result back up here: core/parallel/comm_buffers.h).
  void then(std::function<void()> f);
  // The Work of an operation queued elsewhere (an NCCL collective on a GPU's stream): wait() runs
  // `wait_for`, which returns once it has finished or throws. done() is true at once: ask wait().
  static std::shared_ptr<Work> elsewhere(std::function<void()> wait_for);

 private:
  friend class ProcessGroup;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void()> on_wait_;  // records the trace's wait event on the caller's thread
};

class ProcessGroup {
 public:
  // Joins `size` ranks through `store` (every rank calls this with its rank). `trace` (optional) receives
  // collective and wait events for the cost model. `name` prefixes the group's keys in the store.
  ProcessGroup(Store& store, int rank, int size, ProcessGroupOptions opts = {}, Trace* trace = nullptr,
               std::string name = "world", std::vector<int> global_ranks = {});
  ~ProcessGroup();
  // The fake world (dist.fake_world_size): rank `rank` of `size` ranks that do not exist. Nothing is sent
  // and no data is touched (it serves the meta device); every collective is traced and counted as the real
  // algorithm would move it, and is done at once — so one rank of a 1024-rank job can be planned alone.
  struct Fake {};
  ProcessGroup(Fake, int rank, int size, Trace* trace = nullptr, std::string name = "world");
  bool is_fake() const { return fake_; }
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }

  // data (n), the same n on every rank; avg divides the sum by size()
  // wire bf16/f16 (precision.reduce_dtype): the values travel in 16 bits, each hop of the ring adds in f32
  // and rounds what it passes on (NCCL's 16-bit rings do the same); half the bytes, 16-bit results
  void all_reduce(float* data, int64_t n, ReduceOp op = ReduceOp::sum, DType wire = DType::f32) {
    all_reduce_async(data, n, op, wire)->wait();
  }
  // in (size·n) -> out (n): rank r gets the reduction of every rank's slot r (a ring: n-1 steps)
  void reduce_scatter(float* out, const float* in, int64_t n, ReduceOp op = ReduceOp::sum, DType wire = DType::f32) {
    reduce_scatter_async(out, in, n, op, wire)->wait();
  }
  // in (n) -> out (size·n): slot r holds rank r's input. wire bf16/f16: the values travel in 16 bits (half
  // the bytes; exact for values that are 16-bit already, as gathered 16-bit parameters are)
  void all_gather(float* out, const float* in, int64_t n, DType wire = DType::f32) { all_gather_async(out, in, n, wire)->wait(); }
  void broadcast(float* data, int64_t n, int root) { broadcast_async(data, n, root)->wait(); }
  void barrier();
  // point to point; a send pairs with the matching recv of the same tag, in order
  void send(const float* data, int64_t n, int dst, int tag = 0);
  void recv(float* data, int64_t n, int src, int tag = 0);
  // A send (to dst, n_out floats) and a receive (from src, n_in floats) posted together and then both
  // awaited — Megatron's batch_isend_irecv: two neighbours that send to each other at once (a pipeline's
  // activations one way, gradients the other) do not deadlock. dst or src < 0: that half is absent. Each
  // half pairs with the peer's of the same tag, in order.
  void send_recv(const float* out, int64_t n_out, int dst, int out_tag, float* in, int64_t n_in, int src, int in_tag);
  // The same, posted: it runs on the group's thread while the caller computes (ring attention overlaps each
  // block's exchange with the block's math); `out` and `in` are the group's until wait()
  std::shared_ptr<Work> send_recv_async(const float* out, int64_t n_out, int dst, int out_tag, float* in, int64_t n_in, int src,
                                        int in_tag);

  std::shared_ptr<Work> all_reduce_async(float* data, int64_t n, ReduceOp op = ReduceOp::sum, DType wire = DType::f32);
  std::shared_ptr<Work> reduce_scatter_async(float* out, const float* in, int64_t n, ReduceOp op = ReduceOp::sum, DType wire = DType::f32);
  std::shared_ptr<Work> all_gather_async(float* out, const float* in, int64_t n, DType wire = DType::f32);
  std::shared_ptr<Work> broadcast_async(float* data, int64_t n, int root);

  // A group of some of this group's ranks (ranks in this group's numbering). Only members call it, each
  // with the same list, in the same order relative to their other new_group calls.
  std::unique_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);

  std::map<std::string, CommCounters> counters() const;  // per operation name
  CommCounters total_counters() const;
  // The group's collectives on device memory (dist.backend = "nccl"): the strategies' flat buffers on a
  // cuda rank go through it (core/parallel/comm_buffers.h), host memory through Gloo. PyTorch's
  // init_process_group(backend="cpu:gloo,cuda:nccl") is the same idea: one group, a backend per device.
  // Not owned; nullptr (the default): Gloo over host copies.
  void set_device_backend(DeviceGroup* d) { device_backend_ = d; }
  DeviceGroup* device_backend() const { return device_backend_; }
  void reset_counters();
  int64_t sequence() const { return next_seq_; }  // collectives issued so far
  Store& store() { return store_; }

 private:
  struct Call {
    const char* op;
    int64_t seq, count;  // seq -1: point-to-point, outside the group's collective sequence
    std::function<void(int64_t id)> body;  // given wire_id(): the tag its messages carry
    std::shared_ptr<Work> work;
    std::string detail;  // what else every rank must agree on: the reduce op, the broadcast root
  };
  std::shared_ptr<Work> submit(const char* op, int64_t count, int64_t payload_bytes, bool collective,
                               std::function<void(int64_t seq)> body, std::string detail = "");
  void run_loop();
  void execute(Call& c);
  void check_fingerprint(const Call& c);
  static std::string describe(const Call& c);  // "all_reduce of 864 f32 (sum)"
  static uint32_t wire_id(const Call& c);       // the tag of its messages: sequence and what it is
  [[noreturn]] void fail(const Call& c, const std::string& what);
  void count(const char* op, int64_t sent, int64_t received);
  void ring_reduce_scatter(float* out, const float* in, int64_t n, ReduceOp op, int64_t seq, DType wire = DType::f32);
  std::shared_ptr<Work> all_reduce_16_async(float* data, int64_t n, ReduceOp op, DType wire);
  void gather_16(float* out, const float* in, int64_t n, DType wire, int64_t tag);
  std::vector<float> rs_scratch_;      // the ring reduce-scatter's receive and partial-sum buffers, reused
  std::vector<uint16_t> rs_scratch16_; // and its 16-bit staging, with a 16-bit wire
  uint64_t p2p_slot(int peer, int tag, bool sending);
  // the trace's record of one message (a two-rank "collective" the cost model pairs by sender, receiver,
  // tag and index) and of the wait for it
  void trace_p2p(const char* op, int64_t bytes, int sender, int receiver, int tag, uint64_t slot, bool wait);

  DeviceGroup* device_backend_ = nullptr;
  std::unique_ptr<MemoryStore> own_store_;  // the fake world's: nobody else shares it
  Store& store_;
  PrefixStore keys_;
  bool fake_ = false;
  int rank_, size_;
  ProcessGroupOptions opts_;
  Trace* trace_;
  std::string name_;
  std::vector<int> global_ranks_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  int64_t next_seq_ = 0;
  int subgroups_ = 0;
  std::map<std::pair<int, int>, uint64_t> p2p_count_;  // (peer, tag) -> messages so far, per direction sign
  mutable std::mutex counters_mu_;
  std::map<std::string, CommCounters> counters_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Call> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace distlab
