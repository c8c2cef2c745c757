#include "cli/lab_cmd.h"

#include <fmt/format.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <toml++/toml.h>

#include "core/util/atomic_file.h"
#include "core/config/config.h"
#include "core/util/error.h"
#include "core/util/nesting.h"
#include "grader/harness.h"
#include "grader/hints.h"
#include "grader/html.h"
#include "grader/report.h"
#include "grader/scratch.h"
#include "grader/bridge/lab_extension.h"

namespace fs = std::filesystem;

namespace distlab {

namespace {

grader::Paths paths(const std::string& self_exe) { return {DISTLAB_SOURCE_DIR, DISTLAB_BUILD_DIR, self_exe}; }

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_atomically(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

fs::path lab_build_dir(const grader::Paths& p, const grader::Lab& lab) { return fs::path(p.build_dir) / "labs" / lab.name; }
fs::path last_grade_path(const grader::Paths& p, const grader::Lab& lab) { return lab_build_dir(p, lab) / "last_grade.json"; }
fs::path hint_record_path(const grader::Paths& p, const grader::Lab& lab) { return lab_build_dir(p, lab) / "hints.json"; }

// The student's best grade so far from last_grade.json (nullopt: never graded, or a broken record).
std::optional<int> best_points(const grader::Paths& p, const grader::Lab& lab) {
  const fs::path f = last_grade_path(p, lab);
  if (!fs::exists(f)) return std::nullopt;
  auto j = nlohmann::json::parse(read_file(f), nullptr, false);
  try {
    if (j.at("best").at("max_points").get<int>() != lab.max_points()) return std::nullopt;
    return j.at("best").at("points").get<int>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Shows the hints a grading may show, then records the failures and the hints; a record that can't be
// read or written is said on stderr and costs nothing else.
void hints_for(grader::Grade& g, const std::string& record_path, grader::HintPolicy policy) {
  grader::HintRecord r = grader::HintRecord::load(record_path);
  if (!r.unreadable.empty()) std::cerr << "distlab: " << r.unreadable << "\n";
  grader::apply_hints(g, r, policy);
  try {
    r.save();
  } catch (const std::exception& e) {
    std::cerr << fmt::format("distlab: could not record the hints shown in {}: {}\n", record_path, e.what());
  }
}

// last_grade.json: {"last": <grade>, "best": {"points": P, "max_points": M}}. A broken file is reported,
// never a crash.
std::string status_of(const grader::Paths& p, const grader::Lab& lab) {
  const fs::path f = last_grade_path(p, lab);
  if (fs::exists(f)) {
    auto j = nlohmann::json::parse(read_file(f), nullptr, false);
    try {
      const auto& last = j.at("last");
      const auto& best = j.at("best");
      const int pts = last.at("points"), max = last.at("max_points"), bp = best.at("points");
      return fmt::format("{} (last {}/{}, best {}/{})", bp == max ? "passed" : "graded", pts, max, bp, max);
    } catch (const std::exception&) {
      return fmt::format("unreadable grade record ({}: delete it and grade again)", f.string());
    }
  }
  if (fs::exists(lab_build_dir(p, lab) / "student.so")) return "built";
  return "not started";
}

void record_grade(const grader::Paths& p, const grader::Lab& lab, const grader::Grade& g) {
  const fs::path f = last_grade_path(p, lab);
  int best = g.points();
  if (fs::exists(f)) {
    auto old = nlohmann::json::parse(read_file(f), nullptr, false);
    if (old.is_object() && old.contains("best") && old["best"].is_object() && old["best"].value("max_points", -1) == lab.max_points())
      best = std::max(best, old["best"].value("points", 0));
  }
  nlohmann::json rec = {{"last", grader::to_json(g)}, {"best", {{"points", best}, {"max_points", lab.max_points()}}}};
  write_atomically(f.string(), rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

grader::Grade grade_folder(const grader::Paths& p, const grader::Lab& lab, const std::string& src, const std::string& who,
                           const std::string& plugin, const SandboxSupport& sb, grader::SharedResults& shared, bool quiet) {
  grader::Grade g;
  g.student = who;
  g.lab = lab;
  if (!quiet) std::cout << fmt::format("building {} from {} ...\n", lab.name, src) << std::flush;
  grader::BuildResult b = grader::build_plugin(p, lab, src, plugin, sb);
  g.built = b.ok;
  g.build_log = b.log;
  if (b.ok) {
    if (!quiet) std::cout << fmt::format("running {} checks ({})\n", lab.checks.size(), sb.describe()) << std::flush;
    g.checks = grader::run_checks(p, lab, b.plugin, sb, shared);
  }
  return g;
}

struct GradeArgs {
  std::string lab, json, junit, submissions, csv, feedback, html;
  std::string hints = "after-failure";  // grader/hints.h
  std::string src;  // --src: the student's files from this folder instead of student/
  bool solution = false, no_sandbox = false, require_sandbox = false;
  std::optional<uint64_t> seed;  // the grading's scenarios; drawn afresh when not given
  int jobs = 1;  // --submissions: how many students are graded at once
};

// A feedback file's name from a submission's folder name: letters, digits, '.', '_' and '-' kept, anything
// else '_', at most 80 characters; a name that had to change, or that another folder's name already took,
// gets a hash of the whole folder name, so that no two students share a file and none is too long.
std::string feedback_name(const std::string& student, std::set<std::string>& taken) {
  std::string base;
  for (char c : student) base += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ? c : '_';
  if (base.empty() || base[0] == '.') base = "_" + base;
  bool changed = base != student;
  if (base.size() > 80) {
    base.resize(80);
    changed = true;
  }
  std::string name = base;
  for (uint64_t salt = 0; changed || taken.count(name); salt++, changed = false)
    name = fmt::format("{}-{:08x}", base, uint32_t(std::hash<std::string>{}(student + std::string(salt, '+'))));
  taken.insert(name);
  return name;
}

// `--submissions DIR`: every subfolder built and graded on its own; a CSV row and a feedback file each. An
// entry that is not a folder (a file, a link) gets a row that says why; whatever goes wrong in one
// student's grading becomes that student's error row, never the batch's end.
int grade_submissions(const grader::Paths& p, const grader::Lab& l, const GradeArgs& a, const SandboxSupport& sb) {
  if (!fs::is_directory(a.submissions))
    throw ConfigError("--submissions " + a.submissions + " is not a folder", "give a folder with one subfolder per student");
  if (!a.junit.empty() || !a.html.empty())
    throw ConfigError("--junit and --html write one student's report: with --submissions, use --csv, --json and the feedback folder",
                      "or grade one student's folder at a time with --junit/--html");
  std::vector<fs::path> dirs;
  for (const auto& d : fs::directory_iterator(a.submissions)) dirs.push_back(d.path());
  std::sort(dirs.begin(), dirs.end());
  const fs::path feedback = !a.feedback.empty() ? fs::path(a.feedback)
                            : !a.csv.empty()    ? fs::absolute(a.csv).parent_path() / "feedback"
                                                : fs::path(a.submissions).parent_path() / (fs::path(a.submissions).filename().string() + "-feedback");
  fs::create_directories(feedback);
  std::cout << sb.describe() << "\nfeedback for each student: " << feedback.string() << "/\n";
  std::set<std::string> taken;
  std::vector<std::string> fb_names;  // decided in the folders' order, whatever order they finish in
  for (const auto& d : dirs) fb_names.push_back(feedback_name(d.filename().string(), taken));
  grader::SharedResults batch;  // the references, computed once for the batch (the first grading to need one)
  if (a.seed) batch.seed = *a.seed;
  batch.load = std::max(1.0, 2.0 * a.jobs / std::max(1u, std::thread::hardware_concurrency()));
  batch.jobs = a.jobs;
  const grader::HintPolicy policy = *parse_choice<grader::HintPolicy>(a.hints);
  std::vector<grader::Grade> grades(dirs.size());
  auto grade_one = [&](size_t i) {
    const fs::path& d = dirs[i];
    grader::Grade g;
    g.student = d.filename().string();
    g.lab = l;
    g.seed = batch.seed;
    std::error_code ec;
    const auto st = fs::symlink_status(d, ec);
    if (ec || fs::is_symlink(st) || !fs::is_directory(st)) {
      g.build_log = fmt::format("{}: not graded: {}", d.string(),
                                ec ? ec.message() : fs::is_symlink(st) ? "a symbolic link, not a folder (links are refused at any depth)"
                                                                       : "not a folder (a submission is a folder holding the lab's files)");
    } else {
      std::string tmpl;  // each plugin in a folder of its own, gone after its grading
      grader::SharedResults shared = batch.next_student();  // this student's own results, the batch's references
      try {
        tmpl = grader::make_scratch_dir(p, "plugin");
        g = grade_folder(p, l, d.string(), g.student, tmpl + "/plugin.so", sb, shared, true);
      } catch (const std::exception& e) {  // the grader's own failure on this folder: recorded, the batch goes on
        g.built = false;
        g.checks.clear();
        g.build_log = std::string("grading failed: ") + e.what();
      }
      g.seed = batch.seed;
      if (!tmpl.empty()) fs::remove_all(tmpl, ec);
    }
    hints_for(g, (feedback / (fb_names[i] + ".hints.json")).string(), policy);  // this student's earlier gradings into this folder
    try {
      write_atomically((feedback / (fb_names[i] + ".txt")).string(), grader::table(g));
    } catch (const std::exception& e) {
      std::cerr << fmt::format("distlab: could not write {}'s feedback: {}\n", sanitize_output(g.student, 200), e.what());
    }
    grades[i] = std::move(g);
  };
  // --jobs N: N students at once, each taking the next folder; every line printed as its grading ends
  std::atomic<size_t> next{0};
  std::mutex print;
  auto worker = [&] {
    for (size_t i; (i = next++) < dirs.size();) {
      try {
        grade_one(i);
      } catch (const std::exception& e) {  // a hint record or feedback folder that fails: that student's row says so
        grades[i].student = dirs[i].filename().string();
        grades[i].lab = l;
        grades[i].built = false;
        grades[i].build_log = std::string("grading failed: ") + e.what();
      }
      const grader::Grade& g = grades[i];
      std::lock_guard<std::mutex> lk(print);
      std::cout << fmt::format("{:<24} {:>3}/{}{}\n", sanitize_output(g.student, 200), g.points(), l.max_points(),
                               g.built ? "" : "  (build failed)")
                << std::flush;
    }
  };
  std::vector<std::thread> workers;
  for (int k = 1; k < a.jobs && size_t(k) < dirs.size(); k++) workers.emplace_back(worker);
  worker();
  for (auto& t : workers) t.join();
  if (!a.csv.empty()) write_atomically(a.csv, grader::gradebook_csv(grades));
  if (!a.json.empty()) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& g : grades) all.push_back(grader::to_json(g));
    write_atomically(a.json, all.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  return 0;
}

}  // namespace

void add_lab_commands(CLI::App& app, int& exit_code, const std::string& self_exe) {
  CLI::App* lab = app.add_subcommand("lab", "the course's labs: list, show, build");
  lab->require_subcommand(1);
  lab->add_subcommand("list", "every lab with its status")->callback([self_exe] {
    auto p = paths(self_exe);
    std::cout << fmt::format("{:<22} {:<66} {:>6}  {}\n", "lab", "title", "points", "status");
    for (const auto& l : grader::all_labs(p.source_dir))
      std::cout << fmt::format("{:<22} {:<66} {:>6}  {}\n", l.name, l.title, l.max_points(), status_of(p, l));
  });
  auto show_id = std::make_shared<std::string>();
  auto* show = lab->add_subcommand("show", "the task: goal, files, checks and points, how to run");
  show->add_option("lab", *show_id, "lab number or name")->required();
  show->callback([show_id, self_exe] {
    auto p = paths(self_exe);
    auto l = grader::find_lab(p.source_dir, *show_id);
    std::cout << read_file(fs::path(l.dir) / "README.md") << "\n## Checks (" << l.max_points() << " points)\n\n";
    for (const auto& c : l.checks) {
      std::cout << fmt::format("- {} ({} point{}): {}\n", c.name, c.points, c.points == 1 ? "" : "s", c.what);
      if (!c.case_config.empty())  // a clinic's config case: what the fix may change, how it runs
        std::cout << fmt::format("  the fix may change: {}; run: distlab run -n {} train {}/student/{}\n", fmt::join(c.case_change, ", "),
                                 c.case_ranks, l.dir.substr(p.source_dir.size() + 1), c.case_file);
    }
    std::cout << fmt::format("\nEdit {}/student/{}; build with `distlab lab build {}`; grade with `distlab grade {}`.\n",
                             l.dir.substr(p.source_dir.size() + 1), fmt::join(l.files, ", student/"), l.id, l.id);
    // the engine's own version of the lab's mechanism: after the student has written it
    const std::optional<int> best = best_points(p, l);
    if (best && *best == l.max_points())
      std::cout << "\n## Where the engine does it (you have full marks: read it beside yours)\n\n" << l.engine;
    else
      std::cout << fmt::format("\nA failed check shows its hint at the next grading that fails it (or now: `distlab lab hint {} CHECK`).\n"
                               "Where the engine does what this lab asks is shown here once your grade is full ({}).\n",
                               l.id, best ? fmt::format("best {}/{} so far", *best, l.max_points()) : "not graded yet");
  });
  auto hint_args = std::make_shared<std::array<std::string, 2>>();  // lab, check
  auto* hint = lab->add_subcommand("hint", "a check's hint now, before it has failed twice (recorded: the report lists the hints you saw)");
  hint->add_option("lab", (*hint_args)[0], "lab number or name")->required();
  hint->add_option("check", (*hint_args)[1], "the check's name (distlab lab show NN lists them)")->required();
  hint->callback([hint_args, self_exe, &exit_code] {
    auto p = paths(self_exe);
    const auto l = grader::find_lab(p.source_dir, (*hint_args)[0]);
    const std::string& name = (*hint_args)[1];
    auto c = std::find_if(l.checks.begin(), l.checks.end(), [&](const grader::CheckSpec& x) { return x.name == name; });
    if (c == l.checks.end()) {
      std::vector<std::string> names;
      for (const auto& x : l.checks) names.push_back(x.name);
      throw ConfigError(fmt::format("lab {} has no check '{}'", l.id, name), fmt::format("its checks: {}", fmt::join(names, ", ")));
    }
    grader::HintRecord r = grader::HintRecord::load(hint_record_path(p, l).string());
    if (!r.unreadable.empty()) std::cerr << "distlab: " << r.unreadable << "\n";
    r.shown.emplace(name, "asked (distlab lab hint)");
    fs::create_directories(lab_build_dir(p, l));
    r.save();
    std::cout << fmt::format("lab {}, {}: {}\n(recorded in {}: your grade reports list the hints you saw)\n", l.id, name, c->hint,
                             hint_record_path(p, l).string());
  });
  auto build_id = std::make_shared<std::string>();
  auto build_solution = std::make_shared<bool>(false);
  auto build_src = std::make_shared<std::string>();
  auto* build = lab->add_subcommand("build", "compile your student/ code into the lab's plugin");
  build->add_option("lab", *build_id, "lab number or name")->required();
  build->add_flag("--solution", *build_solution, "build solutions/NN-* instead (build/labs/NN-*/solution.so)");
  build->add_option("--src", *build_src, "build the lab's files from DIR instead of its student/ folder (a working copy, a second attempt)");
  build->callback([build_id, build_solution, build_src, self_exe, &exit_code] {
    auto p = paths(self_exe);
    auto l = grader::find_lab(p.source_dir, *build_id);
    if (*build_solution && !build_src->empty()) throw ConfigError("lab build: --solution and --src both name the code to build", "give one of them");
    if (!build_src->empty() && !fs::is_directory(*build_src))
      throw ConfigError(fmt::format("lab build --src {}: not a folder", *build_src),
                        fmt::format("give the folder that holds {}", fmt::join(l.files, ", ")));
    const SandboxSupport sb = probe_sandbox();
    const std::string tag = *build_solution ? "solution" : "student";
    const std::string src = *build_solution        ? grader::solution_folder(p.source_dir, p.build_dir, l)
                            : !build_src->empty() ? fs::absolute(*build_src).string()
                                                  : (fs::path(l.dir) / "student").string();
    auto b = grader::build_plugin(p, l, src, (lab_build_dir(p, l) / (tag + ".so")).string(), sb);
    if (!b.ok) {
      std::cerr << "build failed:\n" << b.log;
      exit_code = 2;
      return;
    }
    std::cout << "built " << b.plugin << "\n";
  });

  // Internal (hidden): one file of a submission parsed in a process of its own, so that a parser that crashes
  // or loops on it costs the student a check, not the grader its process (grader/harness.h). Exit 0: parsed;
  // 1: a parse error, printed; anything else: the parser died.
  auto gp = std::make_shared<std::array<std::string, 3>>();  // as, name, file
  auto* parse = app.add_subcommand("grade-parse", "");
  parse->group("");
  parse->add_option("--as", (*gp)[0])->required()->check(CLI::IsMember({"toml", "config"}));
  parse->add_option("--name", (*gp)[1]);
  parse->add_option("file", (*gp)[2])->required();
  parse->callback([gp, &exit_code] {
    const auto& [as, name, file] = *gp;
    try {
      const std::string text = read_file(file);
      check_nesting(text, name);
      if (as == "toml") (void)toml::parse(text, name);
      else (void)parse_config(text, name, {}, {}, lab_config_sections());
    } catch (const toml::parse_error& e) {
      std::cerr << name << ":" << e.source().begin.line << ": " << e.description() << "\n";
      exit_code = 1;
    } catch (const Error& e) {
      std::cerr << e.full() << "\n";
      exit_code = 1;
    }
  });

  auto a = std::make_shared<GradeArgs>();
  auto* grade = app.add_subcommand("grade", "build and grade a lab; a table that explains every point");
  grade->add_option("lab", a->lab, "lab number or name")->required();
  grade->add_flag("--solution", a->solution, "grade solutions/NN-* instead of your student/ folder");
  grade->add_option("--src", a->src, "grade the lab's files in DIR instead of student/ (a working copy; recorded as your grade)");
  grade->add_option("--json", a->json, "write the result as JSON");
  grade->add_option("--junit", a->junit, "write the result as JUnit XML");
  grade->add_option("--html", a->html, "write a report page: the table, and a short run's loss against the engine's, memory and timeline");
  grade->add_option("--submissions", a->submissions, "grade every subfolder of DIR (each a copy of student/)");
  grade->add_option("--csv", a->csv, "with --submissions: the gradebook, one row per student");
  grade->add_option("--feedback", a->feedback, "with --submissions: folder for each student's report (default: feedback/ beside the CSV)");
  grade->add_flag("--no-sandbox", a->no_sandbox, "run the plugin without bubblewrap (your own code only: it can then read your files)");
  grade->add_flag("--require-sandbox", a->require_sandbox, "refuse to grade unless bubblewrap and cgroups all work (for instructors)");
  grade->add_option("--hints", a->hints,
                    "after-failure: a check's hint once it has failed in an earlier grading (default); always: with every failure; never")
      ->check(CLI::IsMember({"after-failure", "always", "never"}));
  grade->add_option("--jobs", a->jobs,
                    "with --submissions: grade N students at once (on C cores, each time limit stretches by max(1, 2N/C))")
      ->check(CLI::Range(1, 64));
  grade->add_option("--seed", a->seed, "the scenarios the checks draw (inputs, sizes, scales, faults): a report's seed reproduces its grading");
  grade->callback([a, self_exe, &exit_code] {
    auto p = paths(self_exe);
    const grader::Scratch scratch;  // every temporary folder of this grading, removed even if the grader is killed
    p.scratch = scratch.root();
    grader::Lab l;
    try {
      l = grader::find_lab(p.source_dir, a->lab);
    } catch (const Error& e) {  // a usage error: exit 2, as for a build error
      std::cerr << "distlab: error: " << e.full() << "\n";
      exit_code = 2;
      return;
    }
    if (!a->src.empty() && (a->solution || !a->submissions.empty() || !fs::is_directory(a->src))) {
      std::cerr << fmt::format("distlab: error: --src {}: {}\n", a->src, !fs::is_directory(a->src) ? "not a folder" : "with --solution or --submissions, give one of them");
      exit_code = 2;
      return;
    }
    if (a->jobs > 1 && a->submissions.empty()) {
      std::cerr << "distlab: error: --jobs grades several students' folders at once: give --submissions DIR\n";
      exit_code = 2;
      return;
    }
    if (!a->html.empty()) check_output_path(a->html, "--html");  // before grading, not after
    SandboxSupport sb = probe_sandbox();
    if (a->no_sandbox) {
      sb.bwrap = false;
      sb.why_not = "--no-sandbox";
    }
    if (a->require_sandbox && !sb.complete()) {
      std::cerr << "distlab: error: --require-sandbox: " << sb.describe() << "\n";
      exit_code = 2;
      return;
    }
    if (!sb.bwrap) std::cerr << "WARNING: " << sb.describe() << "\n";
    if (!a->submissions.empty()) {
      exit_code = grade_submissions(p, l, *a, sb);
      return;
    }
    const std::string tag = a->solution ? "solution" : "student";
    const std::string src = a->solution        ? grader::solution_folder(p.source_dir, p.build_dir, l)
                            : !a->src.empty() ? fs::absolute(a->src).string()
                                              : (fs::path(l.dir) / "student").string();
    grader::SharedResults shared;
    if (a->seed) shared.seed = *a->seed;
    grader::Grade g = grade_folder(p, l, src, tag, (lab_build_dir(p, l) / (tag + ".so")).string(), sb, shared, false);
    g.seed = shared.seed;
    if (a->solution) hints_for(g, "", grader::HintPolicy::always);  // the reference: every hint, nothing recorded
    else hints_for(g, hint_record_path(p, l).string(), *parse_choice<grader::HintPolicy>(a->hints));
    std::cout << grader::table(g);
    if (!a->json.empty()) write_atomically(a->json, grader::to_json(g).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!a->junit.empty()) write_atomically(a->junit, grader::to_junit(g));
    if (!a->html.empty()) {
      grader::ReportRuns runs;
      if (g.built) {
        std::cout << "report: a short run of the lab's config, with your code and with the engine's ...\n" << std::flush;
        runs = grader::run_report_runs(p, l, (lab_build_dir(p, l) / (tag + ".so")).string(), sb);
      } else {
        runs.why_not = "the code did not build";
      }
      write_atomically(a->html, grader::to_html(g, runs));
      std::cout << "wrote " << a->html << "\n";
    }
    if (!a->solution && g.built) record_grade(p, l, g);
    exit_code = !g.built ? 2 : g.points() == l.max_points() ? 0 : 1;
  });
}

}  // namespace distlab
