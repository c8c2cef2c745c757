// The entry points of libdistlab_cuda.so that the rest of distlab calls through cuda_symbol()
// (core/tensor/device.h): extern "C" names, so dlsym finds them. Everything else of the library is used
// directly by the programs that link it (distlab_cuda_tests, bench_gemm_cuda).
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/cuda/context.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/nccl_bench.h"
#include "core/cuda/nccl_group.h"
#include "core/comm/device_group.h"
#include "core/ops/cuda/ops.h"

namespace {

// What a cuda rank owns on its GPU, for as long as its tensors live.
struct CudaRank {
  explicit CudaRank(int device) : cx(device), mem(cx) {}
  distlab::CudaContext cx;
  distlab::CudaDeviceMemory mem;
};

// dist.backend = "nccl": the DeviceGroup of core/comm/device_group.h over an NcclGroup. A Work's wait()
// is the host's, with the group's timeout (a peer that never joins is a CommError, not a hung GPU), then
// the compute stream's.
class NcclDeviceGroup : public distlab::DeviceGroup {
 public:
  NcclDeviceGroup(distlab::Runtime& rt, distlab::Store& store, const std::string& name, int rank, int size, distlab::Millis timeout)
      : g_(store, rank, size, *rt.cuda, timeout, &rt.trace, name) {}
  int rank() const override { return g_.rank(); }
  int size() const override { return g_.size(); }
  std::string describe() const override { return fmt::format("NCCL {} over {} GPU(s)", distlab::nccl_version_string(), g_.size()); }
  std::shared_ptr<distlab::Work> all_reduce_async(float* data, int64_t n, distlab::ReduceOp op, distlab::DType wire) override {
    return awaited(g_.all_reduce_async(data, n, op, wire));
  }
  std::shared_ptr<distlab::Work> reduce_scatter_async(float* out, const float* in, int64_t n, distlab::ReduceOp op,
                                                      distlab::DType wire) override {
    return awaited(g_.reduce_scatter_async(out, in, n, op, wire));
  }
  std::shared_ptr<distlab::Work> all_gather_async(float* out, const float* in, int64_t n, distlab::DType wire) override {
    return awaited(g_.all_gather_async(out, in, n, wire));
  }
  std::map<std::string, distlab::CommCounters> counters() const override { return g_.counters(); }

 private:
  static std::shared_ptr<distlab::Work> awaited(std::shared_ptr<distlab::NcclWork> w) {
    return distlab::Work::elsewhere([w] { w->synchronize(); });
  }
  distlab::NcclGroup g_;
};

}  // namespace

extern "C" {

// The NCCL group of a cuda rank (rt->cuda set by distlab_cuda_attach), joined through the run's store under `name`.
distlab::DeviceGroup* distlab_nccl_group(distlab::Runtime* rt, distlab::Store* store, const std::string* name, int rank, int size,
                                         int64_t timeout_ms) {
  if (!rt->cuda) throw distlab::Error("dist.backend = \"nccl\" on a rank without a GPU attached", "train with --device cuda");
  return new NcclDeviceGroup(*rt, *store, *name, rank, size, distlab::Millis(timeout_ms));
}


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

// `distlab doctor`: the runtime's and driver's versions, NCCL's, every GPU and how each pair reaches the
// other (peer access, and CUDA's performance rank of the link: NVLink ranks above PCIe), as JSON text
void distlab_cuda_doctor(std::string* out) {
  const distlab::CudaProbe p = distlab::probe_cuda();
  auto version = [](int v) { return v ? fmt::format("{}.{}", v / 1000, v % 1000 / 10) : std::string("none"); };
  nlohmann::json j = {{"usable", p.usable}, {"reason", p.reason}, {"runtime", version(p.runtime_version)}, {"driver", version(p.driver_version)},
                      {"nccl", distlab::nccl_version_string()}, {"built_for_runtime", version(CUDART_VERSION)},
                      {"gpus", nlohmann::json::array()}, {"links", nlohmann::json::array()}};
  for (const auto& d : p.devices)
    j["gpus"].push_back({{"index", d.index}, {"name", d.name}, {"sm", fmt::format("{}.{}", d.sm_major, d.sm_minor)},
                         {"multiprocessors", d.multiprocessors}, {"memory_bytes", d.total_bytes},
                         // which flash attention a bf16/fp16 run gets here (core/ops/cuda/attention_tc.cu)
                         {"flash_attention", d.sm_major >= 8 ? "tensor cores in bf16/fp16 runs (head sizes 32, 64, 96, 128 where the "
                                                               "shared memory allows), else CUDA cores in f32"
                                                             : "CUDA cores in f32 (the tensor-core kernel needs sm 80)"}});
  for (const auto& a : p.devices)
    for (const auto& b : p.devices) {
      if (a.index == b.index) continue;
      int peer = 0, rank = -1;
      if (cudaDeviceCanAccessPeer(&peer, a.index, b.index) != cudaSuccess) peer = 0;
      if (peer && cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, a.index, b.index) != cudaSuccess) rank = -1;
      (void)cudaGetLastError();
      j["links"].push_back({{"from", a.index}, {"to", b.index}, {"peer_access", peer != 0}, {"performance_rank", rank}});
    }
  *out = j.dump();
}

// The GPUs this process can use; 0 with the reason in *why when none
int distlab_cuda_device_count(std::string* why) {
  const distlab::CudaProbe p = distlab::probe_cuda();
  if (!p.usable) *why = p.reason;
  return p.usable ? int(p.devices.size()) : 0;
}

// `distlab bench comm --backend nccl` on one rank; returns its exit code
int distlab_nccl_bench(distlab::Store* store, const distlab::NcclBenchOptions* o) { return distlab::nccl_bench_worker(*store, *o); }

// Makes `rt` (a cuda Runtime) a rank on GPU local_rank % (the GPUs present): context, memory, kernels.
// Returns the handle for distlab_cuda_detach; throws CudaError (or Error) with the reason.
void* distlab_cuda_attach(distlab::Runtime* rt, int local_rank, std::string* describe) {
  const distlab::CudaProbe p = distlab::probe_cuda();
  if (!p.usable) throw distlab::Error("train.device is 'cuda', but there is no usable GPU: " + p.reason, "train on --device cpu");
  const int device = local_rank % int(p.devices.size());
  auto* r = new CudaRank(device);
  distlab::attach_cuda(*rt, r->cx, r->mem);
  rt->kernels = &distlab::cuda::kernel_table();
  const auto& d = p.devices[size_t(device)];
  *describe = fmt::format("cuda:{} {} (sm {}{}, {:.1f} GiB free{})", device, d.name, d.sm_major, d.sm_minor,
                          double(r->mem.free_bytes()) / double(1 << 30),
                          local_rank >= int(p.devices.size()) ? fmt::format("; shared: {} GPU(s) for more ranks", p.devices.size()) : "");
  return r;
}

void distlab_cuda_detach(void* rank) { delete static_cast<CudaRank*>(rank); }

// Waits for the rank's compute stream; an earlier kernel's error surfaces here as a CudaError.
void distlab_cuda_synchronize(void* rank) { static_cast<CudaRank*>(rank)->cx.sync(); }

}  // extern "C"
