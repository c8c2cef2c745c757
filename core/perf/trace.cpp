#include "core/perf/trace.h"

namespace distlab {

void Trace::record(const char* name, Stream s, double flops, double bytes, double t0, double t1) {
  flops_ += flops;
  bytes_ += bytes;
  count_++;
  if (keep_events_) events_.push_back(TraceEvent{name, s, flops, bytes, t0, t1});
}

}  // namespace distlab
