// Lab 08, the clinic: each case is a file of an earlier lab with one seeded bug (student/<case>/<file>).
// The student finds the bug from the case's symptom and fixes it; a case's check builds the fixed file
// as the plugin of the lab it comes from -- the same sandboxed build -- and runs the checks of that lab
// that see the symptom (lab.toml: lab, file, checks). Their expected/seen/hint is the diagnosis a student
// gets back. A config case (spec.case_config) is the story's run config instead: the student's copy may
// differ from it only in the case's keys, and the story's job run with them must show what spec.case_expect
// says. What is graded is the behaviour of the fixed code or config, never the text of the fix.
// Read next: labs/08-clinic/lab.toml (the cases); each code case is graded by its own lab's checks.cpp.
#include <fmt/format.h>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config/config.h"
#include "core/util/error.h"
#include "grader/check.h"
#include "grader/harness.h"
#include "grader/jobs.h"
#include "grader/scratch.h"
#include "grader/bridge/lab_extension.h"

namespace fs = std::filesystem;

namespace distlab::grader {

namespace checks08 {  // named: a unity build (CMakeLists.txt) puts several labs' checks in one unit

std::string student_file(CheckContext& ctx) {
  std::ifstream in(ctx.plugin);
  const nlohmann::json bundle = nlohmann::json::parse(in, nullptr, false);
  if (!bundle.is_object() || !bundle.contains(ctx.spec.case_file) || !bundle[ctx.spec.case_file].is_string())
    throw CheckAbort("error", fmt::format("the submission has no {}", ctx.spec.case_file));
  return bundle[ctx.spec.case_file].get<std::string>();
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  n = std::min(n, v.size());
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); i++) s += v[i];
  return n ? s / double(n) : 0.0;
}

// A config case: the student's copy of the story's config, fixed. It may differ from the story only in the
// keys the case lets the fix change (the rest -- the model, the data, the batch, the world -- is the story);
// the grader then runs the STORY's file with those keys set (nothing else of the student's file reaches the
// run: no paths, no plugin) and measures what the case expects against the engine's reference run.
CheckResult config_case(CheckContext& ctx) {
  const CheckSpec& spec = ctx.spec;
  const std::string story_path = (fs::path(ctx.lab.dir) / spec.case_config).string();
  const RunConfig story = load_config(story_path, {}, {}, lab_config_sections());
  RunConfig theirs;
  try {
    const std::string text = student_file(ctx);
    parse_in_own_process(ctx, text, "student/" + spec.case_file, "config");
    theirs = parse_config(text, "student/" + spec.case_file, {}, {}, lab_config_sections());
  } catch (const Error& e) {
    return {false, fmt::format("{} is a run config", spec.case_file), e.full(), "", "fix the file so that `distlab train` reads it"};
  }
  const auto want = config_values(story), got = config_values(theirs);
  std::vector<std::string> sets, pinned;
  for (const auto& [key, value] : got) {
    const auto at = want.find(key);
    if (at != want.end() && at->second == value) continue;
    if (std::find(spec.case_change.begin(), spec.case_change.end(), key) == spec.case_change.end())
      pinned.push_back(fmt::format("{} = {} (the story's: {})", key, value, at == want.end() ? "unset" : at->second));
    else
      sets.push_back(key + "=" + value);
  }
  CheckResult r;
  r.expected = fmt::format("{}: {}", spec.case_file, spec.what);
  if (!pinned.empty()) {
    r.seen = fmt::format("{} changes what the story fixes: {}", spec.case_file, fmt::join(pinned, "; "));
    r.hint = fmt::format("the model, the data, the batch and the world are the story's; the fix lies in: {}", fmt::join(spec.case_change, ", "));
    return r;
  }
  // a curve is measured against the engine's reference run, shared by a batch of submissions
  const bool compares = spec.case_expect == "curve" || spec.case_expect == "final_loss";
  const Job none;
  const Job& ref = !compares ? none : ctx.shared.get<Job>("engine:clinic-ref:" + spec.name, [&] {
    JobOptions jo;
    jo.config = story_path;
    return engine_job(ctx, spec.case_reference_ranks, spec.case_reference, ctx.seconds_left(), jo);
  });
  if (compares && !ref.ok) throw Error(fmt::format("lab 08 case {}: the engine's reference run failed: {}", spec.name, ref.failure));
  JobOptions jo;
  jo.config = story_path;
  // the submission is a config: the engine runs it, so the same fix (the solution's, a classmate's) is run once
  const Job mine = engine_job(ctx, spec.case_ranks, sets, std::max(1.0, ctx.seconds_left() - 1), jo);
  const std::string changed = sets.empty() ? "the story's config unchanged" : fmt::format("with {}", fmt::join(sets, ", "));
  if (!mine.ok) {
    if (mine.status == "timeout") throw CheckAbort("timeout", mine.failure);
    r.seen = fmt::format("{}: {}", changed, mine.failure);
    return r;
  }
  if (spec.case_expect == "curve") {  // every step's loss the reference's, within `limit` relative
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < std::min(ref.losses.size(), mine.losses.size()); i++) {
      const double d = std::abs(ref.losses[i] - mine.losses[i]) / std::max(1e-12, std::abs(ref.losses[i]));
      if (!(d <= worst)) worst = d, at = i;
    }
    r.passed = mine.losses.size() == ref.losses.size() && worst <= spec.case_limit;
    r.seen = fmt::format("{}: step {} loss {:.6f} against {:.6f} ({:.1e} relative)", changed, at + 1,
                         at < mine.losses.size() ? mine.losses[at] : 0.0, at < ref.losses.size() ? ref.losses[at] : 0.0, worst);
  } else if (spec.case_expect == "final_loss") {  // as low as the reference's at the end, within `limit`
    const double a = mean_of_last(mine.losses, 5), b = mean_of_last(ref.losses, 5);
    r.passed = a <= b * (1 + spec.case_limit);
    r.seen = fmt::format("{}: the last 5 steps' mean loss {:.4f}, the reference's {:.4f} ({:+.1f} %)", changed, a, b, 100 * (a / b - 1));
  } else if (spec.case_expect == "bubble") {  // the modeled pipeline bubble at most `limit`
    const double b = mine.summary.value("pipeline_bubble", 1.0);
    r.passed = b <= spec.case_limit;
    r.seen = fmt::format("{}: a modeled bubble of {:.1f} % ((p - 1)/(m + p - 1) = {:.1f} %), the step {:.2f} ms", changed, 100 * b,
                         100 * mine.summary.value("pipeline_bubble_formula", 1.0), 1e3 * mine.summary.value("modeled_step_s", 0.0));
  } else if (spec.case_expect == "fits") {  // it ran (no OOM), and nothing went to host memory
    const double gib = 1024.0 * 1024 * 1024, host = mine.summary["peak_memory"].value("host", 0.0);
    r.passed = host == 0;
    r.seen = fmt::format("{}: fits, peak {:.2f} GiB on the device, {:.2f} GiB in host memory, a modeled step of {:.0f} ms", changed,
                         mine.summary.value("peak_memory_total", 0.0) / gib, host / gib, 1e3 * mine.summary.value("modeled_step_s", 0.0));
    if (!r.passed) r.hint = "offload is the last rung: it pays PCIe every step. A rung below it fits this job";
  } else {
    throw Error(fmt::format("labs/08-clinic/lab.toml: case {}: expect = '{}' (curve | final_loss | bubble | fits)", spec.name, spec.case_expect));
  }
  return r;
}

}  // namespace checks08

