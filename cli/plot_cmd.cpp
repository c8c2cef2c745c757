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

#include "core/util/atomic_file.h"
#include "core/perf/hardware.h"
#include "core/report/figures.h"
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

std::string label_of(const PlotArgs& a, size_t i) {
  if (i < a.labels.size()) return a.labels[i];
  return fs::path(a.files[i]).stem().string();
}

void write_figure(const std::string& path, const std::string& svg) {
  check_output_path(path, "-o");
  AtomicFile f(path);
  f.write(svg);
  f.commit();
  std::cout << "wrote " << path << "\n";
}

std::vector<RunRecords> read_runs(const PlotArgs& a) {
  if (a.labels.size() > a.files.size())
    throw Error(fmt::format("{} --label for {} files", a.labels.size(), a.files.size()), "give at most one --label per file, in order");
  std::vector<RunRecords> runs;
  for (size_t i = 0; i < a.files.size(); i++) runs.push_back({label_of(a, i), read_metrics_records(a.files[i])});
  return runs;
}

void plot_loss(const PlotArgs& a) {
  const std::vector<RunRecords> runs = read_runs(a);
  write_figure(a.out, loss_figure(runs, a.title.empty() ? "training loss" : a.title));
}

void plot_memory(const PlotArgs& a) {
  const std::vector<RunRecords> runs = read_runs(a);
  const double cap = a.capacity.empty() ? 0 : double(parse_device_memory(a.capacity, "--capacity"));
  write_figure(a.out, memory_figure(runs, a.title.empty() ? "peak memory per rank" : a.title, cap));
}

void plot_timeline(const PlotArgs& a) {
  if (a.labels.size() > a.files.size())
    throw Error(fmt::format("{} --label for {} files", a.labels.size(), a.files.size()), "give at most one --label per file, in order");
  std::vector<LabeledTrace> traces;
  for (size_t i = 0; i < a.files.size(); i++) {
    std::ifstream in(a.files[i]);
    if (!in) throw IoError(fmt::format("cannot read trace '{}'", a.files[i]));
    nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
    if (doc.is_discarded() || !doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
      throw Error(fmt::format("'{}' is not a Chrome trace (no traceEvents array)", a.files[i]), "write one with --set log.trace=FILE");
    traces.push_back({label_of(a, i), std::move(doc)});
  }
  write_figure(a.out, timeline_figure(traces, a.title));
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
  add("timeline", "traced steps: spans per rank and stream, several traces on one axis", "Chrome traces (--set log.trace=FILE)", plot_timeline);
}

}  // namespace distlab
