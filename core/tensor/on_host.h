// A tensor's values as f32 on the host, for the few places that compute on the host with a handful of
// values (BatchNorm's per-channel statistics and running averages, building a batch from the dataset's
// bytes, hashing weights to compare replicas). The kernels' twin is AsF32 (core/tensor/as_f32.h), which
// hands a kernel the tensor on its own device.
//   - a cpu f32 tensor: its own memory, no copy;
//   - a cpu 16-bit tensor: an f32 copy, rounded back by store() (AsF32's rule);
//   - a cuda tensor: a host copy (downloaded unless the mode is `out`), uploaded by store() in the compute
//     stream's order without a wait (DeviceMemory::upload): the kernels queued after it see the values.
//
//   OnHost m(mean, OnHost::inout);
//   for (int64_t c = 0; c < C; c++) m.p[c] = ...;
//   m.store();
#pragma once
#include <vector>

#include "core/tensor/tensor.h"

namespace distlab {

class OnHost {
 public:
  enum Mode { in, out, inout };
  explicit OnHost(const Tensor& t, Mode mode = in) : t_(t), mode_(mode) {
    if (!t.defined() || !t.data() || t.numel() == 0) return;  // meta, undefined or empty: nullptr
    const bool device = t.device() == DeviceKind::cuda;
    if (!device && t.dtype() == DType::f32) {
      p = t.f32();
      return;
    }
    copy_.resize(size_t(t.numel()));
    p = copy_.data();
    if (mode == out) return;
    if (t.dtype() == DType::f32) {
      t.to_host(p);
    } else if (!device) {
      convert(t.data(), t.dtype(), p, DType::f32, t.numel());
    } else {
      std::vector<uint16_t> raw(size_t(t.numel()));
      t.to_host(raw.data());
      convert(raw.data(), t.dtype(), p, DType::f32, t.numel());
    }
  }
  OnHost(const OnHost&) = delete;
  OnHost& operator=(const OnHost&) = delete;

  // Writes the host values back into the tensor (nothing to do when p is the tensor's own memory).
  void store() {
    if (copy_.empty() || mode_ == in) return;
    if (t_.dtype() == DType::f32) {
      t_.upload(p);
    } else if (t_.device() != DeviceKind::cuda) {
      convert(p, DType::f32, t_.data(), t_.dtype(), t_.numel());
    } else {
      std::vector<uint16_t> raw(size_t(t_.numel()));
      convert(p, DType::f32, raw.data(), t_.dtype(), t_.numel());
      t_.upload(raw.data());
    }
  }

  float* p = nullptr;

 private:
  Tensor t_;
  Mode mode_;
  std::vector<float> copy_;
};

}  // namespace distlab
