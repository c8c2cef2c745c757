// Training throughput (images/s) of the reference CNN at batch 128 on 32x32x3, with 1 and 2 compute
// threads: forward, cross-entropy, backward, SGD-momentum step — what one optimizer step costs. Compare with
// bench/peer_torch_cnn.py (Debian's PyTorch 1.13 on the same model, machine and threads).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/data/registry.h"
#include "core/models/zoo.h"
#include "core/nn/loss.h"
#include "core/ops/cpu/blas_core.h"
#include "core/optim/optimizer.h"

using namespace distlab;

int main(int argc, char** argv) {
  const int64_t B = 128;
  const int warmup = 3, steps = argc > 1 ? std::atoi(argv[1]) : 30;
  auto data = synthetic_images(B * 4, 3, 32, 32, 10, 1, "bench");
  nlohmann::json results = nlohmann::json::array();
  fmt::print("reference CNN, batch {}, {} timed steps after {} warm-up; {}\n", B, steps, warmup, blas_core().describe());
  fmt::print("{:>8} {:>10} {:>12} {:>12}\n", "threads", "batchnorm", "ms/step", "images/s");
  for (bool bn : {false, true}) {
    for (int threads : {1, 2}) {
      set_compute_threads(threads);
      Runtime rt;
      ModelSpec spec;
      spec.name = "cifar_cnn";
      spec.in_channels = 3;
      spec.height = spec.width = 32;
      spec.batchnorm = bn;
      auto model = build_model(rt, spec);
      model->init(0);
      SGD opt(model->parameters(), SGDOptions{0.9f, 0.0f, 0.0f, false});
      CrossEntropyLoss ce;
      double total = 0;
      for (int s = 0; s < warmup + steps; s++) {
        std::vector<int64_t> idx;
        for (int64_t i = 0; i < B; i++) idx.push_back((s * B + i) % data->size());
        auto t0 = std::chrono::steady_clock::now();
        Batch b = data->make_batch(rt, idx);
        Tensor logits = model->forward(rt, b);
        ce.forward(rt, logits, b.targets);
        Tensor d = ce.backward(rt);
        logits = Tensor();
        model->backward(rt, d, nullptr);
        opt.step(rt, 0.01f);
        model->zero_grad();
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s >= warmup) total += dt;
      }
      double ms = 1e3 * total / steps, ips = double(B) * steps / total;
      fmt::print("{:>8} {:>10} {:>12.2f} {:>12.0f}\n", threads, bn ? "yes" : "no", ms, ips);
      results.push_back({{"threads", threads}, {"batchnorm", bn}, {"ms_per_step", ms}, {"images_per_s", ips}, {"batch", B},
                         {"blas_core", blas_core().chosen}});
    }
  }
  std::filesystem::create_directories("bench/results");
  std::ofstream("bench/results/cnn.json") << results.dump(2) << "\n";
  fmt::print("wrote bench/results/cnn.json\n");
}
