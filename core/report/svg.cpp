#include "core/report/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/util/error.h"

namespace distlab {

namespace {

// The plot area inside a W x H picture; the left margin widens for a timeline's long row names.
constexpr double kW = 720, kH = 400, kRight = 180, kTop = 40, kBottom = 52;
constexpr double kPlotH = kH - kTop - kBottom;
struct Frame {
  double left = 72;
  double plot_w() const { return kW - left - kRight; }
};

// Colour-blind-safe (Okabe-Ito), then greys.
const char* const kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000", "#999999", "#666666"};
const char* colour(size_t i) { return kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))]; }

std::string num(double v) { return fmt::format("{:.1f}", v); }

// A tick label: as few digits as the step needs.
std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-6) v = 0;
  int decimals = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
  return fmt::format("{:.{}f}", v, std::clamp(decimals, 0, 6));
}

// Ticks at 1, 2 or 5 times a power of ten, about `n` of them across [lo, hi]; widens [lo, hi] to ticks.
std::vector<double> nice_ticks(double& lo, double& hi, int n) {
  if (!(hi > lo)) {
    const double pad = std::abs(lo) > 0 ? std::abs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag, step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  lo = std::floor(lo / step + 1e-9) * step;
  hi = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> t;
  for (double v = lo; v <= hi + step * 1e-6; v += step) t.push_back(v);
  return t;
}

std::string header(const FigureText& text, const Frame& f) {
  const double kLeft = f.left, kPlotW = f.plot_w();
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{3}</text>\n",
      int(kW), int(kH), num(kLeft), xml_escape(text.title));
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(kLeft + kPlotW / 2), num(kH - 12),
                   xml_escape(text.x_label));
  s += fmt::format("<text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n", num(kTop + kPlotH / 2),
                   xml_escape(text.y_label));
  return s;
}

std::string y_axis(const std::vector<double>& ticks, double lo, double hi, const Frame& f) {
  const double kLeft = f.left, kPlotW = f.plot_w();
  std::string s;
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  for (double t : ticks) {
    const double y = kTop + kPlotH * (1 - (t - lo) / (hi - lo));
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/>\n", num(kLeft), num(y), num(kLeft + kPlotW));
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", num(kLeft - 6), num(y + 4), tick_label(t, step));
  }
  return s;
}

std::string x_axis(const std::vector<double>& ticks, double lo, double hi, const Frame& f) {
  const double kLeft = f.left, kPlotW = f.plot_w();
  std::string s;
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  for (double t : ticks) {
    const double x = kLeft + kPlotW * (t - lo) / (hi - lo);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/>\n", num(x), num(kTop), num(kTop + kPlotH));
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(x), num(kTop + kPlotH + 16), tick_label(t, step));
  }
  return s;
}

std::string frame(const Frame& f) {
  const double kLeft = f.left, kPlotW = f.plot_w();
  return fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", num(kLeft), num(kTop),
                     num(kPlotW), num(kPlotH));
}

// The legend: a swatch and a label per entry, right of the plot.
std::string legend(const std::vector<std::string>& labels, bool lines, const Frame& f, const std::vector<std::string>& colours = {}) {
  const double kLeft = f.left, kPlotW = f.plot_w();
  auto colour = [&](size_t i) { return i < colours.size() ? colours[i].c_str() : distlab::colour(i); };
  std::string s;
  for (size_t i = 0; i < labels.size(); i++) {
    const double y = kTop + 8 + 20.0 * double(i), x = kLeft + kPlotW + 12;
    if (lines)
      s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2.5\"/>\n", num(x), num(y), num(x + 20),
                       num(y), colour(i));
    else
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"12\" fill=\"{}\"/>\n", num(x + 3), num(y - 6), colour(i));
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", num(x + 26), num(y + 4), xml_escape(labels[i]));
  }
  return s;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  return out;
}

