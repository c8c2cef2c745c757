// Trace events: every kernel and (later) every collective records what it did — FLOPs, bytes moved, the
// stream it ran on, wall time. Totals per step feed the metrics and the cost model; the event list is kept
// only when a trace file was asked for.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace distlab {

enum class Stream { compute, comm };

struct TraceEvent {
  std::string name;  // "matmul_forward", "conv2d_backward", ...
  Stream stream = Stream::compute;
  double flops = 0;
  double bytes = 0;    // bytes read + written (a memory-traffic estimate for the cost model)
  double t_begin_us = 0;  // wall clock, microseconds since the trace's epoch
  double t_end_us = 0;
};

class Trace {
 public:
  Trace() : epoch_(std::chrono::steady_clock::now()) {}
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_).count();
  }
  void record(const char* name, Stream s, double flops, double bytes, double t_begin_us, double t_end_us);
  void keep_events(bool on) { keep_events_ = on; }
  const std::vector<TraceEvent>& events() const { return events_; }
  void clear_events() { events_.clear(); }
  // running totals since the last reset_totals()
  double flops() const { return flops_; }
  double bytes() const { return bytes_; }
  int64_t count() const { return count_; }
  void reset_totals() { flops_ = bytes_ = 0; count_ = 0; }

 private:
  std::chrono::steady_clock::time_point epoch_;
  bool keep_events_ = false;
  std::vector<TraceEvent> events_;
  double flops_ = 0, bytes_ = 0;
  int64_t count_ = 0;
};

}  // namespace distlab
