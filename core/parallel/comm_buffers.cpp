#include "core/parallel/comm_buffers.h"

#include <cstring>
#include <vector>

#include "core/comm/device_group.h"

namespace distlab {

static bool on_device(const Runtime& rt) { return rt.device == DeviceKind::cuda; }

void copy_values(Runtime& rt, const void* src, DType st, void* dst, DType dt, int64_t n) {
  copy_across(rt, src, st, rt.device, dst, dt, rt.device, n);
}

void zero_values(Runtime& rt, void* p, int64_t bytes) {
  if (bytes <= 0 || !p) return;
  if (on_device(rt)) rt.memory.device_memory()->zero(p, bytes);
  else std::memset(p, 0, size_t(bytes));
}

void copy_across(Runtime& rt, const void* src, DType st, DeviceKind sd, void* dst, DType dt, DeviceKind dd, int64_t n) {
  if (n <= 0 || !src || !dst) return;  // nothing to copy, or the meta device
  if (sd == dd) {
    if (sd == DeviceKind::cuda) rt.memory.device_memory()->convert(src, st, dst, dt, n);
    else convert(src, st, dst, dt, n);
    return;
  }
  DeviceMemory& m = *rt.memory.device_memory();
  const bool down = dd != DeviceKind::cuda;
  if (st == dt) {  // straight into place: at the bus's full speed when the host side is page-locked
    if (down) m.to_host(dst, src, n * dtype_size(st));
    else m.from_host(dst, src, n * dtype_size(st));
    return;
  }
  // The smaller dtype crosses the bus: a narrowing runs before the crossing, a widening after it, on
  // whichever side that is (both sides convert to the same bits). The device's side converts in a scratch
  // block: transient, like NCCL's 16-bit copies, and when the device has none the host converts instead.
  const DType wire = dtype_size(dt) < dtype_size(st) ? dt : st;
  const int64_t bytes = n * dtype_size(wire);
  const bool on_device = down ? wire != st : wire != dt;  // is the device's side the one that converts?
  if (void* scratch = on_device ? m.alloc(bytes) : nullptr) {
    if (down) {  // f32 on the device -> 16 bits there, down into place
      m.convert(src, st, scratch, wire, n);
      m.to_host(dst, scratch, bytes);
    } else {  // 16 bits up, widened into place on the device
      m.from_host(scratch, src, bytes);
      m.convert(scratch, wire, dst, dt, n);
    }
    m.free(scratch, bytes);  // stream order: reused only by work queued after the conversion
    return;
  }
  std::vector<char> raw(size_t(n * dtype_size(down ? st : dt)));
  if (down) {  // down as it is, converted on the host
    m.to_host(raw.data(), src, n * dtype_size(st));
    convert(raw.data(), st, dst, dt, n);
  } else {  // converted on the host, then up
    convert(src, st, raw.data(), dt, n);
    m.from_host(dst, raw.data(), n * dtype_size(dt));
  }
}

// The blocking forms: a cpu rank's Gloo call as it was; a cuda rank's through the async form, awaited.
void staged_all_reduce(Runtime& rt, ProcessGroup& pg, float* data, int64_t n, ReduceOp op, DType wire) {
  if (!on_device(rt) || !data) return pg.all_reduce(data, n, op, wire);
  staged_all_reduce_async(rt, pg, data, n, op, wire)->wait();
}

void staged_reduce_scatter(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, ReduceOp op, DType wire) {
  if (!on_device(rt) || !in) return pg.reduce_scatter(out, in, n, op, wire);
  staged_reduce_scatter_async(rt, pg, out, in, n, op, wire)->wait();
}

void staged_all_gather(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, DType wire) {
  if (!on_device(rt) || !out) return pg.all_gather(out, in, n, wire);
  staged_all_gather_async(rt, pg, out, in, n, wire)->wait();
}

std::shared_ptr<Work> staged_all_reduce_async(Runtime& rt, ProcessGroup& pg, float* data, int64_t n, ReduceOp op, DType wire) {
  if (!on_device(rt) || !data) return pg.all_reduce_async(data, n, op, wire);
  if (DeviceGroup* d = pg.device_backend()) return d->all_reduce_async(data, n, op, wire);
  return via_host_all_reduce_async(*rt.memory.device_memory(), pg, data, n, op, wire);
}

std::shared_ptr<Work> staged_reduce_scatter_async(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, ReduceOp op,
                                                  DType wire) {
  if (!on_device(rt) || !in) return pg.reduce_scatter_async(out, in, n, op, wire);
  if (DeviceGroup* d = pg.device_backend()) return d->reduce_scatter_async(out, in, n, op, wire);
  return via_host_reduce_scatter_async(*rt.memory.device_memory(), pg, out, in, n, op, wire);
}

std::shared_ptr<Work> staged_all_gather_async(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, DType wire) {
  if (!on_device(rt) || !out) return pg.all_gather_async(out, in, n, wire);
  if (DeviceGroup* d = pg.device_backend()) return d->all_gather_async(out, in, n, wire);
  return via_host_all_gather_async(*rt.memory.device_memory(), pg, out, in, n, wire);
}

}  // namespace distlab
