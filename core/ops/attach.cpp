#include "core/ops/attach.h"

#include "core/ops/sim_device.h"
#include "core/util/error.h"

namespace distlab {

namespace {

class SimDevice : public AttachedDevice {
 public:
  explicit SimDevice(Runtime& rt) : rt_(rt) {
    rt.memory.set_device_memory(&mem_);
    rt.kernels = &sim_kernels();
  }
  ~SimDevice() override {
    rt_.attached = nullptr;
    rt_.kernels = nullptr;
    rt_.memory.set_device_memory(nullptr);
  }
  void synchronize() override {}
  std::string describe() const override { return "cuda-sim (the cpu kernels behind device pointers)"; }

 private:
  Runtime& rt_;
  SimDeviceMemory mem_;
};

// libdistlab_cuda.so's rank (core/cuda/entry.cpp), held through its C entry points
class CudaDevice : public AttachedDevice {
 public:
  using Attach = void* (*)(Runtime*, int, std::string*);
  using Detach = void (*)(void*);
  using Sync = void (*)(void*);
  CudaDevice(Runtime& rt, int local_rank) : rt_(rt) {
    std::string why;
    auto attach = reinterpret_cast<Attach>(cuda_symbol("distlab_cuda_attach", &why));
    detach_ = reinterpret_cast<Detach>(cuda_symbol("distlab_cuda_detach", &why));
    sync_ = reinterpret_cast<Sync>(cuda_symbol("distlab_cuda_synchronize", &why));
    if (!attach || !detach_ || !sync_)
      throw ConfigError("train.device is 'cuda', but " + why, "train on --device cpu, or rebuild with the CUDA toolkit");
    handle_ = attach(&rt, local_rank, &describe_);  // throws CudaError naming the device
  }
  ~CudaDevice() override {
    if (handle_) detach_(handle_);
    rt_.attached = nullptr;
    rt_.cuda = nullptr;
    rt_.kernels = nullptr;
    rt_.memory.set_device_memory(nullptr);
  }
  void synchronize() override { sync_(handle_); }
  std::string describe() const override { return describe_; }

 private:
  Runtime& rt_;
  Detach detach_ = nullptr;
  Sync sync_ = nullptr;
  void* handle_ = nullptr;
  std::string describe_;
};

}  // namespace

std::unique_ptr<AttachedDevice> attach_device(Runtime& rt, const std::string& device, int local_rank) {
  if (device != "cuda" && device != "cuda-sim") return nullptr;
  DL_ASSERT(rt.device == DeviceKind::cuda, "attach_device(" + device + ") on a Runtime that is not a cuda rank");
  std::unique_ptr<AttachedDevice> d;
  if (device == "cuda-sim") d = std::make_unique<SimDevice>(rt);
  else d = std::make_unique<CudaDevice>(rt, local_rank);
  rt.attached = d.get();
  return d;
}

}  // namespace distlab
