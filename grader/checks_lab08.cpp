// Lab 08, the clinic: each case is a file of an earlier lab with one seeded bug (student/<case>/<file>).
// The student finds the bug from the case's symptom and fixes it; a case's check builds the fixed file
// as the plugin of the lab it comes from -- the same sandboxed build -- and runs the checks of that lab
// that see the symptom (lab.toml: lab, file, checks). Their expected/seen/hint is the diagnosis a student
// gets back. What is graded is the behaviour of the fixed code, never the text of the fix.
#include <fmt/format.h>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/util/error.h"
#include "grader/check.h"
#include "grader/harness.h"

namespace fs = std::filesystem;

namespace distlab::grader {

CheckResult clinic_case(CheckContext& ctx) {
  const CheckSpec& spec = ctx.spec;
  const Lab target = find_lab(ctx.paths.source_dir, spec.case_lab);
  const std::string name = fs::path(spec.case_file).filename().string();
  if (std::find(target.files.begin(), target.files.end(), name) == target.files.end())
    throw Error(fmt::format("lab.toml: case {} names {}, not a file of lab {}", spec.name, spec.case_file, target.name));
  std::ifstream in(ctx.plugin);
  const nlohmann::json bundle = nlohmann::json::parse(in, nullptr, false);
  if (!bundle.is_object() || !bundle.contains(spec.case_file) || !bundle[spec.case_file].is_string())
    throw CheckAbort("error", fmt::format("the submission has no {}", spec.case_file));
  char tmpl[] = "/tmp/distlab-clinic-XXXXXX";
  if (!mkdtemp(tmpl)) throw Error("cannot create a temporary folder for the case");
  const fs::path dir = tmpl;
  struct Cleanup {
    fs::path d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  fs::create_directories(dir / "src");
  std::ofstream(dir / "src" / name, std::ios::binary) << bundle[spec.case_file].get<std::string>();
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
                            tspec->what, o.status, o.expected, o.seen, o.hint.empty() ? "" : "\n  hint:     " + o.hint);
  }
  r.passed = passed == int(spec.case_checks.size());
  r.seen = fmt::format("{} of {} of lab {}'s checks pass", passed, spec.case_checks.size(), target.id);
  return r;
}

}  // namespace distlab::grader