std::string svg_line_chart(const std::vector<Series>& series, const FigureText& text) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : series) {
    if (s.x.size() != s.y.size()) throw Error(fmt::format("series '{}' has {} x and {} y values", s.label, s.x.size(), s.y.size()));
    for (size_t i = 0; i < s.x.size(); i++) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]), y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  }
  if (!std::isfinite(x0)) throw Error("a line chart with no finite points", "every value was null, NaN or missing");
  const std::vector<double> yt = nice_ticks(y0, y1, 5), xt = nice_ticks(x0, x1, 6);
  const Frame fr;
  const double kLeft = fr.left, kPlotW = fr.plot_w();
  std::string svg = header(text, fr) + y_axis(yt, y0, y1, fr) + x_axis(xt, x0, x1, fr) + frame(fr);
  std::vector<std::string> labels;
  for (size_t k = 0; k < series.size(); k++) {
    const Series& s = series[k];
    labels.push_back(s.label);
    std::string d;
    bool pen = false;
    for (size_t i = 0; i < s.x.size(); i++) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        pen = false;
        continue;
      }
      const double x = kLeft + kPlotW * (s.x[i] - x0) / (x1 - x0), y = kTop + kPlotH * (1 - (s.y[i] - y0) / (y1 - y0));
      d += fmt::format("{}{} {} ", pen ? "L" : "M", num(x), num(y));
      pen = true;
    }
    // later series dashed, so curves that coincide (the point of most overlays) both stay visible
    svg += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", d, colour(k),
                       k == 0 ? "" : fmt::format(" stroke-dasharray=\"{} 4\"", 4 + 2 * k));
  }
  return svg + legend(labels, true, fr) + "</svg>\n";
}

std::string svg_stacked_bars(const std::vector<Bar>& bars, const std::vector<std::string>& part_names, const FigureText& text,
                             double capacity, const std::string& capacity_label, const std::string& aside_label) {
  if (bars.empty()) throw Error("a bar chart with no bars");
  double top = capacity;
  for (const Bar& b : bars) {
    if (b.parts.size() != part_names.size())
      throw Error(fmt::format("bar '{}' has {} parts, the legend {}", b.label, b.parts.size(), part_names.size()));
    double sum = 0;
    for (double v : b.parts) sum += std::max(v, 0.0);
    top = std::max(top, std::max(sum, b.aside));
  }
  double lo = 0, hi = top > 0 ? top * 1.08 : 1;
  const std::vector<double> yt = nice_ticks(lo, hi, 5);
  const Frame fr;
  const double kLeft = fr.left, kPlotW = fr.plot_w();
  std::string svg = header(text, fr) + y_axis(yt, lo, hi, fr) + frame(fr);
  const double slot = kPlotW / double(bars.size()), width = std::min(slot * 0.6, 90.0);
  auto y_of = [&](double v) { return kTop + kPlotH * (1 - v / hi); };
  for (size_t i = 0; i < bars.size(); i++) {
    const double x = kLeft + slot * (double(i) + 0.5) - width / 2;
    double base = 0;
    for (size_t p = 0; p < part_names.size(); p++) {
      const double v = std::max(bars[i].parts[p], 0.0);
      if (v <= 0) continue;
      svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}: {}</title></rect>\n", num(x),
                         num(y_of(base + v)), num(width), num(y_of(base) - y_of(base + v)), colour(p),
                         xml_escape(part_names[p]), fmt::format("{:.3g}", v));
      base += v;
    }
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(x + width / 2), num(y_of(base) - 5),
                       base >= 1000 ? fmt::format("{:.0f}", base) : fmt::format("{:.3g}", base));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(x + width / 2), num(kTop + kPlotH + 16),
                       xml_escape(bars[i].label));
    if (bars[i].aside > 0) {  // beside the bar, thin and grey: not part of its total
      const double ax = x + width + 3, aw = std::min(width * 0.3, 16.0);
      svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#bbb\" stroke=\"#777\"><title>{}: {}</title></rect>\n",
                         num(ax), num(y_of(bars[i].aside)), num(aw), num(y_of(0) - y_of(bars[i].aside)), xml_escape(aside_label),
                         fmt::format("{:.3g}", bars[i].aside));
    }
  }
  if (capacity > 0) {
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#c00\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n",
                       num(kLeft), num(y_of(capacity)), num(kLeft + kPlotW));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#c00\">{}</text>\n", num(kLeft + kPlotW - 4),
                       num(y_of(capacity) - 5), xml_escape(capacity_label));
  }
  std::vector<std::string> names = part_names, colours;
  for (size_t i = 0; i < part_names.size(); i++) colours.push_back(colour(i));
  bool any_aside = false;
  for (const Bar& b : bars) any_aside = any_aside || b.aside > 0;
  if (any_aside) {
    names.push_back(aside_label.empty() ? "beside" : aside_label);
    colours.push_back("#bbb");
  }
  return svg + legend(names, false, fr, colours) + "</svg>\n";
}

