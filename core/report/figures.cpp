#include "core/report/figures.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "core/report/svg.h"
#include "core/tensor/memory.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

using nlohmann::json;

namespace {

double number_or_nan(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

// The legend entry of a trace span: its collective, or what part of the step a compute span is.
std::string kind_of(const json& e) {
  const std::string name = e.value("name", ""), cat = e.value("cat", "");
  if (cat == "pipeline") return name.rfind("B", 0) == 0 ? "stage backward" : "stage forward";
  if (cat == "wait") return "wait";
  if (cat == "collective") {
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "reduce", "barrier"})
      if (name.find(op) != std::string::npos) return op;
    return "collective";
  }
  for (const char* part : {"backward", "forward"})
    if (name.find(part) != std::string::npos) return part;
  if (name.size() > 5 && name.substr(name.size() - 5) == "_step") return "optimizer";  // sgd_step, adamw_step
  for (const char* opt : {"grad_norm", "clip", "unscale", "scale"})
    if (name.find(opt) != std::string::npos) return "optimizer";
  if (name.rfind("offload", 0) == 0) return "offload copy";
  return "other compute";
}

}  // namespace

std::vector<json> read_metrics_records(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("cannot read metrics file '{}'", path), "write one with distlab train ... --metrics FILE");
  std::vector<json> v;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    line_no++;
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw Error(fmt::format("{}:{}: not a JSON object", path, line_no), "a metrics file holds one JSON object per line");
    v.push_back(std::move(j));
  }
  if (v.empty()) throw Error(fmt::format("metrics file '{}' is empty", path));
  return v;
}

std::string loss_figure(const std::vector<RunRecords>& runs, const std::string& title) {
  std::vector<Series> series;
  for (const RunRecords& run : runs) {
    Series s{run.label, {}, {}};
    for (const json& r : run.records)
      if (r.value("kind", "") == "step") {
        s.x.push_back(number_or_nan(r, "step"));
        s.y.push_back(number_or_nan(r, "loss"));
      }
    if (s.x.empty()) throw Error(fmt::format("run '{}' has no step records", run.label), "is it a metrics file of distlab train?");
    series.push_back(std::move(s));
  }
  return svg_line_chart(series, {title, "optimizer step", "loss"});
}

std::string memory_figure(const std::vector<RunRecords>& runs, const std::string& title, double capacity) {
  // The device's categories (host memory is not on the device: offloaded state is drawn apart from it).
  std::vector<std::string> names;
  for (int c = 0; c < kNumCategories; c++)
    if (Category(c) != Category::host) names.push_back(category_name(Category(c)));
  std::vector<Bar> bars;
  double top = capacity;
  for (const RunRecords& run : runs) {
    const json* summary = nullptr;
    for (const json& r : run.records)
      if (r.value("kind", "") == "summary") summary = &r;
    if (!summary) throw Error(fmt::format("run '{}' has no summary record", run.label), "the run did not finish: plot a finished run's metrics");
    const json& by = summary->contains("peak_memory_breakdown") ? (*summary)["peak_memory_breakdown"] : (*summary)["peak_memory"];
    Bar b{run.label, {}};
    double sum = 0;
    for (const std::string& n : names) {
      b.parts.push_back(by.is_object() && by.contains(n) && by[n].is_number() ? by[n].get<double>() : 0.0);
      sum += b.parts.back();
    }
    // host memory's own high-water mark (at the device's peak the offloaded optimizer state may not exist yet)
    const json& own = (*summary)["peak_memory"];
    if (own.is_object() && own.contains("host") && own["host"].is_number()) b.aside = own["host"].get<double>();
    top = std::max(top, std::max(sum, b.aside));
    bars.push_back(std::move(b));
  }
  const bool gib = top >= double(1ll << 30);
  const double unit = gib ? double(1ll << 30) : double(1ll << 20);
  for (Bar& b : bars) {
    for (double& v : b.parts) v /= unit;
    b.aside /= unit;
  }
  return svg_stacked_bars(bars, names, {title, "", gib ? "GiB" : "MiB"}, capacity / unit, capacity > 0 ? "device " + format_bytes(capacity) : "",
                          "host (offloaded)");
}

std::string timeline_figure(const std::vector<LabeledTrace>& traces, const std::string& title) {
  std::vector<std::string> rows, what;
  std::vector<Span> spans;
  for (const LabeledTrace& t : traces) {
    const json& doc = t.trace;
    if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
      throw Error(fmt::format("trace '{}' is not a Chrome trace (no traceEvents array)", t.label), "write one with --set log.trace=FILE");
    std::map<std::pair<int, int>, std::string> thread_names;
    std::map<std::pair<int, int>, int> rows_of;
    std::set<int> pids;
    const json& ev = doc["traceEvents"];
    double t0 = INFINITY;
    for (const json& e : ev) {
      if (!e.is_object()) continue;
      if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name" && e.contains("args") && e["args"].is_object())
        thread_names[{e.value("pid", 0), e.value("tid", 0)}] = e["args"].value("name", "");
      if (e.value("ph", "") == "X") {
        rows_of[{e.value("pid", 0), e.value("tid", 0)}] = 0;
        pids.insert(e.value("pid", 0));
        t0 = std::min(t0, e.value("ts", 0.0));
      }
    }
    for (auto& [key, row] : rows_of) {  // "0 compute", or "8 GPUs compute" when traces are compared
      row = int(rows.size());
      std::string name = thread_names.count(key) ? thread_names[key] : fmt::format("tid {}", key.second);
      if (name.rfind("pipeline", 0) == 0) name = "stage";
      const std::string who = traces.size() == 1 ? std::to_string(key.first)
                                                 : pids.size() == 1 ? t.label : fmt::format("{} r{}", t.label, key.first);
      rows.push_back(who + " " + name);
    }
    for (const json& e : ev)  // each trace from its own first span
      if (e.is_object() && e.value("ph", "") == "X") {
        const double ts = (e.value("ts", 0.0) - t0) * 1e-6, dur = e.value("dur", 0.0) * 1e-6;
        spans.push_back({rows_of[{e.value("pid", 0), e.value("tid", 0)}], ts, ts + dur, kind_of(e)});
      }
    const bool modeled = doc.contains("otherData") && doc["otherData"].is_object() && doc["otherData"].value("timeline", "") == "modeled";
    what.push_back(modeled ? fmt::format("modeled on {}", doc["otherData"].value("profile", "?")) : "measured");
  }
  std::string how = what.empty() ? "" : what[0];
  for (const std::string& w : what)
    if (w != how) how = "modeled";
  return svg_timeline(rows, spans, {title.empty() ? "one step, " + how : title, "ms", traces.size() == 1 ? "rank" : ""});
}

std::string timeline_figure(const json& doc, const std::string& title) {
  return timeline_figure(std::vector<LabeledTrace>{LabeledTrace{"", doc}}, title);
}

}  // namespace distlab
