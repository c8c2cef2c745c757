#include "core/cuda/nccl_group.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "core/cuda/check.h"
#include "core/ops/cuda/ops.h"

namespace distlab {

namespace {

using Clock = std::chrono::steady_clock;

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;  // NCCL >= 2.10: the sum divided once, at the end
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::u8: return ncclUint8;
  }
  return ncclFloat32;
}

void nccl_check(ncclResult_t r, const char* call, const std::string& what) {
  if (r == ncclSuccess) return;
  throw CommError(fmt::format("{} failed in {}: {} ({})", call, what, ncclGetErrorString(r), int(r)),
                  r == ncclUnhandledCudaError || r == ncclSystemError
                      ? "NCCL_DEBUG=WARN names the failing call; check that each rank has a GPU of its own (CUDA_VISIBLE_DEVICES)"
                      : "NCCL_DEBUG=INFO shows how the ranks connected");
}

// where rank `rank` notes what it called at place `seq`: one of kArrivalSlots slots (process_group.h)
std::string seq_key(const std::string& name, int64_t seq, int rank) {
  return fmt::format("{}/nccl/{}/{}", name, seq % kArrivalSlots, rank);
}

}  // namespace

const char* nccl_version_string() {
  static const std::string v = [] {
    int code = 0;
    ncclGetVersion(&code);  // 22809 = 2.28.9
    return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  }();
  return v.c_str();
}

NcclGroup::NcclGroup(Store& store, int rank, int size, CudaContext& cx, Millis timeout, Trace* trace, std::string name)
    : store_(store), rank_(rank), size_(size), cx_(cx), timeout_(timeout), trace_(trace), name_(std::move(name)) {
  DL_CUDA(cudaSetDevice(cx.device()));
  // the unique id through the store: rank 0 makes it, every rank reads it
  const std::string id_key = name_ + "/nccl/unique_id";
  ncclUniqueId id{};
  if (rank == 0) {
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", "group " + name_);
    store.set(id_key, std::vector<char>(id.internal, id.internal + sizeof id.internal));
  }
  std::vector<char> bytes;
  try {
    store.wait({id_key}, timeout);
    bytes = store.get(id_key);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {} of group {}: rank 0's NCCL id did not arrive within {} s ({})", rank, name_,
                                timeout.count() / 1000, e.what()),
                    "rank 0 failed or never started: its own error comes first in the launcher's output");
  }
  if (bytes.size() != sizeof id.internal)
    throw CommError(fmt::format("rank {} of group {}: the NCCL id in the store is {} bytes, not {}", rank, name_, bytes.size(),
                                sizeof id.internal),
                    "two jobs share one store prefix: give each its own master port");
  std::copy(bytes.begin(), bytes.end(), id.internal);
  // ncclCommInitRank blocks until every rank has called it: join only once all are known to be there
  store.add(name_ + "/nccl/joined", 1);
  const auto deadline = Clock::now() + timeout;
  while (store.add(name_ + "/nccl/joined", 0) < size) {
    if (Clock::now() > deadline)
      throw CommError(fmt::format("rank {} of group {}: {} of {} ranks joined the NCCL group within {} s", rank, name_,
                                  store.add(name_ + "/nccl/joined", 0), size, timeout.count() / 1000),
                      "a rank failed before it joined: its error comes first in the launcher's output");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  nccl_check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank",
             fmt::format("rank {} of {} on GPU {}", rank, size, cx.device()));
}

NcclGroup::~NcclGroup() {
  if (!comm_) return;
  if (aborted_) return;  // ncclCommAbort freed it
  cudaStreamSynchronize(cx_.comm());
  ncclCommDestroy(comm_);
}

