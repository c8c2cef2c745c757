#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab plan --model gpt-7b --gpus 8 --gpu-mem a100-80g`: one row per strategy (DDP, ZeRO-1/2/3, FSDP,
// FSDP + offload), each a run of the engine on the fake world; bytes per GPU, fits, modeled step time and
// the decision tree's pick.
void add_plan_command(CLI::App& app, int& exit_code);
}  // namespace distlab
