#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab lab list|show|build` and `distlab grade`.
void add_lab_commands(CLI::App& app, int& exit_code, const std::string& self_exe);
}  // namespace distlab
