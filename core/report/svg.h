// Figures as SVG text, for the chapters (committed next to the command that regenerates them) and the
// grader's HTML report: a line chart (loss curves of several runs), stacked bars (a run's memory by
// category), a timeline (a step's spans per rank and stream, as the cost model placed them).
// The output depends only on the numbers: same input, same bytes (coordinates are printed with one
// decimal), so a regenerated figure diffs cleanly. Text is XML-escaped; nothing else is interpreted.
// Read next: cli/plot_cmd.cpp (where the numbers come from: metrics JSON Lines, Chrome traces).
#pragma once
#include <string>
#include <vector>

namespace distlab {

struct FigureText {
  std::string title, x_label, y_label;
};

// One curve. Points with a non-finite y (a skipped or meta step) break the line.
struct Series {
  std::string label;
  std::vector<double> x, y;
};
std::string svg_line_chart(const std::vector<Series>& series, const FigureText& text);

// One bar per run, cut into parts (bytes by category); `capacity` > 0 draws the device's limit.
struct Bar {
  std::string label;
  std::vector<double> parts;  // the same order as part_names
  double aside = 0;           // drawn as a thin grey bar beside it, outside the total (host memory under offload)
};
std::string svg_stacked_bars(const std::vector<Bar>& bars, const std::vector<std::string>& part_names,
                             const FigureText& text, double capacity = 0, const std::string& capacity_label = "",
                             const std::string& aside_label = "");

// Spans on rows ("rank 0 compute", "rank 0 comm", ...), in seconds; coloured by their kind.
struct Span {
  int row;
  double start_s, end_s;
  std::string kind;  // the legend entry: "forward", "backward", "all_reduce", ...
};
std::string svg_timeline(const std::vector<std::string>& rows, const std::vector<Span>& spans, const FigureText& text);

// "&", "<", ">", quotes escaped for SVG/HTML text and attributes.
std::string xml_escape(const std::string& s);

}  // namespace distlab
