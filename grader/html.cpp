#include "grader/html.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/report/figures.h"
#include "core/report/svg.h"
#include "core/config/config.h"
#include "core/util/error.h"
#include "grader/jobs.h"
#include "grader/scratch.h"
#include "grader/bridge/lab_extension.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace distlab::grader {

namespace {

constexpr int kReportSteps = 20;

std::vector<json> read_records_or_empty(const std::string& path) {
  std::vector<json> v;
  std::ifstream in(fs::exists(path) ? path : path + ".partial");
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) v.push_back(std::move(j));
  }
  return v;
}

bool finished(const std::vector<json>& records) {
  for (const json& r : records)
    if (r.value("kind", "") == "summary") return true;
  return false;
}

}  // namespace

ReportRuns run_report_runs(const Paths& p, const Lab& lab, const std::string& plugin, const SandboxSupport& sb) {
  ReportRuns out;
  if (!lab.trains) {
    out.why_not = fmt::format("lab {} is not a training run (its lab.toml has no [model]): the checks are its whole report", lab.id);
    return out;
  }
  const std::string config = (fs::path(lab.dir) / "lab.toml").string();
  const RunConfig cfg = load_config(config, {}, {}, lab_config_sections());
  out.profile = cfg.log.profile.empty() ? "t4-pcie" : cfg.log.profile;
  const int64_t steps = cfg.train.steps > 0 ? std::min<int64_t>(cfg.train.steps, kReportSteps) : kReportSteps;
  const fs::path dir = make_scratch_dir(p, "report");
  ::chmod(dir.c_str(), 0711);  // each run's own folder below is kJobUid's where the grader is root
  // as a grading's jobs: where the grader is root, as kJobUid with a copy of the plugin, in a cgroup
  CheckCgroup cg(4096, 256);
  auto run = [&](const std::string& who, const std::string& so_in, bool trace) {
    const fs::path sub = dir / who;
    fs::create_directories(sub);
    const JobUser user = prepare_job_user(p, lab, sub.string(), so_in);
    const std::string& so = user.plugin;
    out.ran_as = user.run_as ? fmt::format("uid {} (nobody)", user.run_as)
                             : geteuid() == 0 ? fmt::format("root ({} is closed to uid {})", user.as_root, kJobUid) : fmt::format("uid {}", geteuid());
    const std::string metrics = (sub / "metrics.jsonl").string();
    std::vector<std::string> argv = {p.self_exe, "run", "-n", std::to_string(lab.ranks), "--master-port", "0", "--grace", "2",
                                     "train", config, "--set", "lab.plugin=" + so,
                                     "--set", std::string("lab.sandbox=") + (sb.bwrap ? "require" : "off"),
                                     "--set", fmt::format("train.steps={}", steps), "--set", "train.eval_batches=1",
                                     "--set", "train.log_every=1000", "--set", "checkpoint.dir=", "--set", "log.profile=" + out.profile,
                                     "--metrics", metrics};
    if (trace) argv.insert(argv.end(), {"--set", "log.trace=" + (sub / "trace.json").string()});
    SpawnOptions o;
    o.file_mb = 256;
    o.cgroup = &cg;
    o.run_as = user.run_as;
    const RunResult r = run_to_end(argv, o, 300, 3000);
    std::vector<json> records = read_records_or_empty(metrics);
    if (r.timed_out || !WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0 || !finished(records))
      out.why_not = fmt::format("the {} run did not finish ({}):\n{}", who, r.timed_out ? "timed out" : describe_wait_status(r.status),
                                sanitize_output(r.output, 2000));
    return records;
  };
  out.command = fmt::format("distlab run -n {} train {} --set train.steps={} --set log.profile={}", lab.ranks, config, steps, out.profile);
  out.student = run("student", plugin, true);
  if (out.why_not.empty()) out.engine = run("engine", "none", false);
  std::ifstream tin(dir / "student" / "trace.json");
  if (tin) out.trace = json::parse(tin, nullptr, false);
  std::error_code ec;
  fs::remove_all(dir, ec);
  out.ran = out.why_not.empty();
  return out;
}

