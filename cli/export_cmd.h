#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab export tensorboard METRICS.jsonl`: a run's scalars as TensorBoard's events file (cli/export_cmd.cpp,
// core/report/tfevents.h).
void add_export_commands(CLI::App& app, int& exit_code);
}  // namespace distlab
