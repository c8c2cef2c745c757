// distlab env (cli/env_cmd.h): the facts a benchmark prints beside its numbers, and what a script needs to
// run a peer (PyTorch) under the same BLAS kernels as distlab (`distlab env --blas-core`).
#include "cli/env_cmd.h"

#include <cblas.h>
#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/ops/cpu/blas_core.h"
#include "core/tensor/runtime.h"

namespace distlab {

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

void add_env_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto core_only = std::make_shared<bool>(false);
  auto* env = app.add_subcommand("env", "this machine as a run sees it: cores, CPU features, OpenBLAS's kernels");
  env->add_flag("--json", *json, "as JSON");
  env->add_flag("--blas-core", *core_only, "print only the OpenBLAS core distlab runs (for OPENBLAS_CORETYPE in a peer's environment)");
  env->callback([json, core_only] {
    const BlasCore b = blas_core();
    if (*core_only) {
      std::cout << b.chosen << "\n";
      return;
    }
    const nlohmann::json j = {{"cpu", cpu_model()},
                              {"cores", sysconf(_SC_NPROCESSORS_ONLN)},
                              {"features", b.features},
                              {"openblas", openblas_get_config()},
                              {"blas_core", b.chosen},
                              {"blas_core_best", b.best},
                              {"blas_core_set_by", b.set_by.empty() ? "openblas" : b.set_by},
                              {"blas_core_openblas_picked", b.set_by == "distlab" ? b.was : b.chosen},
                              {"compute_threads", compute_threads()}};
    if (*json) {
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::cout << fmt::format("cpu        {} ({} cores)\nfeatures   {}\nopenblas   {}\nkernels    {}\n", j["cpu"].get<std::string>(),
                             j["cores"].get<long>(), b.features.empty() ? "(none of AVX, AVX2, AVX-512)" : b.features,
                             j["openblas"].get<std::string>(), b.describe());
  });
}

}  // namespace distlab
