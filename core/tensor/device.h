// Where a tensor lives. `meta` has shapes and sizes but no data: kernels record their FLOPs and bytes and
// skip the arithmetic, so the memory and cost of any model can be computed without the hardware.
// `cuda`: the GPU. Its kernels (core/ops/cuda) and context (core/cuda) are built when the CUDA toolkit is
// found; the trainer does not run on it yet, so a config that asks for it is refused with the reason.
#pragma once
#include <string>

namespace distlab {

enum class DeviceKind { cpu, meta, cuda };

const char* device_name(DeviceKind d);
DeviceKind parse_device(const std::string& s);  // "cpu" | "meta"; ConfigError otherwise, saying why not cuda
// What this build and machine can do with CUDA, in one line: "not in this build (...)", "kernels built; no
// usable GPU here: cudaGetDeviceCount: ...", or the GPUs it sees.
std::string cuda_build_status();

}  // namespace distlab
