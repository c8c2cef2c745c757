// The entry points of libdistlab_cuda.so that the rest of distlab calls through cuda_symbol()
// (core/tensor/device.h): extern "C" names, so dlsym finds them. Everything else of the library is used
// directly by the programs that link it (distlab_cuda_tests, bench_gemm_cuda).
#include <fmt/format.h>

#include <string>

#include "core/cuda/context.h"
#include "core/cuda/nccl_bench.h"
#include "core/cuda/nccl_group.h"

extern "C" {

// "kernels built; no usable GPU here: <why>" or "kernels built; 1 GPU(s): 0=NVIDIA H200 (sm 90)"
void distlab_cuda_status(std::string* out) {
  const distlab::CudaProbe p = distlab::probe_cuda();
  if (!p.usable) {
    *out = fmt::format("kernels built; no usable GPU here: {}", p.reason);
    return;
  }
  *out = fmt::format("kernels built; NCCL {}; {} GPU(s):", distlab::nccl_version_string(), p.devices.size());
  for (const auto& d : p.devices) *out += fmt::format(" {}={} (sm {}{})", d.index, d.name, d.sm_major, d.sm_minor);
}

// `distlab bench comm --backend nccl` on one rank; returns its exit code
int distlab_nccl_bench(distlab::Store* store, const distlab::NcclBenchOptions* o) { return distlab::nccl_bench_worker(*store, *o); }

}  // extern "C"