std::string svg_timeline(const std::vector<std::string>& rows, const std::vector<Span>& spans, const FigureText& text) {
  if (rows.empty() || spans.empty()) throw Error("a timeline with no spans");
  double t0 = INFINITY, t1 = -INFINITY;
  // the step's parts keep one colour in every figure; other kinds take the rest of the palette in order
  static const char* const kKnown[] = {"forward", "backward", "all_reduce", "wait", "optimizer", "reduce_scatter", "all_gather",
                                       "send", "recv", "broadcast", "stage forward", "stage backward", "offload copy", "other compute"};
  static const char* const kKnownColour[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442",
                                             "#009E73", "#56B4E9", "#999999", "#0072B2", "#D55E00", "#000000", "#666666"};
  std::vector<std::string> kinds;  // legend order: first appearance
  std::map<std::string, std::string> colour_of;
  size_t others = 0;
  for (const Span& s : spans) {
    if (s.row < 0 || s.row >= int(rows.size())) throw Error(fmt::format("a span on row {} of {}", s.row, rows.size()));
    t0 = std::min(t0, s.start_s), t1 = std::max(t1, s.end_s);
    if (colour_of.count(s.kind)) continue;
    std::string c;
    for (size_t k = 0; k < sizeof(kKnown) / sizeof(kKnown[0]); k++)
      if (s.kind == kKnown[k]) c = kKnownColour[k];
    colour_of[s.kind] = c.empty() ? colour(7 + others++) : c;
    kinds.push_back(s.kind);
  }
  // milliseconds on the axis, from the first span
  double lo = 0, hi = (t1 - t0) * 1e3;
  const std::vector<double> xt = nice_ticks(lo, hi, 6);
  Frame fr;
  for (const std::string& r : rows) fr.left = std::max(fr.left, 14 + 6.2 * double(r.size()));  // the row names fit
  fr.left = std::min(fr.left, 300.0);
  const double kLeft = fr.left, kPlotW = fr.plot_w();
  std::string svg = header(text, fr) + x_axis(xt, lo, hi, fr) + frame(fr);
  const double row_h = kPlotH / double(rows.size());
  for (size_t r = 0; r < rows.size(); r++)
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"11\">{}</text>\n", num(kLeft - 6),
                       num(kTop + row_h * (double(r) + 0.5) + 4), xml_escape(rows[r]));
  for (const Span& s : spans) {
    const double x = kLeft + kPlotW * ((s.start_s - t0) * 1e3 - lo) / (hi - lo);
    const double w = std::max(kPlotW * (s.end_s - s.start_s) * 1e3 / (hi - lo), 0.4);
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{} {:.3f} ms</title></rect>\n", num(x),
                       num(kTop + row_h * s.row + row_h * 0.15), num(w), num(row_h * 0.7), colour_of[s.kind],
                       xml_escape(s.kind), (s.end_s - s.start_s) * 1e3);
  }
  std::vector<std::string> colours;
  for (const std::string& k : kinds) colours.push_back(colour_of[k]);
  return svg + legend(kinds, false, fr, colours) + "</svg>\n";
}

}  // namespace distlab
