// Trace events to and from JSON, so ranks can hand their step's events to rank 0 through the store.
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

#include "core/perf/trace.h"

namespace distlab {

nlohmann::json events_to_json(const std::vector<TraceEvent>& events);
std::vector<TraceEvent> events_from_json(const nlohmann::json& j);

}  // namespace distlab
