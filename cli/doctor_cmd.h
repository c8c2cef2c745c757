#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab doctor`: what a rented GPU box (or this laptop) gives distlab — the CPU and its BLAS kernels, the
// GPUs with their driver, CUDA runtime, NCCL and cuDNN versions, how each pair of GPUs reaches the other,
// and what each lab's grading will run on here (cli/doctor_cmd.cpp). Read next: cli/env_cmd.h.
void add_doctor_command(CLI::App& app);
}  // namespace distlab
