#include "core/optim/reduce.h"

#include <fmt/format.h>

#include <cstring>

#include "core/util/error.h"

namespace distlab {

DeviceScalars::DeviceScalars(Runtime& rt, int64_t count, const char* what)
    : count_(count), sums_(size_t(count), 0.0), flags_(size_t(count), 0.0f) {
  if (!rt.kernels || count == 0) return;  // a cpu rank: the kernels write sums_ and flags_ themselves
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
  return slots_ ? static_cast<double*>(slots_) + i : &sums_[size_t(i)];
}

float* DeviceScalars::flag(int64_t i) {
  DL_ASSERT(i >= 0 && i < count_, "a DeviceScalars slot out of range");
  return slots_ ? reinterpret_cast<float*>(static_cast<char*>(slots_) + 8 * i) : &flags_[size_t(i)];  // a slot's first 4 bytes
}

std::vector<double> DeviceScalars::read_sums() {
  if (slots_) device_->to_host(sums_.data(), slots_, 8 * count_);  // one wait, after the kernels queued before it
  return sums_;
}

double DeviceScalars::total() {
  double t = 0;
  for (double s : read_sums()) t += s;
  return t;
}

bool DeviceScalars::any_flag() {
  if (slots_) {
    std::vector<unsigned char> bytes(size_t(8 * count_));
    device_->to_host(bytes.data(), slots_, 8 * count_);  // one wait
    for (int64_t i = 0; i < count_; i++) std::memcpy(&flags_[size_t(i)], bytes.data() + 8 * i, sizeof(float));
  }
  for (float f : flags_)
    if (f != 0.0f) return true;
  return false;
}

}  // namespace distlab
