// The course's three figures from what runs leave behind, as SVG (core/report/svg.h draws them):
//   loss_figure      the step losses of several runs (their metrics records), one curve each
//   memory_figure    each run's device memory at its peak, stacked by category (the summary record)
//   timeline_figure  one traced step, a row per rank and stream (a Chrome trace document)
// `distlab plot` writes them to files; `distlab grade --html` puts them in its report.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace distlab {

// A run's metrics: every record of its JSON Lines file, and a name for the legend.
struct RunRecords {
  std::string label;
  std::vector<nlohmann::json> records;
};

// Every record of a metrics file (a finished run's or a failed run's .partial); IoError / Error naming the
// file and line when it can't be read or a line is not a JSON object.
std::vector<nlohmann::json> read_metrics_records(const std::string& path);

std::string loss_figure(const std::vector<RunRecords>& runs, const std::string& title = "training loss");
// capacity > 0: the device's limit as a line (bytes)
std::string memory_figure(const std::vector<RunRecords>& runs, const std::string& title = "peak memory per rank", double capacity = 0);
std::string timeline_figure(const nlohmann::json& chrome_trace, const std::string& title = "");
// Several traces on one time axis, each from its own first span, their rows named by their label:
// the same step under two settings (8 against 64 GPUs, prefetch on and off).
struct LabeledTrace {
  std::string label;
  nlohmann::json trace;
};
std::string timeline_figure(const std::vector<LabeledTrace>& traces, const std::string& title = "");

}  // namespace distlab
