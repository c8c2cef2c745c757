#include "grader/report.h"

#include <map>
#include <set>

#include "core/report/svg.h"  // xml_escape

#include <fmt/format.h>

namespace distlab::grader {

int Grade::points() const {
  int p = 0;
  for (const auto& c : checks) p += c.points;
  return p;
}

static std::string indent(const std::string& s, const std::string& pad) {
  std::string out = pad;
  for (char c : s) {
    out += c;
    if (c == '\n') out += pad;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '\n')) out.pop_back();
  return out;
}

std::string held_hint_text(const Lab& lab, const std::string& check) {
  return fmt::format("held back: it is shown when this check fails again (or now, recorded: distlab lab hint {} {})", lab.id, check);
}

// (a --check grading passing the checks it ran is not the lab's full marks: the engine's answer waits for those)
bool full_marks(const Grade& g) { return g.built && !g.lab.partial && !g.checks.empty() && g.points() == g.lab.max_points(); }

std::string not_run_reason(const Grade& g) {
  if (g.built) return "";
  const bool grader_side = g.build_log.find("not graded:") != std::string::npos || g.build_log.rfind("grading failed:", 0) == 0;
  return grader_side ? "not graded" : "build failed";
}

std::string table(const Grade& g) {
  std::string t = fmt::format("lab {} — {} ({}){}\n", g.lab.name, g.lab.title, sanitize_output(g.student, 300),
                              g.device == "cpu" ? "" : ", training jobs on " + g.device);
  if (!g.built)
    return t + (not_run_reason(g) == "not graded" ? "NOT GRADED" : "BUILD FAILED") + ": no check ran\n" +
           indent(sanitize_output(g.build_log, 20000), "  ") + "\n";
  // One failure that cost several checks (a training job they all needed crashed, hung or threw, as an
  // untouched skeleton's does) is said once, first, with the checks it cost
  std::map<std::string, std::vector<std::string>> shared;
  for (const auto& c : g.checks)
    if (c.status != "pass" && c.status != "fail" && !c.seen.empty()) shared[c.seen].push_back(c.spec.name);
  std::erase_if(shared, [](const auto& kv) { return kv.second.size() < 2; });
  for (const auto& [seen, names] : shared)
    t += fmt::format("  one failure cost {} checks ({}):\n", names.size(), fmt::join(names, ", ")) + indent(sanitize_output(seen, 20000), "      ") + "\n";
  t += fmt::format("  {:<34} {:>6} {:>4}  {:<8} {:>6}\n", "check", "points", "max", "result", "time");
  for (const auto& c : g.checks) {
    t += fmt::format("  {:<34} {:>6} {:>4}  {:<8} {:>5.1f}s\n", c.spec.name, c.points, c.spec.points,
                     c.status == "pass" ? "pass" : "FAIL(" + c.status + ")", c.seconds);
    if (shared.count(c.seen)) {
      t += "      seen:     the failure above\n";
    } else {
      if (c.status != "pass" && !c.expected.empty()) t += indent("expected: " + sanitize_output(c.expected, 20000), "      ") + "\n";
      if (!c.seen.empty()) t += indent("seen:     " + sanitize_output(c.seen, 20000), "      ") + "\n";  // pass or fail: the numbers
    }
    if (c.status != "pass") {
      if (!c.hint.empty()) t += indent("hint:     " + sanitize_output(c.hint, 4000), "      ") + "\n";
      else if (c.hint_held) t += indent("hint:     " + held_hint_text(g.lab, c.spec.name), "      ") + "\n";
    }
  }
  t += fmt::format("  {:<34} {:>6} {:>4}\n", "total", g.points(), g.lab.max_points());
  if (g.lab.partial) t += fmt::format("(--check: {} of the lab's checks; not recorded as a grade)\n", g.checks.size());
  if (!g.hints_shown.empty()) {
    t += "  hints seen:\n";
    for (const auto& [check, how] : g.hints_shown) t += fmt::format("    {}: {}\n", check, sanitize_output(how, 200));
  }
  if (full_marks(g)) t += "\nFull marks. Where the engine does what you just wrote (read it beside yours):\n" + indent(g.lab.engine, "  ") + "\n";
  return t;
}

