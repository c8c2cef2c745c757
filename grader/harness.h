// The grading harness: builds a folder of student code into a plugin against the engine, runs each check
// of the lab in its own sandboxed child process (wall-clock and memory limits, a private /tmp, no network),
// and turns the outcomes into points. A crash, hang, exception or allocation storm fails that check only.
#pragma once
#include <string>
#include <vector>

#include "grader/lab.h"

namespace distlab::grader {

struct Paths {
  std::string source_dir;  // the repository (labs/, solutions/)
  std::string build_dir;   // where plugins go (build/labs/...)
  std::string lib_dir;     // libdistlab_core.so
  std::string self_exe;    // this distlab binary (runs `distlab lab-check` in the child)
};

struct BuildResult {
  bool ok = false;
  std::string plugin;  // the .so
  std::string log;     // the compiler's output
};
// Compiles lab.files from src_dir into build_dir/labs/<lab>/<tag>.so.
BuildResult build_plugin(const Paths& p, const Lab& lab, const std::string& src_dir, const std::string& tag);

struct CheckOutcome {
  CheckSpec spec;
  std::string status;  // pass | fail | error | crash | timeout
  int points = 0;
  std::string expected, seen, hint;
  double seconds = 0;
};

struct Sandbox {
  bool bubblewrap = false;  // false: rlimits and a process group only
  std::string note;         // what is used, for the report
};
Sandbox detect_sandbox(bool allow);

std::vector<CheckOutcome> run_checks(const Paths& p, const Lab& lab, const std::string& plugin, const Sandbox& sb);

// The child's side: loads the plugin, runs one check, prints "DISTLAB_CHECK_RESULT {json}". Returns 0.
int run_check_in_child(const std::string& lab_id, const std::string& check, const std::string& plugin);

}  // namespace distlab::grader
