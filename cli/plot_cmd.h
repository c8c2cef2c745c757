#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab plot loss|memory|timeline`: SVG figures from metrics files and traces (cli/plot_cmd.cpp).
void add_plot_commands(CLI::App& app);
}  // namespace distlab