std::shared_ptr<NcclWork> NcclGroup::launch(const char* op, int64_t count, const std::string& detail, int64_t bytes_sent,
                                            int64_t bytes_received) {
  if (aborted_) throw CommError(fmt::format("group {} was aborted after a timeout: no collective can run on it", name_), "");
  auto w = std::make_shared<NcclWork>();
  w->group_ = this;
  w->seq_ = seq_++;
  w->what_ = fmt::format("{} #{} of {} f32{}", op, w->seq_, count, detail.empty() ? "" : " (" + detail + ")");
  store_.set_string(seq_key(name_, w->seq_, rank_), w->what_);  // for a timeout's message on any rank
  // the input is whatever the compute stream has queued so far: the comm stream waits for it on the GPU
  cudaEvent_t ready;
  DL_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  DL_CUDA(cudaEventRecord(ready, cx_.compute()));
  DL_CUDA(cudaStreamWaitEvent(cx_.comm(), ready, 0));
  DL_CUDA(cudaEventDestroy(ready));  // safe: destruction waits for the recorded work
  DL_CUDA(cudaEventCreate(&w->start_));  // timed: the collective's measured seconds
  DL_CUDA(cudaEventCreate(&w->done_));
  DL_CUDA(cudaEventRecord(w->start_, cx_.comm()));
  w->counter_ = op;
  CommCounters& c = counters_[op];
  c.calls++;
  c.bytes_sent += bytes_sent;
  c.bytes_received += bytes_received;
  if (trace_) {  // as the Gloo group records it: the cost model and the comm report see NCCL's collectives too
    TraceEvent e;
    e.name = op;
    e.kind = EventKind::collective;
    e.stream = Stream::comm;
    e.op = op;
    e.payload_bytes = count * 4;  // the f32 tensor's bytes
    e.group_size = size_;
    e.seq = w->seq_;
    e.group = name_;
    e.t_begin_us = e.t_end_us = trace_->now_us();
    trace_->record(e);
    w->op_ = op;
  }
  return w;
}

CommCounters NcclGroup::total_counters() const {
  CommCounters t;
  for (const auto& [op, c] : counters_) t += c;
  return t;
}

void* NcclGroup::scratch(NcclWork& w, int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 2);
  void* p = cx_.allocator().alloc(bytes);
  if (!p) throw OutOfMemoryError(fmt::format("no GPU memory for the 16-bit copy of {}", w.what_), "a smaller bucket or unit");
  w.scratch_.push_back({p, bytes});  // back to the cache once the compute stream has waited for the work (wait())
  return p;
}

std::shared_ptr<NcclWork> NcclGroup::all_reduce_async(float* data, int64_t n, ReduceOp op, DType wire) {
  const double S = double(n) * dtype_size(wire);
  const int64_t ring = int64_t(2.0 * (size_ - 1) / size_ * S);  // a ring: each rank sends and receives this
  auto w = launch("all_reduce", n, reduce_op_name(op), ring, ring);
  if (wire == DType::f32) {
    nccl_check(ncclAllReduce(data, data, size_t(n), ncclFloat32, nccl_op(op), comm_, cx_.comm()), "ncclAllReduce", w->what_);
  } else {  // 16 bits on the wire: narrowed, reduced, widened, all on the comm stream
    void* narrow = scratch(*w, n * 2);
    cuda::convert_on(cx_.comm(), data, DType::f32, narrow, wire, n);
    nccl_check(ncclAllReduce(narrow, narrow, size_t(n), nccl_type(wire), nccl_op(op), comm_, cx_.comm()), "ncclAllReduce", w->what_);
    cuda::convert_on(cx_.comm(), narrow, wire, data, DType::f32, n);
  }
  DL_CUDA(cudaEventRecord(w->done_, cx_.comm()));
  return w;
}

