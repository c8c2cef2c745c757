#include "core/comm/device_group.h"

#include <fmt/format.h>

#include <vector>

#include "core/tensor/device.h"
#include "core/tensor/runtime.h"
#include "core/util/error.h"

namespace distlab {

// One host buffer per side, alive in the Work's continuation until it is waited for.
using HostBuf = std::shared_ptr<std::vector<float>>;
static HostBuf host_buffer(int64_t n) { return std::make_shared<std::vector<float>>(static_cast<size_t>(n)); }

std::shared_ptr<Work> via_host_all_reduce_async(DeviceMemory& mem, ProcessGroup& pg, float* data, int64_t n, ReduceOp op, DType wire) {
  HostBuf host = host_buffer(n);
  mem.to_host(host->data(), data, n * 4);
  auto w = pg.all_reduce_async(host->data(), n, op, wire);
  w->then([&mem, data, n, host] { mem.from_host(data, host->data(), n * 4); });
  return w;
}

std::shared_ptr<Work> via_host_reduce_scatter_async(DeviceMemory& mem, ProcessGroup& pg, float* out, const float* in, int64_t n,
                                                    ReduceOp op, DType wire) {
  HostBuf host_in = host_buffer(n * pg.size()), host_out = host_buffer(n);
  mem.to_host(host_in->data(), in, n * pg.size() * 4);
  auto w = pg.reduce_scatter_async(host_out->data(), host_in->data(), n, op, wire);
  w->then([&mem, out, n, host_in, host_out] { mem.from_host(out, host_out->data(), n * 4); });
  return w;
}

std::shared_ptr<Work> via_host_all_gather_async(DeviceMemory& mem, ProcessGroup& pg, float* out, const float* in, int64_t n, DType wire) {
  HostBuf host_in = host_buffer(n), host_out = host_buffer(n * pg.size());
  mem.to_host(host_in->data(), in, n * 4);
  auto w = pg.all_gather_async(host_out->data(), host_in->data(), n, wire);
  const int64_t total = n * pg.size();
  w->then([&mem, out, total, host_in, host_out] { mem.from_host(out, host_out->data(), total * 4); });
  return w;
}

namespace {

// cuda-sim: the same calls in the same order as NCCL's, each over host copies and the Gloo group.
class SimDeviceGroup : public DeviceGroup {
 public:
  SimDeviceGroup(Runtime& rt, ProcessGroup& pg) : mem_(*rt.memory.device_memory()), pg_(pg) {}
  int rank() const override { return pg_.rank(); }
  int size() const override { return pg_.size(); }
  std::string describe() const override { return fmt::format("nccl on cuda-sim (Gloo over host copies, {} rank(s))", pg_.size()); }
  std::shared_ptr<Work> all_reduce_async(float* data, int64_t n, ReduceOp op, DType wire) override {
    return via_host_all_reduce_async(mem_, pg_, data, n, op, wire);
  }
  std::shared_ptr<Work> reduce_scatter_async(float* out, const float* in, int64_t n, ReduceOp op, DType wire) override {
    return via_host_reduce_scatter_async(mem_, pg_, out, in, n, op, wire);
  }
  std::shared_ptr<Work> all_gather_async(float* out, const float* in, int64_t n, DType wire) override {
    return via_host_all_gather_async(mem_, pg_, out, in, n, wire);
  }
  std::map<std::string, CommCounters> counters() const override { return {}; }

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
  using Make = DeviceGroup* (*)(Runtime*, Store*, const std::string*, int, int, int64_t);
  auto make = reinterpret_cast<Make>(cuda_symbol("distlab_nccl_group", &why));
  if (!make) throw ConfigError("dist.backend = \"nccl\": " + why, "use dist.backend = \"gloo\"");
  // its store keys under the Gloo group's name: two groups (a mesh's dp groups) never read each other's id
  const std::string name = "nccl-" + pg.name();
  return std::unique_ptr<DeviceGroup>(make(&rt, &pg.store(), &name, pg.rank(), pg.size(), int64_t(timeout.count())));
}

}  // namespace distlab
