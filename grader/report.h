// Grade reports: the terminal table, JSON, JUnit XML, and the instructor's CSV gradebook.
#pragma once
#include <nlohmann/json.hpp>
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
  int points() const;
};

std::string table(const Grade& g);
nlohmann::json to_json(const Grade& g);
std::string to_junit(const Grade& g);
// One row per student: id, points per check, total, error. Every text in every report (a folder's name, a
// plugin's output, a build log) passes through sanitize_output: no control or bidi character reaches a
// terminal, a spreadsheet or a browser raw.
std::string gradebook_csv(const std::vector<Grade>& grades);

}  // namespace distlab::grader
