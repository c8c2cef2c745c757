// Linear forward GFLOP/s against raw cblas_sgemm at 1024³ (the target: ≥ 90 %).
#include <cblas.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/ops/cpu/matmul.h"
#include "core/tensor/runtime.h"
#include "core/util/rng.h"

using namespace distlab;

template <class F>
static double best_seconds(F&& f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

int main() {
  const int64_t n = 1024;
  std::vector<float> a(size_t(n * n)), w(size_t(n * n)), out(size_t(n * n)), bias(static_cast<size_t>(n));
  Rng rng(1);
  for (auto& x : a) x = rng.uniform(-1, 1);
  for (auto& x : w) x = rng.uniform(-1, 1);
  for (auto& x : bias) x = rng.uniform(-1, 1);
  nlohmann::json results = nlohmann::json::array();
  fmt::print("{:>8} {:>14} {:>14} {:>8}\n", "threads", "sgemm GFLOP/s", "Linear GFLOP/s", "ratio");
  for (int threads : {1, 2}) {
    set_compute_threads(threads);
    Runtime rt;
    const double flops = 2.0 * n * n * n;
    // raw: OpenBLAS with its own threads; Linear: distlab's kernel (OpenMP slabs over single-threaded BLAS)
    auto raw = [&] { openblas_set_num_threads(threads); cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(n), int(n), 1.0f, a.data(), int(n), w.data(), int(n), 0.0f, out.data(), int(n)); };
    auto lin = [&] { set_compute_threads(threads); matmul_forward(rt, out.data(), a.data(), w.data(), bias.data(), n, n, n); };
    raw();
    lin();
    double t_raw = best_seconds(raw, 10), t_lin = best_seconds(lin, 10);
    double g_raw = flops / t_raw * 1e-9, g_lin = flops / t_lin * 1e-9;
    fmt::print("{:>8} {:>14.1f} {:>14.1f} {:>7.1f}%\n", threads, g_raw, g_lin, 100.0 * g_lin / g_raw);
    results.push_back({{"threads", threads}, {"sgemm_gflops", g_raw}, {"linear_gflops", g_lin}, {"ratio", g_lin / g_raw}});
  }
  std::filesystem::create_directories("bench/results");
  std::ofstream("bench/results/linear.json") << results.dump(2) << "\n";
  fmt::print("wrote bench/results/linear.json\n");
}
