#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab run -n N [--nnodes M --node-rank R --master-addr A --master-port P] [--log-dir D] [--max-restarts K]
//  (SUBCOMMAND ARGS | -- PROGRAM ARGS)`
// `program`: what followed `--` on the command line (empty for a distlab subcommand)
void add_run_command(CLI::App& app, int& exit_code, const std::string& self_exe, const std::vector<std::string>& program);
}  // namespace distlab
