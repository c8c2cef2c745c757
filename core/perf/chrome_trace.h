// Chrome trace export: the JSON that chrome://tracing and Perfetto (ui.perfetto.dev) open. One process per
// rank ("rank N"), two threads per process: tid 0 "compute", tid 1 "comm". Each span is a complete event
// ("ph": "X") with ts and dur in microseconds.
#pragma once
#include <string>
#include <vector>

#include "core/perf/cost_model.h"
#include "core/perf/trace.h"

namespace distlab {

// The modeled timeline of a replay (times from the cost model, not the clock).
std::string chrome_trace_json(const ReplayResult& modeled);
// Measured events, ranks[r] = rank r's events with their wall times. Each rank's clock starts at its own
// Trace's epoch, so spans of different ranks line up only as well as the ranks started together.
std::string chrome_trace_json(const std::vector<std::vector<TraceEvent>>& measured);
// Writes `json` to `path`; IoError when it can't.
void write_chrome_trace(const std::string& path, const std::string& json);

}  // namespace distlab
