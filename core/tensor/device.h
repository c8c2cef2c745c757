// Where a tensor lives. `meta` has shapes and sizes but no data: kernels record their FLOPs and bytes and
// skip the arithmetic, so the memory and cost of any model can be computed without the hardware.
// `cuda` is named here so configs and messages can speak of it; the CUDA backend comes with its kernels.
#pragma once
#include <string>

namespace distlab {

enum class DeviceKind { cpu, meta, cuda };

const char* device_name(DeviceKind d);
DeviceKind parse_device(const std::string& s);  // "cpu" | "meta" | "cuda"; ConfigError otherwise

}  // namespace distlab
