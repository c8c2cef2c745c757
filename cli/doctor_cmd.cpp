// distlab doctor (cli/doctor_cmd.h). Nothing here needs a GPU: without one (or without the CUDA half of the
// build) it says why, and what the labs run on instead.
#include "cli/doctor_cmd.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/ops/cpu/blas_core.h"
#include "core/tensor/device.h"

namespace distlab {

namespace {

// cuDNN's version from its library, when one loads ("9.1.0"); "" otherwise (distlab's kernels don't need it)
std::string cudnn_version() {
  for (const char* lib : {"libcudnn.so.9", "libcudnn.so"}) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    auto get = reinterpret_cast<size_t (*)()>(dlsym(h, "cudnnGetVersion"));
    const size_t v = get ? get() : 0;  // 90100 = 9.1.0
    dlclose(h);
    if (v) return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
  }
  return "";
}

// The GPU facts from the CUDA half of the build (core/cuda/entry.cpp), or why there are none
nlohmann::json gpu_facts() {
  std::string why;
  auto doctor = reinterpret_cast<void (*)(std::string*)>(cuda_symbol("distlab_cuda_doctor", &why));
  if (!doctor) return {{"usable", false}, {"reason", why}, {"built", false}, {"gpus", nlohmann::json::array()}, {"links", nlohmann::json::array()}};
  std::string text;
  doctor(&text);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return {{"usable", false}, {"reason", "the CUDA library's answer was not JSON"}, {"built", true}, {"gpus", nlohmann::json::array()}, {"links", nlohmann::json::array()}};
  j["built"] = true;
  return j;
}

// What `distlab grade NN` (its default --device auto) runs each lab's training jobs on, with `gpus` GPUs
std::vector<std::pair<std::string, std::string>> lab_plans(int gpus) {
  const std::string jobs = gpus == 0 ? "cpu ranks over Gloo (--device cuda-sim runs the GPU's code path on the CPU)"
                           : gpus == 1 ? "cuda: the one GPU shared by a job's ranks, collectives over Gloo through host buffers"
                                       : fmt::format("cuda: a GPU per rank (shared past {} ranks), collectives over Gloo through host buffers "
                                                     "(the lab's API hands the student's collectives host memory)", gpus);
  return {{"01-collectives", "the plugin's rings over host buffers, whatever the device"},
          {"02-ddp-cifar", jobs + (gpus >= 2 ? "; its speed-up measured on 2 GPUs against 1 (the reference solution timed beside), the modeled two T4s shown too"
                                             : "; its speed-up check models two T4s (the cost model): measured only with 2 GPUs or more, or --measure-speedup")},
          {"03-amp-accum", jobs},
          {"04-zero", jobs},
          {"05-fsdp-1b", jobs + "; the 1B GPT planned on the meta device (its memory, not the GPU's)"},
          {"06-tp-pp", jobs},
          {"07-checkpoint", jobs},
          {"08-clinic", "each case on its lab's device; the OOM story on the meta device"},
          {"09-configs-plan", "the meta device: planned, nothing allocated"},
          {"10-lora-qlora", std::string("the plugin's layers on the CPU, the engine's QLoRA beside them on ") + (gpus > 0 ? "the GPU" : "the CPU") +
                                "; Llama 3 8B planned on the meta device"}};
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* doc = app.add_subcommand("doctor", "this machine for distlab: CPU and BLAS, GPUs, driver, CUDA, NCCL, cuDNN, links, and what each lab runs on");
  doc->add_flag("--json", *json, "as JSON");
  doc->callback([json] {
    const BlasCore b = blas_core();
    nlohmann::json g = gpu_facts();
    const int gpus = g.value("usable", false) ? int(g["gpus"].size()) : 0;
    nlohmann::json j = {{"cpu_cores", sysconf(_SC_NPROCESSORS_ONLN)}, {"blas_core", b.chosen}, {"features", b.features}, {"cuda", g},
                        {"cudnn", cudnn_version()}, {"labs", nlohmann::json::object()}};
    for (const auto& [lab, plan] : lab_plans(gpus)) j["labs"][lab] = plan;
    if (*json) {
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::cout << fmt::format("cpu        {} cores, {}; OpenBLAS kernels {}\n", j["cpu_cores"].get<long>(),
                             b.features.empty() ? "no AVX" : b.features, b.chosen);
    if (!g.value("built", false)) {
      std::cout << fmt::format("cuda       not in this build: {}\n", g.value("reason", ""));
    } else {
      std::cout << fmt::format("cuda       runtime {} (built for {}), driver {}, NCCL {}, cuDNN {}\n", g.value("runtime", "?"),
                               g.value("built_for_runtime", "?"), g.value("driver", "none"), g.value("nccl", "?"),
                               j["cudnn"].get<std::string>().empty() ? "not found" : j["cudnn"].get<std::string>());
      if (gpus == 0) std::cout << fmt::format("gpus       none usable: {}\n", g.value("reason", ""));
      for (const auto& d : g["gpus"])
        std::cout << fmt::format("gpu {}      {} (sm {}, {} SMs, {:.1f} GiB)\n", d.value("index", 0), d.value("name", "?"), d.value("sm", "?"),
                                 d.value("multiprocessors", 0), d.value("memory_bytes", 0.0) / double(1 << 30));
      for (const auto& d : g["gpus"])
        if (d.contains("flash_attention"))
          std::cout << fmt::format("attention  gpu {}: flash attention on {}\n", d.value("index", 0), d.value("flash_attention", ""));
      for (const auto& l : g["links"])
        std::cout << fmt::format("link       {} -> {}: {}\n", l.value("from", 0), l.value("to", 0),
                                 l.value("peer_access", false) ? fmt::format("peer access, performance rank {} (NVLink ranks above PCIe)", l.value("performance_rank", -1))
                                                               : "no peer access: through host memory");
    }
    std::cout << fmt::format("labs       what `distlab grade NN` runs on here ({} GPU(s)):\n", gpus);
    for (const auto& [lab, plan] : j["labs"].items()) std::cout << fmt::format("  {:<16} {}\n", lab, plan.get<std::string>());
  });
}

}  // namespace distlab
