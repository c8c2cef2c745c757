#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab ckpt inspect DIR` (what a checkpoint holds, every checksum checked) and
// `distlab ckpt export DIR --out model.safetensors` (the full weights, for PyTorch).
void add_ckpt_commands(CLI::App& app, int& exit_code);
}  // namespace distlab
