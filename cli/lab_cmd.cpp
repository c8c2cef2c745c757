#include "cli/lab_cmd.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/util/error.h"
#include "grader/harness.h"
#include "grader/report.h"

namespace fs = std::filesystem;

namespace distlab {

namespace {

grader::Paths paths(const std::string& self_exe) {
  return {DISTLAB_SOURCE_DIR, DISTLAB_BUILD_DIR, DISTLAB_LIB_DIR, self_exe};
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path last_grade_path(const grader::Paths& p, const grader::Lab& lab) {
  return fs::path(p.build_dir) / "labs" / lab.name / "last_grade.json";
}

std::string status_of(const grader::Paths& p, const grader::Lab& lab) {
  if (fs::exists(last_grade_path(p, lab))) {
    auto j = nlohmann::json::parse(read_file(last_grade_path(p, lab)));
    const int pts = j["points"], max = j["max_points"];
    return fmt::format("{} ({}/{})", pts == max ? "passed" : "graded", pts, max);
  }
  if (fs::exists(fs::path(p.build_dir) / "labs" / lab.name / "student.so")) return "built";
  return "not started";
}

grader::Grade grade_folder(const grader::Paths& p, const grader::Lab& lab, const std::string& src, const std::string& who,
                           const grader::Sandbox& sb, bool quiet) {
  grader::Grade g;
  g.student = who;
  g.lab = lab;
  const std::string tag = who == "student" || who == "solution" ? who : "sub-" + who;
  if (!quiet) std::cout << fmt::format("building {} from {} ...\n", lab.name, src) << std::flush;
  grader::BuildResult b = grader::build_plugin(p, lab, src, tag);
  g.built = b.ok;
  g.build_log = b.log;
  if (b.ok) {
    if (!quiet) std::cout << fmt::format("running {} checks ({})\n", lab.checks.size(), sb.note) << std::flush;
    g.checks = grader::run_checks(p, lab, b.plugin, sb);
  }
  return g;
}

}  // namespace

void add_lab_commands(CLI::App& app, int& exit_code, const std::string& self_exe) {
  CLI::App* lab = app.add_subcommand("lab", "the course's labs: list, show, build");
  lab->require_subcommand(1);
  lab->add_subcommand("list", "every lab with its status")->callback([self_exe] {
    auto p = paths(self_exe);
    std::cout << fmt::format("{:<22} {:<50} {:>6}  {}\n", "lab", "title", "points", "status");
    for (const auto& l : grader::all_labs(p.source_dir))
      std::cout << fmt::format("{:<22} {:<50} {:>6}  {}\n", l.name, l.title, l.max_points(), status_of(p, l));
  });
  auto show_id = std::make_shared<std::string>();
  auto* show = lab->add_subcommand("show", "the task: goal, files, checks and points, how to run");
  show->add_option("lab", *show_id, "lab number or name")->required();
  show->callback([show_id, self_exe] {
    auto p = paths(self_exe);
    auto l = grader::find_lab(p.source_dir, *show_id);
    std::cout << read_file(fs::path(l.dir) / "README.md") << "\n## Checks (" << l.max_points() << " points)\n\n";
    for (const auto& c : l.checks) std::cout << fmt::format("- {} ({} points): {}\n", c.name, c.points, c.what);
    std::cout << fmt::format("\nEdit {}/student/{}; build with `distlab lab build {}`; grade with `distlab grade {}`.\n",
                             l.dir.substr(p.source_dir.size() + 1), fmt::join(l.files, ", student/"), l.id, l.id);
  });
  auto build_id = std::make_shared<std::string>();
  auto build_solution = std::make_shared<bool>(false);
  auto* build = lab->add_subcommand("build", "compile your student/ code into the lab's plugin");
  build->add_option("lab", *build_id, "lab number or name")->required();
  build->add_flag("--solution", *build_solution, "build solutions/NN-* instead (build/labs/NN-*/solution.so)");
  build->callback([build_id, build_solution, self_exe, &exit_code] {
    auto p = paths(self_exe);
    auto l = grader::find_lab(p.source_dir, *build_id);
    auto b = *build_solution ? grader::build_plugin(p, l, (fs::path(p.source_dir) / "solutions" / l.name).string(), "solution")
                             : grader::build_plugin(p, l, (fs::path(l.dir) / "student").string(), "student");
    if (!b.ok) {
      std::cerr << "build failed:\n" << b.log;
      exit_code = 2;
      return;
    }
    std::cout << "built " << b.plugin << "\n";
  });

  struct GradeArgs {
    std::string lab, json, junit, submissions, csv;
    bool solution = false, no_sandbox = false;
  };
  auto a = std::make_shared<GradeArgs>();
  auto* grade = app.add_subcommand("grade", "build and grade a lab; a table that explains every point");
  grade->add_option("lab", a->lab, "lab number or name")->required();
  grade->add_flag("--solution", a->solution, "grade solutions/NN-* instead of your student/ folder");
  grade->add_option("--json", a->json, "write the result as JSON");
  grade->add_option("--junit", a->junit, "write the result as JUnit XML");
  grade->add_option("--submissions", a->submissions, "grade every subfolder of DIR (each a copy of student/)");
  grade->add_option("--csv", a->csv, "with --submissions: the gradebook, one row per student");
  grade->add_flag("--no-sandbox", a->no_sandbox, "run checks without bubblewrap (rlimits only)");
  grade->callback([a, self_exe, &exit_code] {
    auto p = paths(self_exe);
    grader::Lab l;
    try {
      l = grader::find_lab(p.source_dir, a->lab);
    } catch (const Error& e) {  // a usage error: exit 2, as for a build error
      std::cerr << "distlab: error: " << e.full() << "\n";
      exit_code = 2;
      return;
    }
    const grader::Sandbox sb = grader::detect_sandbox(!a->no_sandbox);
    if (!a->submissions.empty()) {
      if (!fs::is_directory(a->submissions))
        throw ConfigError("--submissions " + a->submissions + " is not a folder", "give a folder with one subfolder per student");
      std::vector<grader::Grade> grades;
      std::vector<fs::path> dirs;
      for (const auto& d : fs::directory_iterator(a->submissions))
        if (d.is_directory()) dirs.push_back(d.path());
      std::sort(dirs.begin(), dirs.end());
      std::cout << sb.note << "\n";
      for (const auto& d : dirs) {
        grades.push_back(grade_folder(p, l, d.string(), d.filename().string(), sb, true));
        std::cout << fmt::format("{:<24} {:>3}/{}{}\n", d.filename().string(), grades.back().points(), l.max_points(),
                                 grades.back().built ? "" : "  (build failed)")
                  << std::flush;
      }
      if (!a->csv.empty()) std::ofstream(a->csv) << grader::gradebook_csv(grades);
      if (!a->json.empty()) {
        nlohmann::json all = nlohmann::json::array();
        for (const auto& g : grades) all.push_back(grader::to_json(g));
        std::ofstream(a->json) << all.dump(2) << "\n";
      }
      exit_code = 0;
      return;
    }
    const std::string src = a->solution ? (fs::path(p.source_dir) / "solutions" / l.name).string()
                                        : (fs::path(l.dir) / "student").string();
    grader::Grade g = grade_folder(p, l, src, a->solution ? "solution" : "student", sb, false);
    std::cout << grader::table(g);
    if (!a->json.empty()) std::ofstream(a->json) << grader::to_json(g).dump(2) << "\n";
    if (!a->junit.empty()) std::ofstream(a->junit) << grader::to_junit(g);
    if (!a->solution && g.built) std::ofstream(last_grade_path(p, l)) << grader::to_json(g).dump() << "\n";
    exit_code = !g.built ? 2 : g.points() == l.max_points() ? 0 : 1;
  });

  auto c = std::make_shared<std::vector<std::string>>();
  auto* check = app.add_subcommand("lab-check", "(used by the grader) run one check in this process");
  check->group("");  // hidden from --help
  check->add_option("args", *c, "LAB CHECK PLUGIN")->expected(3)->required();
  check->callback([c, &exit_code] { exit_code = grader::run_check_in_child((*c)[0], (*c)[1], (*c)[2]); });
}

}  // namespace distlab