std::shared_ptr<NcclWork> NcclGroup::reduce_scatter_async(float* out, const float* in, int64_t n, ReduceOp op, DType wire) {
  const int64_t ring = int64_t(double(size_ - 1) * double(n) * dtype_size(wire));
  auto w = launch("reduce_scatter", n, reduce_op_name(op), ring, ring);
  if (wire == DType::f32) {
    nccl_check(ncclReduceScatter(in, out, size_t(n), ncclFloat32, nccl_op(op), comm_, cx_.comm()), "ncclReduceScatter", w->what_);
  } else {  // the size·n inputs narrowed, the n results widened
    void* narrow_in = scratch(*w, n * size_ * 2);
    void* narrow_out = scratch(*w, n * 2);
    cuda::convert_on(cx_.comm(), in, DType::f32, narrow_in, wire, n * size_);
    nccl_check(ncclReduceScatter(narrow_in, narrow_out, size_t(n), nccl_type(wire), nccl_op(op), comm_, cx_.comm()), "ncclReduceScatter",
               w->what_);
    cuda::convert_on(cx_.comm(), narrow_out, wire, out, DType::f32, n);
  }
  DL_CUDA(cudaEventRecord(w->done_, cx_.comm()));
  return w;
}

std::shared_ptr<NcclWork> NcclGroup::all_gather_async(float* out, const float* in, int64_t n, DType wire) {
  const int64_t ring = int64_t(double(size_ - 1) * double(n) * dtype_size(wire));
  auto w = launch("all_gather", n, "", ring, ring);
  if (wire == DType::f32) {
    nccl_check(ncclAllGather(in, out, size_t(n), ncclFloat32, comm_, cx_.comm()), "ncclAllGather", w->what_);
  } else {  // exact for values that are 16-bit already (gathered 16-bit parameters)
    void* narrow_in = scratch(*w, n * 2);
    void* narrow_out = scratch(*w, n * size_ * 2);
    cuda::convert_on(cx_.comm(), in, DType::f32, narrow_in, wire, n);
    nccl_check(ncclAllGather(narrow_in, narrow_out, size_t(n), nccl_type(wire), comm_, cx_.comm()), "ncclAllGather", w->what_);
    cuda::convert_on(cx_.comm(), narrow_out, wire, out, DType::f32, n * size_);
  }
  DL_CUDA(cudaEventRecord(w->done_, cx_.comm()));
  return w;
}

std::shared_ptr<NcclWork> NcclGroup::broadcast_async(float* data, int64_t n, int root) {
  // the root sends the buffer, the others receive it (the ring's relaying left out, as in the Gloo group)
  auto w = launch("broadcast", n, fmt::format("root {}", root), rank_ == root ? int64_t(n) * 4 : 0, rank_ == root ? 0 : int64_t(n) * 4);
  nccl_check(ncclBroadcast(data, data, size_t(n), ncclFloat32, root, comm_, cx_.comm()), "ncclBroadcast", w->what_);
  DL_CUDA(cudaEventRecord(w->done_, cx_.comm()));
  return w;
}

void NcclGroup::barrier() {
  void* one = cx_.allocator().alloc(4);
  if (!one) throw OutOfMemoryError("no GPU memory for the barrier's 4 bytes", "");
  DL_CUDA(cudaMemsetAsync(one, 0, 4, cx_.compute()));
  auto w = all_reduce_async(static_cast<float*>(one), 1);
  w->synchronize();
  cx_.allocator().free(one, 4);
}

void NcclGroup::send(const float* data, int64_t n, int dst) {
  auto w = launch("send", n, fmt::format("to {}", dst), int64_t(n) * 4, 0);
  nccl_check(ncclSend(data, size_t(n), ncclFloat32, dst, comm_, cx_.comm()), "ncclSend", w->what_);
  DL_CUDA(cudaEventRecord(w->done_, cx_.comm()));
  w->synchronize();
}

void NcclGroup::recv(float* data, int64_t n, int src) {
  auto w = launch("recv", n, fmt::format("from {}", src), 0, int64_t(n) * 4);
  nccl_check(ncclRecv(data, size_t(n), ncclFloat32, src, comm_, cx_.comm()), "ncclRecv", w->what_);
  DL_CUDA(cudaEventRecord(w->done_, cx_.comm()));
  w->synchronize();
}

