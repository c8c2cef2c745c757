#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace distlab {
// `distlab quiz [list | N]`: a chapter's questions (chapters/NN-topic.quiz.toml), asked in the terminal
// after the small runs that show their symptom, or graded from a JSON file of answers (--answers).
void add_quiz_command(CLI::App& app, int& exit_code, const std::string& self_exe);
}  // namespace distlab
