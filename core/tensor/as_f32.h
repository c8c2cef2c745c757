// How a tensor held in bf16/f16 meets our f32 CPU kernels. Mixed precision (core/nn/autocast.h) keeps
// parameters, gradients and activations in 16 bits; every kernel in core/ops/cpu computes in f32. An AsF32
// hands a kernel a float*:
//   - an f32 tensor: its own memory (no copy: fp32 runs pay nothing for this);
//   - a 16-bit tensor: an f32 copy in scratch; what the kernel wrote is rounded back into the tensor by
//     store(), once, when the op is done.
// Rounding at every op's boundary is what a GPU does (tensor cores multiply 16-bit inputs, accumulate in
// f32 and write 16 bits), so the numbers are those of a 16-bit run; only the time is the CPU's. The scratch
// comes from the rank's host cache and is not counted by the accountant: a GPU reads the 16-bit values
// directly, and the memory report is the device's, not this emulation's.
//
//   AsF32 x(rt, input, AsF32::in, rt.dtype);   // values as a 16-bit op sees them (an f32 input is rounded)
//   AsF32 y(rt, out, AsF32::out);              // kernel writes y.p ...
//   AsF32 g(rt, param.grad, AsF32::inout);     // ... or accumulates into g.p (+=)
//   kernel(rt, y.p, x.p, g.p, ...);
//   y.store(); g.store();
//
// A device rank's 16-bit run skips the copies where a kernel has a 16-bit form (linear_forward_16,
// layernorm_backward_16, ...: the f32 kernel's arithmetic between an exact widening and one rounding, in
// the kernel): `if (device_16(rt, {&x, &w})) kernel_16(...); else { AsF32 ... }` -- the same bits either way.
#pragma once
#include <fmt/format.h>

#include <initializer_list>
#include <vector>

#include "core/tensor/runtime.h"
#include "core/util/error.h"

namespace distlab {

class AsF32 {
 public:
  enum Mode { in, out, inout };
  // `as`: for an `in` f32 tensor read by an op that runs in 16 bits, the values are rounded to `as` first.
  AsF32(Runtime& rt, const Tensor& t, Mode mode = in, DType as = DType::f32) : rt_(rt), t_(t), mode_(mode) {
    if (!t.defined() || !t.data() || t.numel() == 0) return;  // meta, undefined or empty: nullptr
    const bool round_input = t.dtype() == DType::f32 && mode == in && as != DType::f32;
    if (t.dtype() == DType::f32 && !round_input) {
      p = t.f32();
      return;
    }
    bytes_ = t.numel() * 4;
    if (t.device() == DeviceKind::cuda) {  // the same, in device scratch, converted by the device
      dev_ = rt.memory.device_memory();
      p = static_cast<float*>(dev_->alloc(bytes_));
      if (!p)
        throw OutOfMemoryError(fmt::format("the GPU could not allocate {} bytes of f32 scratch for a {} tensor of {}", bytes_,
                                           dtype_name(t.dtype()), shape_str(t.shape())),
                               "a smaller micro-batch or model");
      if (round_input) {
        void* half = dev_->alloc(t.numel() * 2);
        if (!half) throw OutOfMemoryError("the GPU could not allocate the 16-bit scratch of a rounded input", "a smaller micro-batch");
        dev_->convert(t.data(), DType::f32, half, as, t.numel());
        dev_->convert(half, as, p, DType::f32, t.numel());
        dev_->free(half, t.numel() * 2);
      } else if (mode != out) {
        dev_->convert(t.data(), t.dtype(), p, DType::f32, t.numel());
      }
      return;
    }
    p = static_cast<float*>(rt.memory.host_alloc(bytes_));
    if (!p)
      throw OutOfMemoryError(fmt::format("host allocation of {} bytes of f32 scratch for a {} tensor failed", bytes_,
                                         dtype_name(t.dtype())),
                             "the machine itself is out of memory: use a smaller model or batch");
    if (round_input) round_f32(t.f32(), p, t.numel(), as);
    else if (mode != out) convert(t.data(), t.dtype(), p, DType::f32, t.numel());
  }
  ~AsF32() {
    if (dev_) dev_->free(p, bytes_);
    else if (bytes_) rt_.memory.host_free(p, bytes_);
  }
  AsF32(const AsF32&) = delete;
  AsF32& operator=(const AsF32&) = delete;

  // Rounds what the kernel wrote into the 16-bit tensor (nothing to do when p is the tensor's own memory).
  void store() {
    if (!bytes_ || mode_ == in) return;
    if (dev_) dev_->convert(p, DType::f32, t_.data(), t_.dtype(), t_.numel());
    else convert(p, DType::f32, t_.data(), t_.dtype(), t_.numel());
  }

  float* p = nullptr;

 private:
  Runtime& rt_;
  Tensor t_;
  Mode mode_;
  int64_t bytes_ = 0;
  DeviceMemory* dev_ = nullptr;  // the scratch is on the device
};

// Token ids or class labels (host vectors in a Batch) where a kernel reads them: the vector itself on the
// cpu, a copy in device scratch on cuda (what `targets.to(device)` is in a PyTorch loop).
class Indices {
 public:
  Indices(Runtime& rt, const std::vector<int32_t>& v) {
    p = v.data();
    if (rt.device != DeviceKind::cuda || v.empty()) return;
    dev_ = rt.memory.device_memory();
    bytes_ = int64_t(v.size()) * 4;
    void* d = dev_->alloc(bytes_);
    if (!d) throw OutOfMemoryError(fmt::format("the GPU could not allocate {} bytes for {} indices", bytes_, v.size()), "a smaller micro-batch");
    dev_->upload(d, v.data(), bytes_);  // queued: the host goes on (non_blocking=True from pinned memory)
    p = static_cast<const int32_t*>(d);
  }
  ~Indices() {
    if (dev_) dev_->free(const_cast<int32_t*>(p), bytes_);
  }
  Indices(const Indices&) = delete;
  Indices& operator=(const Indices&) = delete;

  const int32_t* p = nullptr;

 private:
  DeviceMemory* dev_ = nullptr;
  int64_t bytes_ = 0;
};

// A device rank (cuda, cuda-sim) in a 16-bit run whose tensors are all in the run's 16-bit type: the ops
// then call their kernels' 16-bit forms instead of going through AsF32's copies.
inline bool device_16(const Runtime& rt, std::initializer_list<const Tensor*> ts) {
  if (!rt.kernels || (rt.dtype != DType::bf16 && rt.dtype != DType::f16)) return false;
  for (const Tensor* t : ts)
    if (!t->defined() || t->dtype() != rt.dtype) return false;
  return true;
}

}  // namespace distlab
