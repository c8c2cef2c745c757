// `distlab plot`: the course's figures, drawn from what runs leave behind.
//   plot loss A.jsonl B.jsonl ...      the step losses of several runs, one curve each (metrics JSON Lines)
//   plot memory A.jsonl B.jsonl ...    each run's memory at its peak, stacked by category (their summaries)
//   plot timeline trace.json           one traced step: a row per rank and stream (a Chrome trace)
// Every figure in chapters/ is one of these, with the commands that made it beside it.
// Read next: core/report/svg.h (the drawing), core/train/metrics.h (the records read here).
#include "cli/plot_cmd.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/ckpt/atomic_file.h"
#include "core/perf/hardware.h"
#include "core/report/svg.h"
#include "core/tensor/memory.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace distlab {

namespace {

struct PlotArgs {
  std::vector<std::string> files, labels;
  std::string out, title, capacity;
};

// Every record of a metrics file (a finished run's, or the .partial of one that failed).
std::vector<json> read_records(const std::string& path) {
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

std::string label_of(const PlotArgs& a, size_t i) {
  if (i < a.labels.size()) return a.labels[i];
  return fs::path(a.files[i]).stem().string();
}

double number_or_nan(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

void write_figure(const std::string& path, const std::string& svg) {
  check_output_path(path, "-o");
  AtomicFile f(path);
  f.write(svg);
  f.commit();
  std::cout << "wrote " << path << "\n";
}

void check_labels(const PlotArgs& a) {
  if (a.labels.size() > a.files.size())
    throw Error(fmt::format("{} --label for {} files", a.labels.size(), a.files.size()), "give at most one --label per file, in order");
}

void plot_loss(const PlotArgs& a) {
  check_labels(a);
  std::vector<Series> series;
  for (size_t i = 0; i < a.files.size(); i++) {
    Series s{label_of(a, i), {}, {}};
    for (const json& r : read_records(a.files[i]))
      if (r.value("kind", "") == "step") {
        s.x.push_back(number_or_nan(r, "step"));
        s.y.push_back(number_or_nan(r, "loss"));
      }
    if (s.x.empty()) throw Error(fmt::format("'{}' has no step records", a.files[i]), "is it a metrics file of distlab train?");
    series.push_back(std::move(s));
  }
  write_figure(a.out, svg_line_chart(series, {a.title.empty() ? "training loss" : a.title, "optimizer step", "loss"}));
}

void plot_memory(const PlotArgs& a) {
  check_labels(a);
  // The device's categories (host memory is not on the device: offloaded state is drawn apart from it).
  std::vector<std::string> names;
  for (int c = 0; c < kNumCategories; c++)
    if (Category(c) != Category::host) names.push_back(category_name(Category(c)));
  std::vector<Bar> bars;
  double top = 0;
  for (size_t i = 0; i < a.files.size(); i++) {
    const std::vector<json> recs = read_records(a.files[i]);
    const json* summary = nullptr;
    for (const json& r : recs)
      if (r.value("kind", "") == "summary") summary = &r;
    if (!summary) throw Error(fmt::format("'{}' has no summary record", a.files[i]), "the run did not finish: plot a finished run's metrics");
    const json& by = summary->contains("peak_memory_breakdown") ? (*summary)["peak_memory_breakdown"] : (*summary)["peak_memory"];
    Bar b{label_of(a, i), {}};
    double sum = 0;
    for (const std::string& n : names) {
      b.parts.push_back(by.contains(n) && by[n].is_number() ? by[n].get<double>() : 0.0);
      sum += b.parts.back();
    }
    top = std::max(top, sum);
    bars.push_back(std::move(b));
  }
  double cap = a.capacity.empty() ? 0 : double(parse_device_memory(a.capacity, "--capacity"));
  top = std::max(top, cap);
  const bool gib = top >= double(1ll << 30);
  const double unit = gib ? double(1ll << 30) : double(1ll << 20);
  for (Bar& b : bars)
    for (double& v : b.parts) v /= unit;
  write_figure(a.out, svg_stacked_bars(bars, names, {a.title.empty() ? "peak memory per rank" : a.title, "", gib ? "GiB" : "MiB"},
                                       cap / unit, cap > 0 ? "device " + format_bytes(cap) : ""));
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
  return "other compute";
}

void plot_timeline(const PlotArgs& a) {
  if (a.files.size() != 1) throw Error("plot timeline takes one trace file", "distlab train ... --set log.trace=FILE --set log.profile=cpu");
  std::ifstream in(a.files[0]);
  if (!in) throw IoError(fmt::format("cannot read trace '{}'", a.files[0]));
  json doc = json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
    throw Error(fmt::format("'{}' is not a Chrome trace (no traceEvents array)", a.files[0]), "write one with --set log.trace=FILE");
  std::map<std::pair<int, int>, std::string> thread_names;
  std::map<std::pair<int, int>, int> rows_of;
  const json& ev = doc["traceEvents"];
  for (const json& e : ev)
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
      thread_names[{e.value("pid", 0), e.value("tid", 0)}] = e["args"].value("name", "");
  for (const json& e : ev)
    if (e.value("ph", "") == "X") rows_of[{e.value("pid", 0), e.value("tid", 0)}] = 0;
  std::vector<std::string> rows;
  for (auto& [key, row] : rows_of) {
    row = int(rows.size());
    std::string t = thread_names.count(key) ? thread_names[key] : fmt::format("tid {}", key.second);
    if (t.rfind("pipeline", 0) == 0) t = "stage";
    rows.push_back(fmt::format("{} {}", key.first, t));
  }
  std::vector<Span> spans;
  for (const json& e : ev)
    if (e.value("ph", "") == "X") {
      const double ts = e.value("ts", 0.0) * 1e-6, dur = e.value("dur", 0.0) * 1e-6;
      spans.push_back({rows_of[{e.value("pid", 0), e.value("tid", 0)}], ts, ts + dur, kind_of(e)});
    }
  const std::string what = doc.contains("otherData") && doc["otherData"].value("timeline", "") == "modeled"
                               ? fmt::format("modeled on {}", doc["otherData"].value("profile", "?"))
                               : "measured";
  write_figure(a.out, svg_timeline(rows, spans, {a.title.empty() ? "one step, " + what : a.title, "ms", "rank"}));
}

}  // namespace

void add_plot_commands(CLI::App& app) {
  CLI::App* plot = app.add_subcommand("plot", "figures (SVG) from runs' metrics and traces: loss, memory, timeline");
  plot->require_subcommand(1);
  auto add = [plot](const char* name, const char* help, const char* files_help, void (*fn)(const PlotArgs&)) {
    auto a = std::make_shared<PlotArgs>();
    CLI::App* sub = plot->add_subcommand(name, help);
    sub->add_option("files", a->files, files_help)->required();
    sub->add_option("-o,--out", a->out, "the SVG file to write")->required();
    sub->add_option("--title", a->title, "the figure's title");
    sub->add_option("--label", a->labels, "a name per file, in order (default: the file's name)");
    if (std::string(name) == "memory") sub->add_option("--capacity", a->capacity, "draw the device's limit: a size (16GiB) or a profile (t4)");
    sub->callback([a, fn] { fn(*a); });
  };
  add("loss", "the step losses of runs, one curve each", "metrics files (distlab train --metrics FILE)", plot_loss);
  add("memory", "each run's peak memory by category (params, grads, optimizer state, activations, ...)", "metrics files", plot_memory);
  add("timeline", "a traced step: spans per rank and stream", "a Chrome trace (--set log.trace=FILE)", plot_timeline);
}

}  // namespace distlab