nlohmann::json to_json(const Grade& g) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : g.checks)
    checks.push_back({{"name", c.spec.name}, {"points", c.points}, {"max", c.spec.points}, {"status", c.status},
                      {"expected", sanitize_output(c.expected, 20000)}, {"seen", sanitize_output(c.seen, 20000)},
                      {"hint", sanitize_output(c.hint, 4000)}, {"hint_held", c.hint_held}, {"seconds", c.seconds},
                      {"limit_s", c.limit_s}});
  nlohmann::json shown = nlohmann::json::object();
  for (const auto& [check, how] : g.hints_shown) shown[check] = sanitize_output(how, 200);
  nlohmann::json j = {{"lab", g.lab.name}, {"student", sanitize_output(g.student, 300)}, {"built", g.built}, {"build_log", sanitize_output(g.build_log, 20000)},
                      {"points", g.points()}, {"max_points", g.lab.max_points()}, {"seed", std::to_string(g.seed)}, {"device", g.device}, {"checks", checks},
                      {"hints_shown", shown}};
  if (full_marks(g)) j["engine"] = g.lab.engine;
  if (g.lab.partial) j["partial"] = true;  // --check: max_points is the checks that ran, not the lab's
  return j;
}

std::optional<Grade> grade_from_json(const nlohmann::json& j, const Lab& lab, std::string& why) {
  try {
    Grade g;
    g.lab = lab;
    if (j.at("lab").get<std::string>() != lab.name) throw std::runtime_error("a row of lab " + j.at("lab").get<std::string>());
    g.student = j.at("student").get<std::string>();
    g.built = j.at("built").get<bool>();
    g.build_log = j.at("build_log").get<std::string>();
    g.seed = std::stoull(j.at("seed").get<std::string>());
    g.device = j.value("device", std::string("cpu"));
    if (g.device != "cpu" && g.device != "cuda" && g.device != "cuda-sim") throw std::runtime_error("device '" + g.device + "' is not one a grading runs on");
    std::set<std::string> seen_checks;
    for (const auto& c : j.at("checks")) {
      CheckOutcome o;
      const std::string name = c.at("name").get<std::string>();
      for (const auto& spec : lab.checks)
        if (spec.name == name) o.spec = spec;
      if (o.spec.name.empty() || !seen_checks.insert(name).second) throw std::runtime_error("check '" + name + "' is not one of the lab's, or twice");
      o.points = c.at("points").get<int>();
      if (o.points < 0 || o.points > o.spec.points) throw std::runtime_error("check '" + name + "' has points out of range");
      o.status = c.at("status").get<std::string>();
      o.expected = c.at("expected").get<std::string>();
      o.seen = c.at("seen").get<std::string>();
      o.hint = c.at("hint").get<std::string>();
      o.hint_held = c.at("hint_held").get<bool>();
      o.seconds = c.at("seconds").get<double>();
      o.limit_s = c.at("limit_s").get<double>();
      g.checks.push_back(std::move(o));
    }
    for (const auto& [check, how] : j.at("hints_shown").items()) g.hints_shown[check] = how.get<std::string>();
    if (j.at("points").get<int>() != g.points()) throw std::runtime_error("its total is not the sum of its checks");
    return g;
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
}

std::string to_junit(const Grade& g) {
  int failures = 0;
  for (const auto& c : g.checks) failures += c.status != "pass";
  std::string x = fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"{}\" tests=\"{}\" failures=\"{}\">\n",
                              xml_escape(g.lab.name + " " + sanitize_output(g.student, 300)), g.built ? g.checks.size() : 1, g.built ? failures : 1);
  if (!g.built) x += "  <testcase name=\"build\"><failure message=\"build failed\">" + xml_escape(g.build_log) + "</failure></testcase>\n";
  // the points, as properties (JUnit's place for what its schema has no attribute for): the suite's and each case's
  x += fmt::format("  <properties><property name=\"points\" value=\"{}\"/><property name=\"max_points\" value=\"{}\"/></properties>\n",
                   g.points(), g.lab.max_points());
  for (const auto& c : g.checks) {
    x += fmt::format("  <testcase name=\"{}\" time=\"{:.3f}\"><properties><property name=\"points\" value=\"{}\"/>"
                     "<property name=\"max_points\" value=\"{}\"/></properties>",
                     xml_escape(c.spec.name), c.seconds, c.points, c.spec.points);
    if (c.status != "pass")
      x += fmt::format("<failure message=\"{}\">expected: {}\nseen: {}\nhint: {}</failure>", xml_escape(c.status),
                       xml_escape(c.expected), xml_escape(c.seen), xml_escape(c.hint));
    x += "</testcase>\n";
  }
  return x + "</testsuite>\n";
}

}  // namespace distlab::grader
