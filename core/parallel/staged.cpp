#include "core/parallel/staged.h"

#include <cstring>
#include <vector>

namespace distlab {

static bool on_device(const Runtime& rt) { return rt.device == DeviceKind::cuda; }

void copy_values(Runtime& rt, const void* src, DType st, void* dst, DType dt, int64_t n) {
  if (n <= 0) return;
  if (on_device(rt)) rt.memory.device_memory()->convert(src, st, dst, dt, n);
  else convert(src, st, dst, dt, n);
}

void zero_values(Runtime& rt, void* p, int64_t bytes) {
  if (bytes <= 0) return;
  if (on_device(rt)) rt.memory.device_memory()->zero(p, bytes);
  else std::memset(p, 0, size_t(bytes));
}

void staged_all_reduce(Runtime& rt, ProcessGroup& pg, float* data, int64_t n, ReduceOp op, DType wire) {
  if (!on_device(rt) || !data) return pg.all_reduce(data, n, op, wire);
  DeviceMemory& mem = *rt.memory.device_memory();
  std::vector<float> host(static_cast<size_t>(n));
  mem.to_host(host.data(), data, n * 4);
  pg.all_reduce(host.data(), n, op, wire);
  mem.from_host(data, host.data(), n * 4);
}

void staged_reduce_scatter(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, ReduceOp op, DType wire) {
  if (!on_device(rt) || !in) return pg.reduce_scatter(out, in, n, op, wire);
  DeviceMemory& mem = *rt.memory.device_memory();
  std::vector<float> host_in(static_cast<size_t>(n * pg.size())), host_out(static_cast<size_t>(n));
  mem.to_host(host_in.data(), in, n * pg.size() * 4);
  pg.reduce_scatter(host_out.data(), host_in.data(), n, op, wire);
  mem.from_host(out, host_out.data(), n * 4);
}

void staged_all_gather(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, DType wire) {
  if (!on_device(rt) || !out) return pg.all_gather(out, in, n, wire);
  DeviceMemory& mem = *rt.memory.device_memory();
  std::vector<float> host_in(static_cast<size_t>(n)), host_out(static_cast<size_t>(n * pg.size()));
  mem.to_host(host_in.data(), in, n * 4);
  pg.all_gather(host_out.data(), host_in.data(), n, wire);
  mem.from_host(out, host_out.data(), n * pg.size() * 4);
}

std::shared_ptr<Work> staged_reduce_scatter_async(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, ReduceOp op,
                                                  DType wire) {
  if (!on_device(rt) || !in) return pg.reduce_scatter_async(out, in, n, op, wire);
  DeviceMemory* mem = rt.memory.device_memory();
  auto host_in = std::make_shared<std::vector<float>>(static_cast<size_t>(n * pg.size()));
  auto host_out = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
  mem->to_host(host_in->data(), in, n * pg.size() * 4);
  auto w = pg.reduce_scatter_async(host_out->data(), host_in->data(), n, op, wire);
  // the buffers live in the Work (whose queue entry Gloo holds) until it is waited for
  w->then([mem, out, n, host_in, host_out] { mem->from_host(out, host_out->data(), n * 4); });
  return w;
}

std::shared_ptr<Work> staged_all_gather_async(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, DType wire) {
  if (!on_device(rt) || !out) return pg.all_gather_async(out, in, n, wire);
  DeviceMemory* mem = rt.memory.device_memory();
  auto host_in = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
  auto host_out = std::make_shared<std::vector<float>>(static_cast<size_t>(n * pg.size()));
  mem->to_host(host_in->data(), in, n * 4);
  auto w = pg.all_gather_async(host_out->data(), host_in->data(), n, wire);
  const int64_t total = n * pg.size();
  w->then([mem, out, total, host_in, host_out] { mem->from_host(out, host_out->data(), total * 4); });
  return w;
}

}  // namespace distlab
