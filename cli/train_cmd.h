#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab train CONFIG [--set k=v]... [--metrics F] [--init F] [--save F] [--device D] [--device-mem M]`
void add_train_command(CLI::App& app, int& exit_code);
}  // namespace distlab
