#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab bench comm -n N`: nccl-tests' table for our collectives over Gloo, with raw Gloo as a baseline.
void add_bench_command(CLI::App& app, int& exit_code, const std::string& self_exe);
}  // namespace distlab
