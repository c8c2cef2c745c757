// `distlab grade NN --html report.html`: one self-contained page (no scripts, no external files) with the
// grade table and the pictures of a short run of the lab's config with the student's code next to the
// engine's own run of it: the losses against the reference, the memory by category, and the student's
// modeled step as a timeline. Every text that came from a run or a check is escaped.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grader/bridge/sandbox.h"
#include "grader/harness.h"
#include "grader/report.h"

namespace distlab::grader {

struct ReportRuns {
  bool ran = false;
  std::string why_not;                  // no pictures: why (a lab without training, a run that failed)
  std::string command;                  // the run, as a student would type it
  std::vector<nlohmann::json> student, engine;  // metrics records
  nlohmann::json trace;                 // the student's modeled step (Chrome trace)
  std::string profile;
  std::string ran_as;                   // "uid 65534 (nobody)", or the grader's user and why
};

// A short run (up to 20 steps) of the lab's config on lab.ranks ranks, with the student's plugin and with
// the engine's (lab.plugin = none), sandboxed as the checks are: in a cgroup and, where the grader is root,
// as kJobUid with a copy of the plugin (grader/jobs.h), as a grading's training jobs.
ReportRuns run_report_runs(const Paths& p, const Lab& lab, const std::string& plugin, const SandboxSupport& sb);

std::string to_html(const Grade& g, const ReportRuns& runs);

}  // namespace distlab::grader
