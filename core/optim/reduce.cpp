#include "core/optim/reduce.h"

#include <fmt/format.h>

#include <cstring>

#include "core/util/error.h"

namespace distlab {

DeviceScalars::DeviceScalars(Runtime& rt, int64_t count, const char* what) : count_(count), host_(size_t(count), 0.0) {
  if (!rt.kernels || count == 0) return;  // a cpu rank: the kernels write host_ itself
  device_ = rt.memory.device_memory();
  DL_ASSERT(device_ != nullptr, "a rank with device kernels has no device memory");
  slots_ = device_->alloc(8 * count);  // the allocator's blocks are 64-byte aligned or more: doubles fit
  if (!slots_)
    throw OutOfMemoryError(fmt::format("rank {}: no device memory left for {} ({} bytes)", rt.rank, what, 8 * count),
                           "a smaller micro-batch leaves room for the step's reductions");
  device_->zero(slots_, 8 * count);
}

DeviceScalars::~DeviceScalars() {
  if (slots_) device_->free(slots_, 8 * count_);  // in stream order after the kernels that write it: safe
}

double* DeviceScalars::sum(int64_t i) {
  DL_ASSERT(i >= 0 && i < count_, "a DeviceScalars slot out of range");
  return slots_ ? static_cast<double*>(slots_) + i : &host_[size_t(i)];
}

float* DeviceScalars::flag(int64_t i) { return reinterpret_cast<float*>(sum(i)); }

void DeviceScalars::read() {
  if (slots_) device_->to_host(host_.data(), slots_, 8 * count_);  // one wait, after the kernels queued before it
}

std::vector<double> DeviceScalars::read_sums() {
  read();
  return host_;
}

bool DeviceScalars::any_flag() {
  read();
  for (const double& slot : host_) {
    float f;
    std::memcpy(&f, &slot, sizeof f);
    if (f != 0.0f) return true;
  }
  return false;
}

}  // namespace distlab
