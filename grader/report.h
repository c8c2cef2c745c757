// Grade reports: the terminal table, JSON, JUnit XML, and the instructor's CSV gradebook.
#pragma once
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "grader/harness.h"

namespace distlab::grader {

struct Grade {
  std::string student;  // "student", "solution", or a submission's folder name
  Lab lab;
  bool built = false;
  std::string build_log;
  std::vector<CheckOutcome> checks;
  uint64_t seed = 0;  // the grading's scenarios (grader/check.h): `distlab grade --seed` reproduces them
  std::string device = "cpu";  // where its training jobs ran: cpu, cuda (GPUs, NCCL) or cuda-sim (the GPU's path on the CPU)
  std::map<std::string, std::string> hints_shown;  // every hint this student has seen, and how (grader/hints.h)
  int points() const;
};

// The table: every check's points and measured numbers; a failure's expected and seen, and its hint or
// why it is held back (grader/hints.h); the hints this student has seen; with full marks, the engine's answer.
std::string table(const Grade& g);
// Why no check ran: "build failed" (the compiler's log follows) or "not graded" (the grader failed on it, or
// a Slurm task left no row: code that may well build). "" when it was graded.
std::string not_run_reason(const Grade& g);
std::string held_hint_text(const Lab& lab, const std::string& check);
bool full_marks(const Grade& g);
nlohmann::json to_json(const Grade& g);
// A row written by to_json read back against the lab it claims (a Slurm array task's, cli/slurm_grade.h):
// std::nullopt with `why` set when it is not one of this lab's rows (a check it does not have, points out of
// range, a field missing or of the wrong type).
std::optional<Grade> grade_from_json(const nlohmann::json& j, const Lab& lab, std::string& why);
std::string to_junit(const Grade& g);
// The gradebook over a batch: grader/gradebook.h. Every text in every report (a folder's name, a plugin's
// output, a build log) passes through sanitize_output: no control or bidi character reaches a terminal, a
// spreadsheet or a browser raw.

}  // namespace distlab::grader