std::string to_html(const Grade& g, const ReportRuns& runs) {
  auto e = [](const std::string& s) { return xml_escape(s); };
  std::string h = fmt::format(R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>distlab grade: lab {0} ({1})</title>
<style>
body {{ font-family: sans-serif; max-width: 960px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }}
td.n {{ text-align: right; }}
tr.fail td {{ background: #fff3f0; }}
pre {{ white-space: pre-wrap; font-size: 12px; margin: 2px 0; }}
figure {{ margin: 1.5em 0; }}
figcaption {{ font-size: 13px; color: #555; }}
</style></head><body>
<h1>lab {0}: {2}</h1>
<p>{1}: <strong>{3} of {4} points</strong></p>
)",
                              e(g.lab.name), e(g.student), e(g.lab.title), g.points(), g.lab.max_points());
  if (!g.built) {
    h += "<h2>Build failed: no check ran</h2>\n<pre>" + e(g.build_log) + "</pre>\n";
  } else {
    h += "<table id=\"checks\"><tr><th>check</th><th>points</th><th>max</th><th>result</th><th>time</th><th>what it checks, and what was seen</th></tr>\n";
    for (const CheckOutcome& c : g.checks) {
      const bool pass = c.status == "pass";
      h += fmt::format("<tr class=\"{}\"><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{:.1f} s</td><td>{}",
                       pass ? "pass" : "fail", e(c.spec.name), c.points, c.spec.points, pass ? "pass" : "FAIL (" + e(c.status) + ")",
                       c.seconds, e(c.spec.what));
      if (!pass && !c.expected.empty()) h += "<pre>expected: " + e(c.expected) + "</pre>";
      if (!c.seen.empty()) h += "<pre>seen:     " + e(c.seen) + "</pre>";
      if (!pass && !c.hint.empty()) h += "<pre>hint:     " + e(c.hint) + "</pre>";
      else if (!pass && c.hint_held) h += "<pre>hint:     " + e(held_hint_text(g.lab, c.spec.name)) + "</pre>";
      h += "</td></tr>\n";
    }
    h += fmt::format("<tr><td><strong>total</strong></td><td class=\"n\"><strong>{}</strong></td><td class=\"n\">{}</td><td></td><td></td><td></td></tr></table>\n",
                     g.points(), g.lab.max_points());
    if (!g.hints_shown.empty()) {
      h += "<h2>Hints seen</h2>\n<ul id=\"hints-shown\">\n";
      for (const auto& [check, how] : g.hints_shown) h += "<li>" + e(check) + ": " + e(how) + "</li>\n";
      h += "</ul>\n";
    }
    if (full_marks(g)) h += "<h2>Full marks: where the engine does it</h2>\n<pre id=\"engine\">" + e(g.lab.engine) + "</pre>\n";
  }
  h += "<h2>The run</h2>\n";
  if (!runs.ran) {
    h += "<p id=\"no-run\">" + e(runs.why_not.empty() ? "no run" : runs.why_not.substr(0, runs.why_not.find('\n'))) + "</p>\n";
    if (runs.why_not.find('\n') != std::string::npos) h += "<pre>" + e(runs.why_not.substr(runs.why_not.find('\n') + 1)) + "</pre>\n";
  } else {
    h += "<p>" + e(runs.command) + ", with your code and with the engine's (run as " + e(runs.ran_as) + ").</p>\n";
    auto figure = [&](const std::string& id, const std::string& svg, const std::string& caption) {
      h += fmt::format("<figure id=\"{}\">\n{}<figcaption>{}</figcaption></figure>\n", id, svg, e(caption));
    };
    auto attempt = [&](const std::string& id, const std::function<std::string()>& draw, const std::string& caption) {
      try {
        figure(id, draw(), caption);
      } catch (const Error& err) {
        h += fmt::format("<p id=\"{}\">{}: {}</p>\n", id, e(caption), e(err.what()));
      }
    };
    const std::vector<RunRecords> both = {{"your code", runs.student}, {"the engine", runs.engine}};
    attempt("loss", [&] { return loss_figure(both, "loss: your code against the engine's"); },
            "The step losses of the two runs: the same config and seed, so the curves should lie on each other.");
    attempt("memory", [&] { return memory_figure(both, "memory per rank at the peak"); },
            "Device memory by category at each run's peak (rank 0).");
    if (runs.trace.is_object())
      attempt("timeline", [&] { return timeline_figure(runs.trace, "your code's step, modeled on " + runs.profile); },
              "One step of your run as the cost model places it: compute and communication per rank.");
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace distlab::grader
