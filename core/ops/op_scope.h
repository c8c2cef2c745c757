// Every kernel opens an OpScope: it times the kernel and, when it closes, records one trace event with the
// kernel's FLOPs and bytes. On the meta device the kernel returns right after opening it, so meta and cpu
// record identical FLOPs and bytes for the same model.
#pragma once
#include "core/tensor/runtime.h"

namespace distlab {

class OpScope {
 public:
  OpScope(Runtime& rt, const char* name, double flops, double bytes, Stream s = Stream::compute)
      : rt_(rt), name_(name), flops_(flops), bytes_(bytes), stream_(s), t0_(rt.trace.now_us()) {}
  ~OpScope() { rt_.trace.record(name_, stream_, flops_, bytes_, t0_, rt_.trace.now_us()); }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  Runtime& rt_;
  const char* name_;
  double flops_, bytes_;
  Stream stream_;
  double t0_;
};

}  // namespace distlab
