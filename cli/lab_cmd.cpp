#include "cli/lab_cmd.h"

#include "cli/grade_batch.h"
#include "cli/gradescope_cmd.h"
#include "cli/slurm_grade.h"

#include <fmt/format.h>
#include <zlib.h>

#include <array>
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

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path lab_build_dir(const grader::Paths& p, const grader::Lab& lab) { return fs::path(p.build_dir) / "labs" / lab.name; }

// Where a source folder's own state lives: its plugin (student.so), the hints it was shown (hints.json) and
// its grades (last_grade.json). The lab's student/ folder keeps them in the lab's build folder; any other
// working copy (--src DIR) in a folder of its own, build/labs/NN-name/src/<crc of its path>-<its name>/,
// so that two copies (two students on one clone) never overwrite each other's plugin, hints or grade, and
// a hint is shown after that copy's own failure, not another's.
fs::path state_dir(const grader::Paths& p, const grader::Lab& lab, const std::string& src = "") {
  if (src.empty()) return lab_build_dir(p, lab);
  std::error_code ec;
  const fs::path abs = fs::weakly_canonical(fs::absolute(src), ec);
  if (abs == fs::weakly_canonical(fs::path(lab.dir) / "student", ec)) return lab_build_dir(p, lab);
  std::string name;
  for (char c : abs.filename().string())
    if (name.size() < 40) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
  const std::string path = abs.string();
  const fs::path dir = lab_build_dir(p, lab) / "src" /
                       fmt::format("{:08x}-{}", ::crc32(0L, reinterpret_cast<const Bytef*>(path.data()), uInt(path.size())), name);
  fs::create_directories(dir, ec);
  try {
    if (!fs::exists(dir / "source.txt")) write_atomically((dir / "source.txt").string(), path + "\n");  // whose state this is
  } catch (const std::exception&) {  // a note for people: a folder that can't take it fails later, naming what it could not write
  }
  return dir;
}
fs::path last_grade_path(const grader::Paths& p, const grader::Lab& lab, const std::string& src = "") {
  return state_dir(p, lab, src) / "last_grade.json";
}
fs::path hint_record_path(const grader::Paths& p, const grader::Lab& lab, const std::string& src = "") {
  return state_dir(p, lab, src) / "hints.json";
}

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

