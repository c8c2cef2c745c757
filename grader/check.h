// What a check reports, and the registry of checks by lab. Checks run inside a sandboxed child process
// (`distlab lab-check`), with the student's plugin loaded; references come from the engine, never from the
// submission.
#pragma once
#include <functional>
#include <map>
#include <string>

namespace distlab::grader {

struct CheckResult {
  bool passed = false;
  std::string expected, seen;  // what should have happened, what did
  std::string detail;          // extra evidence (optional)
};

using CheckFn = std::function<CheckResult(void* plugin_handle)>;
// The checks a lab's lab.toml may name (check name -> function); empty for an unknown lab.
std::map<std::string, CheckFn> checks_for_lab(const std::string& lab_id);
std::map<std::string, CheckFn> lab01_checks();
std::map<std::string, CheckFn> lab02_checks();

// Looks up `symbol` in the plugin; throws distlab::Error naming it if missing.
void* plugin_symbol(void* handle, const char* symbol);

}  // namespace distlab::grader
