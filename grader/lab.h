// A lab as the grader sees it: read from labs/NN-name/lab.toml (the task, its checks and points: the
// student's folder) and grader/labs/NN-name/hints.toml (each check's hint and the engine's answer: not the
// student's folder). A lab's checks are code: grader/labs/NN-name/checks.cpp (docs/GRADER.md: how to add a lab).
#pragma once
#include <string>
#include <vector>

namespace distlab::grader {

struct CheckSpec {
  std::string name;   // the check's id in the lab's check table
  int points = 0;
  double timeout_s = 60;
  int64_t memory_mb = 4096;
  std::string what;   // what it checks, for the table and `lab show`
  std::string hint;   // grader/labs/<lab>/hints.toml: shown when it fails again (grader/hints.h)
  // a clinic's case (lab 08): the lab its file belongs to, the file (a path under student/), the checks
  // of that lab that must pass once the bug is fixed
  std::string case_lab, case_file;
  std::vector<std::string> case_checks;
  // ... or a config case: the story's job (config, a file of the clinic run on `ranks` ranks), the keys the
  // fix may change (every other key is the story's), what the fixed run must show (expect, limit) and the
  // engine's run it is measured against (the story's config with `reference` overrides on reference_ranks)
  std::string case_config, case_expect;
  int case_ranks = 2, case_reference_ranks = 1;
  double case_limit = 0;
  std::vector<std::string> case_change, case_reference;
};

struct Lab {
  std::string id;       // "01"
  std::string name;     // "01-collectives"
  std::string title;
  std::string dir;      // labs/01-collectives
  std::vector<std::string> files;  // the student's files (student/<file>)
  std::vector<CheckSpec> checks;
  std::string engine;   // grader/labs/<lab>/hints.toml: where the engine does what the lab asks (after full marks)
  bool answers = false;  // [lab] kind = "answers": the student's files are data (TOML), read by the checks, not compiled
  bool clinic = false;   // [lab] kind = "clinic": each file is a case of another lab (answers-like bundle, cases built by the checks)
  bool trains = false;  // lab.toml is a training config (it has [model]): the HTML report runs it
  int ranks = 2;        // [lab] ranks: how many ranks its config runs on (the README's distlab run -n)
  // `distlab grade NN --check NAME`: only some of lab.toml's checks (`checks` holds those), so nothing is
  // recorded or kept that a whole grading would read (the grade, the reference's times)
  bool partial = false;
  int max_points() const;
};

std::vector<Lab> all_labs(const std::string& source_dir);
// The folder of a lab's solution: solutions/NN-name. A clinic's code cases are the solutions of the labs
// they come from, not copies: its folder is assembled under build_dir from solutions/08-clinic (the config
// cases' fixes) and, for each code case, solutions/<its lab>/<file>.
std::string solution_folder(const std::string& source_dir, const std::string& build_dir, const Lab& lab);
Lab find_lab(const std::string& source_dir, const std::string& id_or_name);  // ConfigError listing the labs
// The lab with only the named checks, in lab.toml's order (partial); a name it does not have is a
// ConfigError listing its checks.
Lab with_only_checks(const Lab& lab, const std::vector<std::string>& names);

}  // namespace distlab::grader
