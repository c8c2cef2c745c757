#include "core/cuda/nccl_bench.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/util/atomic_file.h"
#include "core/cuda/check.h"
#include "core/cuda/nccl_group.h"
#include "core/ops/cuda/ops.h"
#include "core/perf/cost_model.h"

namespace distlab {

namespace {

int iterations_for(int64_t bytes, int fixed) {
  if (fixed > 0) return fixed;
  return bytes <= (int64_t(1) << 20) ? 50 : bytes <= (int64_t(64) << 20) ? 20 : 10;
}

}  // namespace

int nccl_bench_worker(Store& store, const NcclBenchOptions& o) {
  CudaContext cx(o.local_rank);
  NcclGroup g(store, o.rank, o.world, cx, Millis(120000), nullptr, "bench-nccl");
  const int N = o.world;
  const bool print = o.rank == 0;
  const int64_t max_count = std::max<int64_t>(o.max_bytes / 4, 1);
  float *in = nullptr, *out = nullptr;
  DL_CUDA(cudaMalloc(&in, size_t(max_count) * 4));
  DL_CUDA(cudaMalloc(&out, size_t(max_count) * 4));
  float* t_dev = nullptr;
  DL_CUDA(cudaMalloc(&t_dev, 4));
  cudaEvent_t a, b;
  DL_CUDA(cudaEventCreate(&a));
  DL_CUDA(cudaEventCreate(&b));
  if (print)
    std::cout << fmt::format("# distlab bench comm: {} ranks, NCCL {} on GPUs, float32, sum\n#\n", N, nccl_version_string())
              << fmt::format("# {:>16} {:>12} {:>12} {:>10} {:>8} {:>8} {:>7}\n", "op", "size (B)", "count", "time (us)", "algbw",
                             "busbw", "#wrong");
  nlohmann::json rows = nlohmann::json::array();
  int64_t wrong_total = 0;
  for (const std::string op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast"}) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      const bool split = op == "reduce_scatter" || op == "all_gather";
      const int64_t count = split ? std::max<int64_t>(bytes / 4 / N, 1) : std::max<int64_t>(bytes / 4, 1);  // per-rank piece when split
      const int64_t S = split ? count * N * 4 : count * 4;  // nccl-tests' size: the whole buffer
      // every element of rank r's input is r + 1: the expected results are exact in f32
      cx.sync();
      cuda::fill_on(cx.compute(), in, DType::f32, float(o.rank + 1), split && op == "reduce_scatter" ? count * N : count);
      auto run = [&] {
        if (op == "all_reduce") g.all_reduce_async(in, count, ReduceOp::sum)->wait();
        else if (op == "reduce_scatter") g.reduce_scatter_async(out, in, count, ReduceOp::sum)->wait();
        else if (op == "all_gather") g.all_gather_async(out, in, count)->wait();
        else g.broadcast_async(in, count, 0)->wait();
      };
      run();  // warm-up, and the result that is checked (an all_reduce in place doubles on later runs)
      std::vector<float> h(size_t(op == "all_gather" ? count * N : count));
      cx.sync();
      DL_CUDA(cudaMemcpy(h.data(), op == "all_reduce" || op == "broadcast" ? in : out, h.size() * 4, cudaMemcpyDeviceToHost));
      int64_t wrong = 0;
      for (size_t i = 0; i < h.size(); i++) {
        const float want = op == "all_reduce" || op == "reduce_scatter" ? float(N * (N + 1) / 2)
                           : op == "all_gather"                        ? float(int64_t(i) / count + 1)
                                                                       : 1.0f;
        wrong += h[i] != want;
      }
      const int iters = iterations_for(S, o.iters);
      DL_CUDA(cudaEventRecord(a, cx.compute()));
      for (int k = 0; k < iters; k++) run();
      DL_CUDA(cudaEventRecord(b, cx.compute()));
      DL_CUDA(cudaEventSynchronize(b));
      float ms = 0;
      DL_CUDA(cudaEventElapsedTime(&ms, a, b));
      float t = ms / 1e3f / float(iters);
      DL_CUDA(cudaMemcpy(t_dev, &t, 4, cudaMemcpyHostToDevice));
      DL_CUDA(cudaDeviceSynchronize());
      g.all_reduce(t_dev, 1, ReduceOp::max);  // the slowest rank's time is the job's
      DL_CUDA(cudaMemcpy(&t, t_dev, 4, cudaMemcpyDeviceToHost));
      float w = float(wrong);
      DL_CUDA(cudaMemcpy(t_dev, &w, 4, cudaMemcpyHostToDevice));
      DL_CUDA(cudaDeviceSynchronize());
      g.all_reduce(t_dev, 1, ReduceOp::sum);
      DL_CUDA(cudaMemcpy(&w, t_dev, 4, cudaMemcpyDeviceToHost));
      wrong_total += int64_t(w);
      const double algbw = double(S) / t, busbw = algbw * busbw_factor(op, N);
      if (print)
        std::cout << fmt::format("  {:>16} {:>12} {:>12} {:>10.1f} {:>8.2f} {:>8.2f} {:>7}\n", op, S, S / 4, double(t) * 1e6, algbw / 1e9,
                                 busbw / 1e9, int64_t(w))
                  << std::flush;
      rows.push_back({{"op", op}, {"bytes", S}, {"count", S / 4}, {"time_us", double(t) * 1e6}, {"algbw_gbps", algbw / 1e9},
                      {"busbw_gbps", busbw / 1e9}, {"wrong", int64_t(w)}});
    }
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(in);
  cudaFree(out);
  cudaFree(t_dev);
  if (print) {
    std::cout << fmt::format("# Out of bounds values : {} {}\n", wrong_total, wrong_total ? "FAILED" : "OK");
    const std::string path = o.json.empty() ? fmt::format("bench/results/comm_nccl_n{}.json", N) : o.json;
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    AtomicFile f(path);
    f.write(nlohmann::json{{"backend", "nccl"}, {"nccl", nccl_version_string()}, {"world_size", N}, {"rows", rows}, {"wrong", wrong_total}}.dump(2) +
            "\n");
    f.commit();
    std::cout << "# wrote " << path << "\n";
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace distlab
