// A dense, contiguous tensor: a shape, a dtype, and shared storage that is counted by the rank's
// MemoryAccountant under a category. Copies share storage (like torch.Tensor); the bytes are returned to
// the accountant when the last copy goes away. On the meta device there is no data (data() is nullptr); on
// cuda data() is a device pointer, from the accountant's DeviceMemory (core/cuda/device_memory.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/device.h"
#include "core/tensor/dtype.h"
#include "core/tensor/memory.h"

namespace distlab {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[128, 3, 32, 32]"
int64_t shape_numel(const Shape& s);

struct Storage {
  void* data = nullptr;  // nullptr on meta; a device pointer on cuda
  int64_t bytes = 0;
  Category category = Category::other;
  MemoryAccountant* accountant = nullptr;
  DeviceMemory* device = nullptr;  // where data lives when it is not the host's
  DeviceMemory* pinned_by = nullptr;  // host memory page-locked by this device (CPU offload's, on a cuda rank)
  int64_t model_block = -1;           // its block in the accountant's caching-allocator model
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialized storage (zeros() for zero-filled). `what` names the tensor in an out-of-memory message.
  static Tensor empty(const Shape& shape, MemoryAccountant& acct, DeviceKind device, Category cat,
                      DType dtype = DType::f32, const std::string& what = "tensor");
  static Tensor zeros(const Shape& shape, MemoryAccountant& acct, DeviceKind device, Category cat,
                      DType dtype = DType::f32, const std::string& what = "tensor");

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t i) const { return shape_[size_t(i < 0 ? i + dim() : i)]; }
  int64_t numel() const { return shape_numel(shape_); }
  int64_t nbytes() const { return numel() * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  DeviceKind device() const { return device_; }
  bool is_meta() const { return device_ == DeviceKind::meta; }
  // host memory page-locked for a cuda rank's copies (PyTorch's Tensor.is_pinned())
  bool is_pinned() const { return storage_ && storage_->pinned_by; }
  Category category() const { return storage_ ? storage_->category : Category::other; }

  void* data() const { return storage_ && storage_->data ? static_cast<char*>(storage_->data) + offset_ : nullptr; }
  float* f32() const;  // checks the dtype is f32; nullptr on meta
  // element i onwards, as f32 (a bucket's stretch of a flat buffer); nullptr on meta, so that algorithm code
  // hands a null buffer on without a check and the copies and collectives do nothing with it
  float* f32_at(int64_t i) const {
    float* p = f32();
    return p ? p + i : nullptr;
  }

  // Same storage, new shape with the same number of elements.
  Tensor view(const Shape& shape) const;
  // Same storage: elements [start, start + numel(shape)) of this tensor, as a tensor of that shape (PyTorch's
  // views of a FlatParameter: a layer's weight is a stretch of its unit's gathered flat buffer). The storage
  // lives while any view of it does.
  Tensor slice(int64_t start, const Shape& shape) const;
  // Deep copy into a new storage of the given category (and dtype, converting).
  Tensor clone(Category cat, DType dtype) const;
  void zero_();
  void fill_(float v);
  void copy_from(const Tensor& src);  // same numel; converts dtype; between host and device too
  // The tensor's bytes (its dtype, nbytes()) to and from host memory, wherever the tensor lives: a memcpy
  // on the cpu, a copy across on cuda (after the work queued before it). Nothing on meta.
  void to_host(void* dst) const;
  void from_host(const void* src);
  void upload(const void* src);  // from_host queued without a wait (DeviceMemory::upload): a step's inputs
  // Drops this handle's storage but keeps the shape, dtype and device: what a ZeRO-3/FSDP parameter is
  // between uses (PyTorch FSDP resizes the flat parameter's storage to 0). defined() is false until the
  // strategy assigns a gathered tensor again; numel() still says how big the parameter is.
  void release() {
    storage_.reset();
    offset_ = 0;
  }

  MemoryAccountant* accountant() const { return storage_ ? storage_->accountant : nullptr; }

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
  DeviceKind device_ = DeviceKind::cpu;
  int64_t offset_ = 0;  // bytes into the storage where element 0 is (a slice)
};

struct QuantState;  // core/nn/qlora.h

// A named trainable tensor and its gradient. The gradient is allocated (zeroed) on the first backward
// that needs it and released by zero_grad, as PyTorch does with set_to_none=True.
struct Parameter {
  std::string name;  // PyTorch's name: "conv1.weight", "transformer.h.0.attn.c_attn.weight"
  Tensor data;       // category params; bf16/f16 under mixed precision (the optimizer holds the f32 master)
  Tensor grad;       // category grads, the data's dtype; undefined until the first backward
  bool decay = true; // AdamW weight decay applies (false for biases and norms in GPT configs)
  // false: frozen (a LoRA base weight, core/nn/lora.h): no gradient, no optimizer state, no master copy;
  // DDP, ZeRO and the optimizer hold only the trainable ones (trainable() below)
  bool requires_grad = true;
  // Tensor parallel (core/parallel/tensor_parallel.h): the dimension of the whole tensor this rank holds a
  // 1/t slice of (0 rows, 1 columns; -1: whole on every rank), and into how many equal blocks that
  // dimension falls first (c_attn's q, k and v: 3; a rank takes its share of each block).
  int split_dim = -1, split_parts = 1;
  // Pipeline parallel: the name of the parameter this one is a copy of on another stage ("lm_head.weight"
  // on the last stage is tied to the first stage's "transformer.wte.weight"); "" for the original.
  std::string tied;
  // QLoRA (core/nn/qlora.h): data holds the frozen weight's NF4 indices, two a byte, (numel/2, 1) as
  // bitsandbytes' Params4bit; `quant` its constants and its own shape. nullptr: data is the weight.
  std::shared_ptr<QuantState> quant;
  Tensor& grad_for_accumulate();  // allocates the zeroed gradient if needed
};

// The parameters that train (requires_grad), in order: what PyTorch's optimizer is given under PEFT
inline std::vector<Parameter*> trainable(const std::vector<Parameter*>& params) {
  std::vector<Parameter*> v;
  for (Parameter* p : params)
    if (p->requires_grad) v.push_back(p);
  return v;
}

// A named non-trainable tensor that is part of the model's state (BatchNorm running statistics).
struct Buffer {
  std::string name;
  Tensor data;
};

}  // namespace distlab
