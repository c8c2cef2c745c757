// Every kernel opens an OpScope: it times the kernel and, when it closes, records one trace event with the
// kernel's FLOPs and bytes. On the meta device the kernel returns right after opening it, so meta and cpu
// record identical FLOPs and bytes for the same model.
#pragma once
#include "core/tensor/runtime.h"

namespace distlab {

class OpScope {
 public:
  // scales_with_batch: false for work that doesn't grow with the micro-batch (optimizer steps)
  OpScope(Runtime& rt, const char* name, double flops, double bytes, bool scales_with_batch = true)
      : rt_(rt), name_(name), flops_(flops), bytes_(bytes), scales_(scales_with_batch), t0_(rt.trace.now_us()) {}
  ~OpScope() { rt_.trace.record(name_, Stream::compute, flops_, bytes_, t0_, rt_.trace.now_us(), scales_); }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  Runtime& rt_;
  const char* name_;
  double flops_, bytes_;
  bool scales_;
  double t0_;
};

}  // namespace distlab
