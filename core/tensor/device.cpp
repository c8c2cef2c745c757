#include "core/tensor/device.h"

#include <fmt/format.h>

#include "core/util/error.h"
#ifdef DISTLAB_HAVE_CUDA
#include "core/cuda/context.h"
#endif

namespace distlab {

const char* device_name(DeviceKind d) {
  switch (d) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::meta: return "meta";
    case DeviceKind::cuda: return "cuda";
  }
  return "?";
}

std::string cuda_build_status() {
#ifdef DISTLAB_HAVE_CUDA
  const CudaProbe p = probe_cuda();
  if (!p.usable) return fmt::format("kernels built; no usable GPU here: {}", p.reason);
  std::string s = fmt::format("kernels built; {} GPU(s):", p.devices.size());
  for (const auto& d : p.devices) s += fmt::format(" {}={} (sm {}{})", d.index, d.name, d.sm_major, d.sm_minor);
  return s;
#else
  return "not in this build (configured without nvcc, cuBLAS or NCCL, or with -DDISTLAB_CUDA=OFF)";
#endif
}

DeviceKind parse_device(const std::string& s) {
  if (s == "cpu") return DeviceKind::cpu;
  if (s == "meta") return DeviceKind::meta;
  if (s == "cuda")
    throw ConfigError("device 'cuda' cannot train in this version: " + cuda_build_status(),
                      "the CUDA kernels are built and checked against the cpu ones (bench/gpu_check.sh on a GPU machine); "
                      "training runs on --device cpu (real numbers) or --device meta (shapes, memory, FLOPs)");
  throw ConfigError("unknown device '" + s + "'", "use cpu or meta");
}

}  // namespace distlab
