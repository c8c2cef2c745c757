#include "core/perf/chrome_trace.h"

#include "core/util/atomic_file.h"

#include <fstream>
#include <map>

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
    case EventKind::marker: return "pipeline";
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

// Markers "+F3" ... "-F3" become one span "F3" on a third row of the rank, "pipeline": a pipeline stage's
// forwards and backwards, the gaps between them its bubble.
struct Marks {
  std::map<std::pair<int, std::string>, double> open;
  bool any = false;
  void add(json& events, int rank, const std::string& name, double t_us) {
    any = true;
    const std::string what = name.substr(1);
    if (name[0] == '+') {
      open[{rank, what}] = t_us;
      return;
    }
    auto it = open.find({rank, what});
    if (it == open.end()) return;
    events.push_back({{"ph", "X"}, {"name", what}, {"cat", "pipeline"}, {"pid", rank}, {"tid", 2}, {"ts", it->second},
                      {"dur", t_us - it->second}, {"args", json::object()}});
    open.erase(it);
  }
  void name_rows(json& events, int n_ranks) const {
    if (!any) return;
    for (int r = 0; r < n_ranks; r++)
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 2}, {"args", {{"name", "pipeline (forward, backward)"}}}});
  }
};

}  // namespace

std::string chrome_trace_json(const ReplayResult& modeled) {
  json events = json::array();
  add_names(events, int(modeled.ranks.size()));
  Marks marks;
  for (const ModeledEvent& e : modeled.events) {
    if (e.kind == EventKind::marker) {
      marks.add(events, e.rank, e.name, e.start_s * 1e6);
      continue;
    }
    json args = e.kind == EventKind::compute ? json{{"flops", e.flops}, {"bytes", e.bytes}}
                                             : json{{"bytes", e.bytes}, {"group", e.group}, {"seq", e.seq}};
    events.push_back(span(e.rank, e.stream, e.kind, e.name, e.start_s * 1e6, (e.end_s - e.start_s) * 1e6, std::move(args)));
  }
  marks.name_rows(events, int(modeled.ranks.size()));
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"},
              {"otherData", {{"timeline", "modeled"}, {"profile", modeled.profile}, {"step_s", modeled.step_s}}}};
  return doc.dump();
}

std::string chrome_trace_json(const std::vector<std::vector<TraceEvent>>& measured) {
  json events = json::array();
  add_names(events, int(measured.size()));
  Marks marks;
  for (int r = 0; r < int(measured.size()); r++) {
    for (const TraceEvent& e : measured[r]) {
      if (e.kind == EventKind::marker) {
        marks.add(events, r, e.name, e.t_begin_us);
        continue;
      }
      json args = e.kind == EventKind::compute
                      ? json{{"flops", e.flops}, {"bytes", e.bytes}}
                      : json{{"op", e.op}, {"bytes", e.payload_bytes}, {"group", e.group}, {"seq", e.seq},
                             {"group_size", e.group_size}};
      // A collective runs on the comm stream and a wait blocks the compute stream, whatever `stream` says.
      const Stream s = e.kind == EventKind::collective ? Stream::comm : e.kind == EventKind::wait ? Stream::compute : e.stream;
      events.push_back(span(r, s, e.kind, e.name, e.t_begin_us, e.t_end_us - e.t_begin_us, std::move(args)));
    }
  }
  marks.name_rows(events, int(measured.size()));
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", {{"timeline", "measured"}}}};
  return doc.dump();
}

void write_chrome_trace(const std::string& path, const std::string& json_text) {
  AtomicFile f(path);  // a failed write leaves an earlier trace as it was
  f.write(json_text);
  f.commit();
}

}  // namespace distlab
