#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab env`: what this machine gives a run — cores, the CPU's vector features, OpenBLAS's kernels and
// who chose them (cli/env_cmd.cpp; core/ops/cpu/blas_core.h).
void add_env_command(CLI::App& app);
}  // namespace distlab