void record_grade(const grader::Paths& p, const grader::Lab& lab, const grader::Grade& g, const std::string& src) {
  const fs::path f = last_grade_path(p, lab, src);
  int best = g.points();
  if (fs::exists(f)) {
    auto old = nlohmann::json::parse(read_file(f), nullptr, false);
    if (old.is_object() && old.contains("best") && old["best"].is_object() && old["best"].value("max_points", -1) == lab.max_points())
      best = std::max(best, old["best"].value("points", 0));
  }
  nlohmann::json rec = {{"last", grader::to_json(g)}, {"best", {{"points", best}, {"max_points", lab.max_points()}}}};
  write_atomically(f.string(), rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace

void add_lab_commands(CLI::App& app, int& exit_code, const std::string& self_exe) {
  CLI::App* lab = app.add_subcommand("lab", "the course's labs: list, show, build");
  lab->require_subcommand(1);
  lab->add_subcommand("list", "every lab with its status")->callback([self_exe] {
    auto p = grader_paths(self_exe);
    std::cout << fmt::format("{:<22} {:<66} {:>6}  {}\n", "lab", "title", "points", "status");
    for (const auto& l : grader::all_labs(p.source_dir))
      std::cout << fmt::format("{:<22} {:<66} {:>6}  {}\n", l.name, l.title, l.max_points(), status_of(p, l));
  });
  auto show_id = std::make_shared<std::string>();
  auto* show = lab->add_subcommand("show", "the task: goal, files, checks and points, how to run");
  show->add_option("lab", *show_id, "lab number or name")->required();
  show->callback([show_id, self_exe] {
    auto p = grader_paths(self_exe);
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
  auto hint_args = std::make_shared<std::array<std::string, 3>>();  // lab, check, --src
  auto* hint = lab->add_subcommand("hint", "a check's hint now, before it has failed twice (recorded: the report lists the hints you saw)");
  hint->add_option("lab", (*hint_args)[0], "lab number or name")->required();
  hint->add_option("check", (*hint_args)[1], "the check's name (distlab lab show NN lists them)")->required();
  hint->add_option("--src", (*hint_args)[2], "the working copy whose record it goes into (as given to grade --src)");
  hint->callback([hint_args, self_exe, &exit_code] {
    auto p = grader_paths(self_exe);
    const auto l = grader::find_lab(p.source_dir, (*hint_args)[0]);
    const std::string& name = (*hint_args)[1];
    auto c = std::find_if(l.checks.begin(), l.checks.end(), [&](const grader::CheckSpec& x) { return x.name == name; });
    if (c == l.checks.end()) {
      std::vector<std::string> names;
      for (const auto& x : l.checks) names.push_back(x.name);
      throw ConfigError(fmt::format("lab {} has no check '{}'", l.id, name), fmt::format("its checks: {}", fmt::join(names, ", ")));
    }
    const fs::path record = hint_record_path(p, l, (*hint_args)[2]);
    grader::HintRecord r = grader::HintRecord::load(record.string());
    if (!r.unreadable.empty()) std::cerr << "distlab: " << r.unreadable << "\n";
    r.shown.emplace(name, "asked (distlab lab hint)");
    fs::create_directories(record.parent_path());
    r.save();
    std::cout << fmt::format("lab {}, {}: {}\n(recorded in {}: your grade reports list the hints you saw)\n", l.id, name, c->hint,
                             record.string());
  });
  auto build_id = std::make_shared<std::string>();
  auto build_solution = std::make_shared<bool>(false);
  auto build_src = std::make_shared<std::string>();
  auto* build = lab->add_subcommand("build", "compile your student/ code into the lab's plugin");
  build->add_option("lab", *build_id, "lab number or name")->required();
  build->add_flag("--solution", *build_solution, "build solutions/NN-* instead (build/labs/NN-*/solution.so)");
  build->add_option("--src", *build_src, "build the lab's files from DIR instead of its student/ folder (a working copy, a second attempt)");
  build->callback([build_id, build_solution, build_src, self_exe, &exit_code] {
    auto p = grader_paths(self_exe);
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
    const fs::path dir = *build_solution ? lab_build_dir(p, l) : state_dir(p, l, *build_src);
    auto b = grader::build_plugin(p, l, src, (dir / (tag + ".so")).string(), sb);
    if (!b.ok) {
      std::cerr << "build failed:\n" << b.log;
      exit_code = 2;
      return;
    }
    std::cout << "built " << b.plugin << "\n";
    if (dir != lab_build_dir(p, l) && !l.answers)  // a working copy's plugin is not the one a lab's config runs by default
      std::cout << fmt::format("run it: distlab run -n 2 train {} --set lab.plugin={}\n",
                               (fs::path(l.dir) / "lab.toml").lexically_relative(p.source_dir).string(), b.plugin);
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
  grade->add_option("lab", a->lab, "lab number or name");
  grade->add_flag("--solution", a->solution, "grade solutions/NN-* instead of your student/ folder");
  grade->add_option("--src", a->src, "grade the lab's files in DIR instead of student/ (a working copy; recorded as your grade)");
  grade->add_option("--json", a->json, "write the result as JSON");
  grade->add_option("--junit", a->junit, "write the result as JUnit XML");
  grade->add_option("--html", a->html, "write a report page: the table, and a short run's loss against the engine's, memory and timeline");
  grade->add_option("--submissions", a->submissions, "grade every subfolder of DIR (each a copy of student/)");
  grade->add_option("--csv", a->csv, "with --submissions: the gradebook, one row per student");
  grade->add_option("--feedback", a->feedback, "with --submissions: folder for each student's report (default: feedback/ beside the CSV; with --check, feedback-check/)");
  grade->add_flag("--no-sandbox", a->no_sandbox, "run the plugin without bubblewrap (your own code only: it can then read your files)");
  grade->add_flag("--require-sandbox", a->require_sandbox, "refuse to grade unless bubblewrap and cgroups all work (for instructors)");
  grade->add_option("--hints", a->hints,
                    "after-failure: a check's hint once it has failed in an earlier grading (default); always: with every failure; never")
      ->check(CLI::IsMember({"after-failure", "always", "never"}));
  grade->add_option("--jobs", a->jobs,
                    "with --submissions: grade N students at once (on C cores, each time limit stretches by max(1, 2N/C))")
      ->check(CLI::Range(1, 64));
  grade->add_option("--seed", a->seed, "the scenarios the checks draw (inputs, sizes, scales, faults): a report's seed reproduces its grading");
  grade->add_option("--device", a->device,
                    "where the training jobs run: auto (cuda when a GPU is here, else cpu), cpu, cuda (a GPU per rank) or cuda-sim "
                    "(the GPU's code path on the CPU)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda", "cuda-sim"}));
  grade->add_option("--check", a->only,
                    "run only this check (repeatable): quicker while you work on one; the grade is not recorded (distlab lab list keeps "
                    "your last whole grading). With --submissions: the class regraded on these checks, its CSV's points, max and "
                    "percent theirs")
      ->allow_extra_args(false);
  grade->add_flag("--measure-speedup", a->measure_speedup,
                  "lab 02: measure the speed-up of 2 ranks over 1 on this machine, beside the modeled T4s (the default on 2 GPUs "
                  "or more, one grading at a time; on cpu ranks, each rank gets its share of the cores)");
  grade->add_flag("--slurm", a->slurm, "with --submissions: grade the class as a Slurm array job (sbatch), then `distlab grade merge`");
  grade->add_option("--results", a->results, "with --slurm: the grading's folder (default: DIR-slurm beside the submissions)");
  grade->add_option("--per-task", a->per_task, "with --slurm: students per array task (default 1)")->check(CLI::Range(1, 100000));
  grade->add_option("--max-running", a->max_running, "with --slurm: array tasks at once (sbatch --array=...%M; default: Slurm's)")->check(CLI::Range(0, 100000));
  grade->add_option("--cpus-per-task", a->cpus_per_task, "with --slurm: CPUs for each task (default 2: a check runs 2 ranks)")->check(CLI::Range(1, 1024));
  grade->add_option("--time", a->time, "with --slurm: each task's time limit (default 00:30:00)");
  grade->add_option("--partition", a->partition, "with --slurm: the partition (default: the cluster's)");
  grade->add_option("--sbatch-arg", a->sbatch_args, "with --slurm: one more argument for sbatch, e.g. --sbatch-arg=--account=cs101 (repeatable)")->allow_extra_args(false);
  grade->add_flag("--wait", a->wait, "with --slurm: wait for the array job to end, then merge");
  grade->add_option("--roster", a->roster, "with --submissions: a CSV of folder,id,name,email: the gradebook's rows carry them, and "
                                           "students without a submission get a row");
  grade->add_option("--gradescope", a->gradescope, "Gradescope's autograder: grade ROOT/submission, write ROOT/results/results.json "
                                                   "(ROOT: /autograder)")
      ->expected(0, 1)
      ->default_str("/autograder");
  grade->add_option("--gradescope-bundle", a->gradescope_bundle, "write DIR/setup.sh, DIR/run_autograder and this source: zip DIR's "
                                                                 "files as the assignment's autograder");
  grade->add_option("--slurm-task", a->slurm_task, "(an array task of --slurm: grade its students into the folder)")->group("");
  auto merge = std::make_shared<std::array<std::string, 3>>();
  auto* merge_cmd = grade->add_subcommand("merge", "the gradebook of a --slurm grading: every task's row, and the students whose task left none");
  merge_cmd->add_option("results", (*merge)[0], "the grading's folder (--results)")->required();
  merge_cmd->add_option("--csv", (*merge)[1], "the gradebook (default: RESULTS/grades.csv)");
  merge_cmd->add_option("--json", (*merge)[2], "every row as JSON (default: RESULTS/grades.json)");
  merge_cmd->callback([merge, self_exe, &exit_code] { exit_code = merge_slurm_grading(grader_paths(self_exe), (*merge)[0], (*merge)[1], (*merge)[2]); });
  grade->callback([a, self_exe, merge_cmd, grade, &exit_code] {
    if (merge_cmd->parsed()) return;
    if (a->lab.empty()) throw CLI::RequiredError("lab");
    auto p = grader_paths(self_exe);
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
    // some checks: one student's quick look, or a class regraded on the checks an instructor names (a check
    // changed, a machine that failed one); an LMS's gradebook and a Slurm array hold whole gradings
    if (!a->only.empty()) {
      try {
        if (a->slurm || !a->slurm_task.empty() || grade->count("--gradescope") || !a->gradescope_bundle.empty() || !a->roster.empty())
          throw ConfigError("--check grades some of the lab's checks, of one copy (yours, --src DIR, --solution) or of a class (--submissions DIR)",
                            "an LMS's gradebook (--roster, --gradescope) and a Slurm array (--slurm) take whole gradings: leave out --check");
        l = grader::with_only_checks(l, a->only);
      } catch (const Error& e) {  // a usage error: exit 2, as for an unknown lab
        std::cerr << "distlab: error: " << e.full() << "\n";
        exit_code = 2;
        return;
      }
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
    if (!a->slurm_task.empty()) {
      exit_code = run_slurm_grading_task(p, l, *a, sb);
      return;
    }
    if (!a->slurm && (!a->results.empty() || a->wait || a->per_task != 1 || a->max_running != 0 || !a->sbatch_args.empty()))
      throw ConfigError("--results, --wait, --per-task, --max-running and --sbatch-arg go with --slurm", "add --slurm (and --submissions DIR)");
    if (a->slurm) {
      if (a->submissions.empty()) throw ConfigError("--slurm grades a class: give --submissions DIR");
      exit_code = submit_slurm_grading(p, l, *a, sb);
      return;
    }
    if (!a->submissions.empty()) {
      exit_code = grade_submissions(p, l, *a, sb);
      return;
    }
    if (!a->roster.empty()) throw ConfigError("--roster goes with --submissions (a class's gradebook)", "add --submissions DIR --csv FILE");
    if (!a->gradescope_bundle.empty()) {
      write_gradescope_bundle(p, l, a->gradescope_bundle);
      return;
    }
    if (grade->count("--gradescope")) {
      exit_code = grade_for_gradescope(p, l, a->gradescope.empty() ? "/autograder" : a->gradescope, sb,
                                       grade->count("--hints") ? *parse_choice<grader::HintPolicy>(a->hints) : grader::HintPolicy::always);
      return;
    }
    const std::string tag = a->solution ? "solution" : "student";
    const std::string src = a->solution        ? grader::solution_folder(p.source_dir, p.build_dir, l)
                            : !a->src.empty() ? fs::absolute(a->src).string()
                                              : (fs::path(l.dir) / "student").string();
    grader::SharedResults shared;
    if (a->seed) shared.seed = *a->seed;
    set_grading_device(shared, a->device);
    shared.measure_speedup = a->measure_speedup;
    const fs::path dir = a->solution ? lab_build_dir(p, l) : state_dir(p, l, a->src);  // --src DIR: that copy's own
    grader::Grade g = grade_folder(p, l, src, tag, (dir / (tag + ".so")).string(), sb, shared, false);
    g.seed = shared.seed;
    if (a->solution) hints_for(g, "", grader::HintPolicy::always);  // the reference: every hint, nothing recorded
    else hints_for(g, hint_record_path(p, l, a->src).string(), *parse_choice<grader::HintPolicy>(a->hints));
    std::cout << grader::table(g);
    if (!a->json.empty()) write_atomically(a->json, grader::to_json(g).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!a->junit.empty()) write_atomically(a->junit, grader::to_junit(g));
    if (!a->html.empty()) {
      grader::ReportRuns runs;
      if (g.built) {
        std::cout << "report: a short run of the lab's config, with your code and with the engine's ...\n" << std::flush;
        runs = grader::run_report_runs(p, l, (dir / (tag + ".so")).string(), sb);
      } else {
        runs.why_not = "the code did not build";
      }
      write_atomically(a->html, grader::to_html(g, runs));
      std::cout << "wrote " << a->html << "\n";
    }
    if (!a->solution && g.built && !l.partial) record_grade(p, l, g, a->src);
    exit_code = !g.built ? 2 : g.points() == l.max_points() ? 0 : 1;
  });
}

}  // namespace distlab
