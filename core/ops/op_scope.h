// Every kernel opens an OpScope: it times the kernel and, when it closes, records one trace event with the
// kernel's FLOPs and bytes. On the meta device the kernel returns right after opening it, so meta and cpu
// record identical FLOPs and bytes for the same model.
// Kernels count 4 bytes per value. Under mixed precision (rt.dtype 16-bit) the activations they read and
// write are 2 bytes, so the batch-sized traffic is halved; an op on the autocast table's low list is marked
// for the profile's bf16/fp16 FLOP rate (core/ops/autocast.h).
#pragma once
#include "core/ops/autocast.h"
#include "core/tensor/runtime.h"

namespace distlab {

class OpScope {
 public:
  // scales_with_batch: false for work that doesn't grow with the micro-batch (optimizer steps)
  OpScope(Runtime& rt, const char* name, double flops, double bytes, bool scales_with_batch = true)
      : rt_(rt), name_(name), flops_(flops), bytes_(bytes), scales_(scales_with_batch), t0_(rt.trace.now_us()) {
    if (rt.dtype != DType::f32) {
      if (scales_) bytes_ *= double(dtype_size(rt.dtype)) / 4;
      low_ = autocast_rule(name) == RunsIn::low;
    }
  }
  ~OpScope() { rt_.trace.record(name_, Stream::compute, flops_, bytes_, t0_, rt_.trace.now_us(), scales_, low_, &shape_); }
  // The kernel's shapes, for the cost model: its i-th GEMM (C m×n = A m×k · B k×n), its attention
  void gemm(int i, int64_t m, int64_t n, int64_t k) { shape_.gemm[i] = {m, n, k}; }
  void attention(int64_t heads, int64_t seq, int64_t head_dim) { shape_.heads = heads, shape_.seq = seq, shape_.head_dim = head_dim; }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  Runtime& rt_;
  const char* name_;
  double flops_, bytes_;
  bool scales_;
  bool low_ = false;
  double t0_;
  KernelShape shape_;
};

}  // namespace distlab
