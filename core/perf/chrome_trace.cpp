#include "core/perf/chrome_trace.h"

#include "core/ckpt/atomic_file.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/util/error.h"

namespace distlab {

namespace {

using nlohmann::json;

int tid_of(Stream s) { return s == Stream::comm ? 1 : 0; }

const char* category_of(EventKind k) {
  switch (k) {
    case EventKind::compute: return "compute";
    case EventKind::collective: return "collective";
    case EventKind::wait: return "wait";
  }
  return "compute";
}

// "M" (metadata) events that give each pid and tid a name in the viewer.
void add_names(json& events, int n_ranks) {
  for (int r = 0; r < n_ranks; r++) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 1}, {"args", {{"name", "comm"}}}});
  }
}

json span(int rank, Stream s, EventKind k, const std::string& name, double ts_us, double dur_us, json args) {
  return {{"ph", "X"}, {"name", name}, {"cat", category_of(k)}, {"pid", rank}, {"tid", tid_of(s)},
          {"ts", ts_us}, {"dur", dur_us}, {"args", std::move(args)}};
}

}  // namespace

std::string chrome_trace_json(const ReplayResult& modeled) {
  json events = json::array();
  add_names(events, int(modeled.ranks.size()));
  for (const ModeledEvent& e : modeled.events) {
    json args = e.kind == EventKind::compute ? json{{"flops", e.flops}, {"bytes", e.bytes}}
                                             : json{{"bytes", e.bytes}, {"group", e.group}, {"seq", e.seq}};
    events.push_back(span(e.rank, e.stream, e.kind, e.name, e.start_s * 1e6, (e.end_s - e.start_s) * 1e6, std::move(args)));
  }
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"},
              {"otherData", {{"timeline", "modeled"}, {"profile", modeled.profile}, {"step_s", modeled.step_s}}}};
  return doc.dump();
}

std::string chrome_trace_json(const std::vector<std::vector<TraceEvent>>& measured) {
  json events = json::array();
  add_names(events, int(measured.size()));
  for (int r = 0; r < int(measured.size()); r++) {
    for (const TraceEvent& e : measured[r]) {
      json args = e.kind == EventKind::compute
                      ? json{{"flops", e.flops}, {"bytes", e.bytes}}
                      : json{{"op", e.op}, {"bytes", e.payload_bytes}, {"group", e.group}, {"seq", e.seq},
                             {"group_size", e.group_size}};
      // A collective runs on the comm stream and a wait blocks the compute stream, whatever `stream` says.
      const Stream s = e.kind == EventKind::collective ? Stream::comm : e.kind == EventKind::wait ? Stream::compute : e.stream;
      events.push_back(span(r, s, e.kind, e.name, e.t_begin_us, e.t_end_us - e.t_begin_us, std::move(args)));
    }
  }
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", {{"timeline", "measured"}}}};
  return doc.dump();
}

void write_chrome_trace(const std::string& path, const std::string& json_text) {
  AtomicFile f(path);  // a failed write leaves an earlier trace as it was
  f.write(json_text);
  f.commit();
}

}  // namespace distlab
