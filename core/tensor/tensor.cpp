#include "core/tensor/tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/util/error.h"

namespace distlab {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Storage::~Storage() {
  if (!accountant) return;
  if (device) device->free(data, bytes);
  else if (pinned_by) pinned_by->pinned_free(data, bytes);
  else accountant->host_free(data, bytes);
  accountant->release(bytes, category, model_block);
}

Tensor Tensor::empty(const Shape& shape, MemoryAccountant& acct, DeviceKind device, Category cat, DType dtype,
                     const std::string& what) {
  for (auto d : shape)
    if (d < 0) throw ShapeError(fmt::format("negative dimension in shape {} of {}", shape_str(shape), what));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  int64_t bytes = shape_numel(shape) * dtype_size(dtype);
  const int64_t model_block = acct.allocate(bytes, cat, what);  // throws before anything is held
  auto st = std::make_shared<Storage>();
  st->model_block = model_block;
  st->bytes = bytes;
  st->category = cat;
  st->accountant = &acct;
  if (device == DeviceKind::cpu && bytes > 0) {
    // CPU offload's host memory on a rank with a device is page-locked by it (Category::host's comment).
    // Where the host will not lock that much (a container's limit), it is ordinary memory: the same
    // numbers, slower copies (is_pinned() says which).
    if (cat == Category::host && acct.device_memory()) {
      st->data = acct.device_memory()->pinned_alloc(bytes);
      if (st->data) st->pinned_by = acct.device_memory();
    }
    if (!st->data) st->data = acct.host_alloc(bytes);
    if (!st->data) {
      acct.release(bytes, cat, model_block);
      st->accountant = nullptr;
      throw OutOfMemoryError(fmt::format("host allocation of {} bytes for {} failed", bytes, what),
                             "the machine itself is out of memory: use a smaller model or batch");
    }
  }
  if (device == DeviceKind::cuda) {
    st->device = acct.device_memory();
    if (!st->device) {
      acct.release(bytes, cat, model_block);
      st->accountant = nullptr;
      throw Error(fmt::format("{} is a cuda tensor, but rank {} has no GPU attached", what, acct.rank()),
                  "attach a CudaContext to the Runtime first (attach_cuda in core/cuda/device_memory.h)");
    }
    st->data = bytes > 0 ? st->device->alloc(bytes) : nullptr;
    if (bytes > 0 && !st->data) {  // the accountant's capacity allowed it, the GPU itself did not
      acct.release(bytes, cat, model_block);
      st->accountant = nullptr;
      throw OutOfMemoryError(fmt::format("the GPU could not allocate {} bytes for {} on rank {} ({} free on the device; counted: {})",
                                         bytes, what, acct.rank(), st->device->free_bytes(), acct.breakdown()),
                             "another process holds GPU memory, or the cache is fragmented: a smaller micro-batch, or --device-mem below the card's size");
    }
  }
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, MemoryAccountant& acct, DeviceKind device, Category cat, DType dtype,
                     const std::string& what) {
  Tensor t = empty(shape, acct, device, cat, dtype, what);
  t.zero_();
  return t;
}

float* Tensor::f32() const {
  DL_ASSERT(dtype_ == DType::f32, "f32() on a tensor of dtype " + std::string(dtype_name(dtype_)));
  return static_cast<float*>(data());
}

Tensor Tensor::view(const Shape& shape) const {
  if (shape_numel(shape) != numel())
    throw ShapeError(fmt::format("cannot view {} as {}", shape_str(shape_), shape_str(shape)));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(int64_t start, const Shape& shape) const {
  const int64_t n = shape_numel(shape);
  if (start < 0 || n < 0 || start + n > numel())
    throw ShapeError(fmt::format("cannot slice elements [{}, {}) of a tensor of {} elements", start, start + n, numel()));
  Tensor t = *this;
  t.shape_ = shape;
  t.offset_ = offset_ + start * dtype_size(dtype_);
  return t;
}

Tensor Tensor::clone(Category cat, DType dtype) const {
  DL_ASSERT(defined(), "clone of an undefined tensor");
  Tensor t = empty(shape_, *storage_->accountant, device_, cat, dtype, "clone");
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  if (!data()) return;
  if (storage_->device) storage_->device->zero(data(), nbytes());
  else std::memset(data(), 0, size_t(nbytes()));
}

void Tensor::fill_(float v) {
  if (!data()) return;
  if (storage_->device) {
    storage_->device->fill(data(), dtype_, v, numel());
    return;
  }
  if (dtype_ == DType::f32) {
    float* p = f32();
    for (int64_t i = 0; i < numel(); i++) p[i] = v;
  } else {
    uint16_t h = dtype_ == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
    auto* p = static_cast<uint16_t*>(data());
    for (int64_t i = 0; i < numel(); i++) p[i] = h;
  }
}

void Tensor::copy_from(const Tensor& src) {
  if (src.numel() != numel())
    throw ShapeError(fmt::format("copy of {} into {}", shape_str(src.shape()), shape_str(shape_)));
  if (!data() || !src.data() || numel() == 0) return;
  DeviceMemory* to = storage_->device;
  DeviceMemory* from = src.storage_->device;
  if (!to && !from) {  // host to host
    convert(src.data(), src.dtype(), data(), dtype_, numel());
    return;
  }
  if (to && from) {  // on the device (one GPU per rank: the same one)
    to->convert(src.data(), src.dtype(), data(), dtype_, numel());
    return;
  }
  // between host and device: the bytes cross as they are, the dtype changes on the host's side
  if (src.dtype() == dtype_) {
    if (to) to->from_host(data(), src.data(), nbytes());
    else from->to_host(data(), src.data(), nbytes());
    return;
  }
  std::vector<char> staging(size_t(numel() * dtype_size(to ? dtype_ : src.dtype())));
  if (to) {  // convert on the host, then up
    convert(src.data(), src.dtype(), staging.data(), dtype_, numel());
    to->from_host(data(), staging.data(), nbytes());
  } else {  // down, then convert on the host
    from->to_host(staging.data(), src.data(), src.nbytes());
    convert(staging.data(), src.dtype(), data(), dtype_, numel());
  }
}

void Tensor::to_host(void* dst) const {
  if (!data() || numel() == 0) return;
  if (storage_->device) storage_->device->to_host(dst, data(), nbytes());
  else std::memcpy(dst, data(), size_t(nbytes()));
}

void Tensor::upload(const void* src) {
  if (!data() || numel() == 0) return;
  if (storage_->device) storage_->device->upload(data(), src, nbytes());
  else std::memcpy(data(), src, size_t(nbytes()));
}

void Tensor::from_host(const void* src) {
  if (!data() || numel() == 0) return;
  if (storage_->device) storage_->device->from_host(data(), src, nbytes());
  else std::memcpy(data(), src, size_t(nbytes()));
}

Tensor& Parameter::grad_for_accumulate() {
  if (!grad.defined())
    grad = Tensor::zeros(data.shape(), *data.accountant(), data.device(), Category::grads, data.dtype(),
                         "gradient of " + name);
  return grad;
}

}  // namespace distlab
