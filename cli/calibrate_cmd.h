#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab bench calibrate CONFIG --device cuda -o FILE.json`: this device's rates at a model's shapes, as a
// profile file for log.profile and `distlab plan --profile` (cli/calibrate_cmd.cpp).
void add_calibrate_command(CLI::App* bench, int& exit_code, const std::string& self_exe);
}  // namespace distlab
