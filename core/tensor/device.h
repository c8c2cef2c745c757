// Where a tensor lives. `meta` has shapes and sizes but no data: kernels record their FLOPs and bytes and
// skip the arithmetic, so the memory and cost of any model can be computed without the hardware.
// `cuda`: the GPU. Its kernels (core/ops/cuda) and context (core/cuda) are built, when the CUDA toolkit is
// found, into libdistlab_cuda.so, which a process loads only when it uses them (cuda_symbol). The trainer
// does not run on it yet, so a config that asks for it is refused with the reason.
#pragma once
#include <string>

namespace distlab {

enum class DeviceKind { cpu, meta, cuda };

const char* device_name(DeviceKind d);
DeviceKind parse_device(const std::string& s);  // "cpu" | "meta"; ConfigError otherwise, saying why not cuda
// What this build and machine can do with CUDA, in one line: "not in this build (...)", "kernels built; no
// usable GPU here: cudaGetDeviceCount: ...", or the GPUs it sees.
std::string cuda_build_status();
// An extern "C" entry point of libdistlab_cuda.so (core/cuda/entry.cpp), loading the library on first use;
// nullptr with the reason in *why when this build has none or it does not load.
void* cuda_symbol(const char* name, std::string* why);

}  // namespace distlab