CheckResult clinic_case(CheckContext& ctx) {
  using namespace checks08;
  const CheckSpec& spec = ctx.spec;
  if (!spec.case_config.empty()) return config_case(ctx);
  const Lab target = find_lab(ctx.paths.source_dir, spec.case_lab);
  const std::string name = fs::path(spec.case_file).filename().string();
  if (std::find(target.files.begin(), target.files.end(), name) == target.files.end())
    throw Error(fmt::format("lab.toml: case {} names {}, not a file of lab {}", spec.name, spec.case_file, target.name));
  const std::string source = student_file(ctx);
  const ScratchDir scratch(ctx.paths, "clinic");
  const fs::path dir = scratch.path();
  fs::create_directories(dir / "src");
  std::ofstream(dir / "src" / name, std::ios::binary) << source;
  CheckResult r;
  r.expected = fmt::format("{} fixed: lab {}'s {} pass{}", spec.case_file, target.id, fmt::join(spec.case_checks, ", "),
                           spec.case_checks.size() == 1 ? "es" : "");
  const BuildResult b = build_plugin(ctx.paths, target, (dir / "src").string(), (dir / "case.so").string(), ctx.sandbox);
  if (!b.ok) {
    r.seen = fmt::format("{} does not build:\n{}", spec.case_file, b.log);
    return r;
  }
  const std::string load = probe_plugin(ctx.paths, target, b.plugin, ctx.sandbox);
  if (!load.empty()) {
    r.seen = fmt::format("{} built, but its plugin fails while loading: {}", spec.case_file, load);
    return r;
  }
  const auto checks = checks_for_lab(target.id);
  int passed = 0;
  for (const std::string& check : spec.case_checks) {
    const auto def = checks.find(check);
    const auto tspec = std::find_if(target.checks.begin(), target.checks.end(), [&](const CheckSpec& s) { return s.name == check; });
    if (def == checks.end() || tspec == target.checks.end())
      throw Error(fmt::format("lab.toml: case {} names check '{}', which lab {} does not have", spec.name, check, target.id));
    const CheckOutcome o = run_one(ctx.paths, target, *tspec, def->second, b.plugin, ctx.sandbox, ctx.shared,
                                   std::max(1.0, std::min(tspec->timeout_s, ctx.seconds_left() - 1)));
    if (o.status == "pass") {
      passed++;
      continue;
    }
    r.detail += fmt::format("{}lab {}'s {} ({}): {}\n  expected: {}\n  seen:     {}{}", r.detail.empty() ? "" : "\n", target.id, check,
                            tspec->what, o.status, o.expected, o.seen,
                            // that check's hint is for its own failure: a crash, hang or error has the case's
                            o.hint.empty() || o.status != "fail" ? "" : "\n  hint:     " + o.hint);
  }
  r.passed = passed == int(spec.case_checks.size());
  r.seen = fmt::format("{} of {} of lab {}'s checks pass", passed, spec.case_checks.size(), target.id);
  return r;
}

}  // namespace distlab::grader
