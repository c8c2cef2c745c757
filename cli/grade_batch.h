// Grading students' folders: one folder (`distlab grade NN`), a class on this machine (`--submissions DIR`,
// `--jobs N` at once), and the pieces a Slurm array task shares with them (cli/slurm_grade.h): one
// submission graded into a row, its feedback file written atomically.
// Read next: grader/harness.h (building a plugin, running the checks), grader/report.h (the row, the CSV).
#pragma once
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "grader/bridge/sandbox.h"
#include "grader/harness.h"
#include "grader/hints.h"
#include "grader/report.h"

namespace distlab {

struct GradeArgs {
  std::string lab, json, junit, submissions, csv, feedback, html;
  std::string hints = "after-failure";  // grader/hints.h
  std::string src;  // --src: the student's files from this folder instead of student/
  std::string roster;  // --roster: folder -> id, name, email (grader/gradebook.h)
  std::string gradescope;         // --gradescope: grade ROOT/submission, write ROOT/results/results.json
  std::string gradescope_bundle;  // --gradescope-bundle DIR: write setup.sh, run_autograder and the source
  bool solution = false, no_sandbox = false, require_sandbox = false;
  std::optional<uint64_t> seed;  // the grading's scenarios; drawn afresh when not given
  int jobs = 1;  // --submissions: how many students are graded at once
  std::string device = "auto";  // --device: where the training jobs run (auto: cuda when a GPU is here, else cpu)
  bool measure_speedup = false;  // --measure-speedup: lab 02's speed-up measured here, on any device
  std::vector<std::string> only;  // --check NAME (repeatable): only these checks, the grade not recorded
  // --slurm: the class as a Slurm array job (cli/slurm_grade.h)
  bool slurm = false, wait = false;
  std::string results;                  // the grading's folder (manifest, script, rows, feedback, logs)
  std::string slurm_task;               // (internal) grade this array task's students of the folder given
  int per_task = 1, max_running = 0;    // students per array task; tasks at once (0: Slurm's choice)
  int cpus_per_task = 2;
  std::string time = "00:30:00", partition;
  std::vector<std::string> sbatch_args;  // passed to sbatch as they are
};

grader::Paths grader_paths(const std::string& self_exe);
// --device: auto (cuda when this machine has a usable GPU, else cpu), cpu, cuda or cuda-sim onto the batch;
// ConfigError for cuda without a GPU (with the reason) and for anything else
void set_grading_device(grader::SharedResults& batch, const std::string& device);
void write_atomically(const std::string& path, const std::string& text);
// Shows the hints a grading may show, then records the failures and the hints; a record that can't be
// read or written is said on stderr and costs nothing else.
void hints_for(grader::Grade& g, const std::string& record_path, grader::HintPolicy policy);
grader::Grade grade_folder(const grader::Paths& p, const grader::Lab& lab, const std::string& src, const std::string& who,
                           const std::string& plugin, const SandboxSupport& sb, grader::SharedResults& shared, bool quiet);

// The submissions' entries, sorted by name (each student's folder, or whatever else is there: graded as a row
// that says why).
std::vector<std::filesystem::path> submission_entries(const std::string& dir);
// A feedback file's name from a submission's folder name, unique among `taken`.
std::string feedback_name(const std::string& student, std::set<std::string>& taken);
// One student's entry graded with the batch's references and seed; never throws: what goes wrong is the row.
grader::Grade grade_submission(const grader::Paths& p, const grader::Lab& l, const std::filesystem::path& entry,
                               const grader::SharedResults& batch, const SandboxSupport& sb);
// <feedback>/<name>.txt (the table) and <name>.hints.json; a write that fails is said on stderr.
void write_feedback(grader::Grade& g, const std::filesystem::path& feedback, const std::string& name, grader::HintPolicy policy);

// `--submissions DIR` on this machine: a CSV row and a feedback file each.
int grade_submissions(const grader::Paths& p, const grader::Lab& l, const GradeArgs& a, const SandboxSupport& sb);

}  // namespace distlab