void NcclGroup::check_async(const std::string& what) {
  ncclResult_t r = ncclSuccess;
  nccl_check(ncclCommGetAsyncError(comm_, &r), "ncclCommGetAsyncError", what);
  if (r != ncclSuccess && r != ncclInProgress) {
    ncclCommAbort(comm_);
    aborted_ = true;
    nccl_check(r, "an asynchronous NCCL operation", what);
  }
}

void NcclGroup::timed_out(const NcclWork& w) {
  // what every rank called at this place in the sequence, from the keys each wrote when it got there
  std::string calls;
  std::vector<int> missing;
  for (int r = 0; r < size_; r++) {
    const std::string key = seq_key(name_, w.seq_, r);
    const std::string theirs = store_.check({key}) ? store_.get_string(key) : "";
    if (theirs.find(fmt::format(" #{} of", w.seq_)) != std::string::npos) calls += fmt::format("\n  rank {} called {}", r, theirs);
    else {  // nothing, or an older collective's note in the slot
      calls += fmt::format("\n  rank {} never got there", r);
      missing.push_back(r);
    }
  }
  ncclCommAbort(comm_);  // the kernel waiting for the missing ranks stops; the group is unusable from here
  aborted_ = true;
  CommError e(fmt::format("rank {}: {} did not finish within {} s on group {} (NCCL aborted):{}", rank_, w.what_,
                          timeout_.count() / 1000, name_, calls),
              missing.empty() ? "every rank got there, but they called different collectives or sizes: a rank-dependent branch"
                              : "the ranks that never got there are stuck or failed earlier: their errors come first");
  e.waiting_for = missing;
  throw e;
}

NcclWork::~NcclWork() {
  if (!scratch_.empty()) {  // never waited for: the compute stream (the allocator's) must still not reuse it early
    // (re-recorded here: a launch that threw after queuing a conversion never recorded it)
    cudaEventRecord(done_, group_->cx_.comm());
    cudaStreamWaitEvent(group_->cx_.compute(), done_, 0);
    free_scratch();
  }
  if (start_) cudaEventDestroy(start_);
  if (done_) cudaEventDestroy(done_);
}

void NcclWork::wait() {
  DL_CUDA(cudaStreamWaitEvent(group_->cx_.compute(), done_, 0));
  if (Trace* t = group_->trace_; t && !op_.empty()) {  // the compute stream waits for this collective from here
    TraceEvent w;
    w.name = "wait " + op_;
    w.kind = EventKind::wait;
    w.stream = Stream::compute;
    w.op = op_;
    w.seq = seq_;
    w.group = group_->name_;
    w.t_begin_us = w.t_end_us = t->now_us();
    t->record(w);
    op_.clear();  // once
  }
  free_scratch();  // the allocator's blocks are reused in compute-stream order: safe from here
}

void NcclWork::free_scratch() {
  for (const auto& [p, bytes] : scratch_) group_->cx_.allocator().free(p, bytes);
  scratch_.clear();
}

bool NcclWork::done() { return cudaEventQuery(done_) == cudaSuccess; }

void NcclWork::synchronize() {
  const auto deadline = Clock::now() + group_->timeout_;
  for (;;) {
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) cuda_fail(q, ("cudaEventQuery, waiting for " + what_).c_str(), __FILE__, __LINE__);
    (void)cudaGetLastError();  // "not ready" is no error: leave none behind for the next launch's check
    group_->check_async(what_);
    if (Clock::now() > deadline) group_->timed_out(*this);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (!counter_.empty()) {  // the GPU's own time for it, start event to done event
    float ms = 0;
    DL_CUDA(cudaEventElapsedTime(&ms, start_, done_));
    group_->counters_[counter_].seconds += double(ms) * 1e-3;
    counter_.clear();
  }
  wait();  // and the compute stream too, so later kernels see the result
}

}  // namespace distlab
