// NcclGroup: the collectives of ProcessGroup (core/comm/process_group.h) over NCCL, on device buffers,
// one GPU per rank. Read process_group.h first: the same operations, the same sequence numbers, the
// same timeout message; only the transport differs.
//
//   - The NCCL unique id travels through our rendezvous store: rank 0 creates it, the others read it, then
//     every rank joins with ncclCommInitRank.
//   - Every collective runs on the context's communication stream. It first waits (on the GPU, not the host)
//     for what the compute stream has queued so far, so its input is ready; its NcclWork records an event
//     when it is done. NcclWork::wait() makes the compute stream wait for that event, which is
//     torch.distributed's Work.wait() on CUDA: the host never blocks, and backward's later kernels overlap
//     the bucket's all-reduce, as DDP needs. NcclWork::synchronize() blocks the host.
//   - A collective some rank never joins would hang the GPU. synchronize() (and the step's end) polls the
//     event and ncclCommGetAsyncError; past the timeout it aborts the communicator (ncclCommAbort) and
//     throws a CommError naming the collective, its sequence number, its size, and what each rank called
//     there, from the arrival keys each rank writes into the store, as the Gloo group does.
//   - Each collective runs between two timed events; once the host has synchronized on it, their
//     elapsed time is added to the operation's measured seconds (CommCounters::seconds).
//   - NCCL requires distinct GPUs within a communicator: ranks = GPUs.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/context.h"
#include "core/comm/process_group.h"  // ReduceOp, CommCounters, Store, Millis
#include "core/comm/errors.h"

namespace distlab {

class NcclGroup;

class NcclWork {
 public:
  ~NcclWork();
  void wait();         // the compute stream waits for the collective (the host does not)
  void synchronize();  // the host waits; past the group's timeout: abort and CommError
  bool done();

 private:
  friend class NcclGroup;
  NcclGroup* group_ = nullptr;
  cudaEvent_t start_ = nullptr, done_ = nullptr;  // around the collective on the comm stream, with timing
  std::string op_;    // "all_reduce" until its wait is traced
  std::string counter_;  // "all_reduce": whose measured seconds the events add to, once (synchronize())
  std::string what_;  // "all_reduce #12 of 1048576 f32 (sum)"
  int64_t seq_ = 0;
  std::vector<std::pair<void*, int64_t>> scratch_;  // a 16-bit wire's copies, freed once the compute stream waits for the work
  void free_scratch();
};

class NcclGroup {
 public:
  // Every rank calls this with its rank; `cx` is the rank's GPU. Throws CommError when the id does not
  // arrive within the timeout, CudaError/CommError when NCCL refuses (naming ncclGetErrorString's reason).
  NcclGroup(Store& store, int rank, int size, CudaContext& cx, Millis timeout, Trace* trace = nullptr, std::string name = "world");
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // As ProcessGroup's, on device pointers. wire bf16/f16: the values travel (and are summed) in 16 bits,
  // converted into scratch on the comm stream and back; half the bytes.
  std::shared_ptr<NcclWork> all_reduce_async(float* data, int64_t n, ReduceOp op = ReduceOp::sum, DType wire = DType::f32);
  std::shared_ptr<NcclWork> reduce_scatter_async(float* out, const float* in, int64_t n, ReduceOp op = ReduceOp::sum,
                                                 DType wire = DType::f32);
  std::shared_ptr<NcclWork> all_gather_async(float* out, const float* in, int64_t n, DType wire = DType::f32);
  std::shared_ptr<NcclWork> broadcast_async(float* data, int64_t n, int root);
  void all_reduce(float* data, int64_t n, ReduceOp op = ReduceOp::sum, DType wire = DType::f32) {
    all_reduce_async(data, n, op, wire)->synchronize();
  }
  void barrier();
  // point to point on the communication stream, awaited by the host
  void send(const float* data, int64_t n, int dst);
  void recv(float* data, int64_t n, int src);

  CommCounters total_counters() const;
  std::map<std::string, CommCounters> counters() const { return counters_; }  // per operation name
  int64_t sequence() const { return seq_; }

 private:
  friend class NcclWork;
  std::shared_ptr<NcclWork> launch(const char* op, int64_t count, const std::string& detail, int64_t bytes_sent,
                                   int64_t bytes_received);
  void* scratch(NcclWork& w, int64_t bytes);  // comm-stream scratch, owned by w
  void check_async(const std::string& what);  // throws CommError if NCCL reported an asynchronous error
  [[noreturn]] void timed_out(const NcclWork& w);

  Store& store_;
  int rank_, size_;
  CudaContext& cx_;
  Millis timeout_;
  Trace* trace_;
  std::string name_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  int64_t seq_ = 0;
  std::map<std::string, CommCounters> counters_;
};

const char* nccl_version_string();  // "2.28.9"

}  // namespace distlab
