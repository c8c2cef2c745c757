#include "core/tensor/device.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

const char* device_name(DeviceKind d) {
  switch (d) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::meta: return "meta";
    case DeviceKind::cuda: return "cuda";
  }
  return "?";
}

namespace {

struct CudaLibrary {
  void* handle = nullptr;
  std::string why;  // when handle is null
};

// libdistlab_cuda.so, loaded on first use by the process that needs it: by name first (LD_LIBRARY_PATH,
// where a GPU bundle puts it), then from the build. Like the dynamic loader's own state, this is one per
// process.
const CudaLibrary& cuda_library() {
  static const CudaLibrary lib = [] {
    CudaLibrary l;
#ifdef DISTLAB_CUDA_LIBRARY
    l.handle = dlopen("libdistlab_cuda.so", RTLD_NOW | RTLD_GLOBAL);
    if (!l.handle) l.handle = dlopen(DISTLAB_CUDA_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
    if (!l.handle) {
      const char* e = dlerror();
      l.why = fmt::format("the CUDA half of the engine did not load ({})", e ? e : "?");
    }
#else
    l.why = "not in this build (configured without nvcc, cuBLAS or NCCL, or with -DDISTLAB_CUDA=OFF)";
#endif
    return l;
  }();
  return lib;
}

}  // namespace

void* cuda_symbol(const char* name, std::string* why) {
  const CudaLibrary& lib = cuda_library();
  if (!lib.handle) {
    if (why) *why = lib.why;
    return nullptr;
  }
  void* f = dlsym(lib.handle, name);
  if (!f && why) *why = fmt::format("libdistlab_cuda.so has no {}: it is older than this distlab (rebuild)", name);
  return f;
}

std::string cuda_build_status() {
  std::string why;
  auto status = reinterpret_cast<void (*)(std::string*)>(cuda_symbol("distlab_cuda_status", &why));
  if (!status) return why;
  std::string s;
  status(&s);
  return s;
}

bool cuda_usable(std::string* why) { return cuda_device_count(why) > 0; }

int cuda_device_count(std::string* why) {
  auto count = reinterpret_cast<int (*)(std::string*)>(cuda_symbol("distlab_cuda_device_count", why));
  return count ? count(why) : 0;
}

DeviceKind parse_device(const std::string& s) {
  if (s == "cpu") return DeviceKind::cpu;
  if (s == "meta") return DeviceKind::meta;
  if (s == "cuda-sim") return DeviceKind::cuda;
  std::string why;
  if (s == "cuda" && cuda_usable(&why)) return DeviceKind::cuda;
  if (s == "cuda")
    throw ConfigError("device 'cuda': this build or machine cannot train on a GPU: " + why,
                      "train on --device cpu (real numbers) or meta (shapes, memory, FLOPs); cuda-sim runs the GPU's code path on the CPU");
  throw ConfigError("unknown device '" + s + "'", "use cpu, meta, cuda or cuda-sim");
}

}  // namespace distlab
