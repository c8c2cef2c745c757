#include "core/dist/device_group.h"

#include <fmt/format.h>

#include <vector>

#include "core/tensor/device.h"
#include "core/tensor/runtime.h"
#include "core/util/error.h"

namespace distlab {

namespace {

// cuda-sim: the buffer comes down, Gloo reduces it, and it goes back up when waited for.
class SimWork : public DeviceWork {
 public:
  SimWork(DeviceMemory& mem, float* data, int64_t n, ProcessGroup& pg, ReduceOp op, DType wire)
      : mem_(mem), data_(data), host_(size_t(n)) {
    mem_.to_host(host_.data(), data, n * 4);
    work_ = pg.all_reduce_async(host_.data(), n, op, wire);
  }
  void wait() override {
    work_->wait();
    mem_.from_host(data_, host_.data(), int64_t(host_.size()) * 4);
  }

 private:
  DeviceMemory& mem_;
  float* data_;
  std::vector<float> host_;
  std::shared_ptr<Work> work_;
};

class SimDeviceGroup : public DeviceGroup {
 public:
  SimDeviceGroup(Runtime& rt, ProcessGroup& pg) : mem_(*rt.memory.device_memory()), pg_(pg) {}
  int rank() const override { return pg_.rank(); }
  int size() const override { return pg_.size(); }
  std::string describe() const override { return fmt::format("nccl on cuda-sim (Gloo over host copies, {} ranks)", pg_.size()); }
  std::shared_ptr<DeviceWork> all_reduce_async(float* data, int64_t n, ReduceOp op, DType wire) override {
    return std::make_shared<SimWork>(mem_, data, n, pg_, op, wire);
  }
  CommCounters counters() const override { return {}; }

 private:
  DeviceMemory& mem_;
  ProcessGroup& pg_;
};

}  // namespace

std::unique_ptr<DeviceGroup> make_device_group(Runtime& rt, const std::string& device, ProcessGroup& pg, Millis timeout) {
  if (rt.device != DeviceKind::cuda || !rt.memory.device_memory())
    throw ConfigError(fmt::format("dist.backend = \"nccl\" on device {}: NCCL moves GPU memory", device_name(rt.device)),
                      "use dist.backend = \"gloo\" on cpu ranks, or --device cuda");
  if (device == "cuda-sim") return std::make_unique<SimDeviceGroup>(rt, pg);
  std::string why;
  using Make = DeviceGroup* (*)(Runtime*, Store*, int, int, int64_t);
  auto make = reinterpret_cast<Make>(cuda_symbol("distlab_nccl_group", &why));
  if (!make) throw ConfigError("dist.backend = \"nccl\": " + why, "use dist.backend = \"gloo\"");
  return std::unique_ptr<DeviceGroup>(make(&rt, &pg.store(), pg.rank(), pg.size(), int64_t(timeout.count())));
}

}  // namespace distlab
