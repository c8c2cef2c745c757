// Where a tensor lives. `meta` has shapes and sizes but no data: kernels record their FLOPs and bytes and
// skip the arithmetic, so the memory and cost of any model can be computed without the hardware.
// `cuda`: the GPU. Its kernels (core/ops/cuda) and context (core/cuda) are built, when the CUDA toolkit is
// found, into libdistlab_cuda.so, which a process loads only when it uses them (cuda_symbol); a rank is
// attached to its GPU by core/ops/attach.h. `cuda-sim` is a cuda rank whose "GPU" is the CPU
// (core/ops/sim_device.h): the device kind is cuda, the kernels are the cpu's.
#pragma once
#include <string>

namespace distlab {

enum class DeviceKind { cpu, meta, cuda };

const char* device_name(DeviceKind d);
// "cpu" | "meta" | "cuda" (when cuda_usable) | "cuda-sim" (kind cuda); ConfigError otherwise, with the reason
DeviceKind parse_device(const std::string& s);
// What this build and machine can do with CUDA, in one line: "not in this build (...)", "kernels built; no
// usable GPU here: cudaGetDeviceCount: ...", or the GPUs it sees.
std::string cuda_build_status();
// True when this build has the CUDA half and the machine a GPU it can use; else false, with why.
bool cuda_usable(std::string* why);
// The GPUs this process can use (0, with why, when none or this build has no CUDA half).
int cuda_device_count(std::string* why);
// An extern "C" entry point of libdistlab_cuda.so (core/cuda/entry.cpp), loading the library on first use;
// nullptr with the reason in *why when this build has none or it does not load.
void* cuda_symbol(const char* name, std::string* why);

}  // namespace distlab
