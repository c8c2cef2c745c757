#include "core/perf/trace.h"

namespace distlab {

void Trace::record(const char* name, Stream s, double flops, double bytes, double t0, double t1, bool scales, bool low) {
  flops_ += flops;
  bytes_ += bytes;
  count_++;
  if (!keep_events_) return;
  TraceEvent e;
  e.name = name;
  e.stream = s;
  e.flops = flops;
  e.bytes = bytes;
  e.t_begin_us = t0;
  e.t_end_us = t1;
  e.scales_with_batch = scales;
  e.low_precision = low;
  events_.push_back(std::move(e));
}

void Trace::record(TraceEvent e) {
  count_++;
  if (keep_events_) events_.push_back(std::move(e));
}

}  // namespace distlab
