#include "core/perf/trace.h"

namespace distlab {

void Trace::record(const char* name, Stream s, double flops, double bytes, double t0, double t1, bool scales, bool low,
                   const KernelShape* shape) {
  flops_ += flops;
  if (recompute_) recompute_flops_ += flops;
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
  e.on_host = on_host_;
  e.recompute = recompute_;
  if (shape) e.shape = *shape;
  events_.push_back(std::move(e));
}

void Trace::record_copy(const char* name, double bytes) {
  count_++;
  if (!keep_events_) return;
  TraceEvent e;
  e.name = name;
  e.link_bytes = bytes;
  e.scales_with_batch = false;
  e.t_begin_us = e.t_end_us = now_us();
  events_.push_back(std::move(e));
}

void Trace::mark(const std::string& name, bool begin) {
  if (!keep_events_) return;
  TraceEvent e;
  e.name = (begin ? "+" : "-") + name;
  e.kind = EventKind::marker;
  e.t_begin_us = e.t_end_us = now_us();
  events_.push_back(std::move(e));
}

void Trace::record(TraceEvent e) {
  count_++;
  if (keep_events_) events_.push_back(std::move(e));
}

}  // namespace distlab
