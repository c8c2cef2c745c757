// What an instructor's learning-management system takes from a batch of gradings: the gradebook CSV (a row
// per student with the roster's id, name and email, the lab and its version, points, max and percent, the
// grader's version and the date), Gradescope's results.json, and the submissions that look copied.
// Read grader/report.h first (one grade's table, JSON and JUnit).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grader/report.h"

namespace distlab::grader {

// A class list: a CSV with a header naming its columns — folder (or student, the submission's folder name),
// id, name, email — in any order, extra columns ignored. Errors name the file and the line.
struct RosterEntry {
  std::string id, name, email;
};
using Roster = std::map<std::string, RosterEntry>;  // by folder name
Roster read_roster(const std::string& path);

// The batch's columns that are the same on every row.
struct BatchInfo {
  std::string lab_version;     // CRC-32 of the lab's lab.toml and api.h: a student graded on another version shows
  std::string grader_version;  // CRC-32 of the engine that graded (distlab, its lab host, its library)
  std::string date;            // when the batch was graded, UTC, ISO 8601
  const Roster* roster = nullptr;
};
BatchInfo batch_info(const Paths& p, const Lab& lab, const Roster* roster);

// The gradebook: student, id, name, email, lab, lab_version, the checks' points, points, max, percent, error,
// grader_version, date. Students of the roster without a submission get a row of zeros saying so.
std::string gradebook_csv(const std::vector<Grade>& grades, const BatchInfo& info);

// Gradescope's autograder results (https://gradescope-autograders.readthedocs.io, "results.json"): score,
// output (the table), and a test per check with its score, max_score, output and visibility.
nlohmann::json gradescope_results(const Grade& g);

// Submissions that look copied: their lab files compared as token sequences with comments, spacing and
// names normalized away (a renamed variable is the same token). identical: the same sequence; else the
// share of 8-token runs they have in common, listed from `min_share` (0.8) up. `baseline` is what the lab
// hands out (its skeleton): a submission equal to it is not started, and its runs count for no one.
struct Similar {
  std::string a, b;
  double share = 0;
  bool identical = false;
};
std::vector<Similar> similar_submissions(const std::vector<std::pair<std::string, std::string>>& texts, const std::string& baseline,
                                         double min_share = 0.8);

}  // namespace distlab::grader
