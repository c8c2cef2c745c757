// What one rank owns: its device, its memory accountant and its trace. Passed explicitly (by reference) to
// everything that allocates or computes — there are no global singletons, so several ranks can live in one
// process (threads in tests) without sharing state.
#pragma once
#include <string>

#include "core/perf/trace.h"
#include "core/tensor/memory.h"
#include "core/tensor/tensor.h"

namespace distlab {

class CudaContext;  // core/cuda/context.h: only in a build with CUDA
struct Kernels;     // core/ops/kernels.h
class AttachedDevice;  // core/ops/attach.h

struct Runtime {
  explicit Runtime(DeviceKind dev = DeviceKind::cpu, int rank_ = 0, int64_t capacity = -1)
      : device(dev), rank(rank_), memory(rank_, device_name(dev), capacity) {}
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  DeviceKind device;
  int rank;
  // What parameters, gradients and activations are held in: f32, or bf16/f16 under mixed precision
  // ([precision] mode). Set before the model is built; the optimizer keeps f32 master weights.
  DType dtype = DType::f32;
  // What gradients travel in when they are averaged across ranks ([precision] reduce_dtype; PyTorch FSDP's
  // MixedPrecision.reduce_dtype, DDP's bf16 compression hook): f32, or 16 bits for half the bytes.
  DType reduce_dtype = DType::f32;
  // The op families that run as eager PyTorch's chains (log.kernels, log.fused_ops: core/perf/eager.h's
  // eager_op bits): the memory count also holds what eager autograd keeps for them and distlab's fused
  // kernels do not (measured with saved-tensor hooks, bench/peer_torch_llama.py --only saved): an f32 tensor
  // the size of RMSNorm's input, SiLU's output, and in 16-bit training a third f32 (B·T, vocab) tensor during
  // the loss's backward. They are allocated and freed where PyTorch's are, never read or written.
  unsigned eager_ops = 0;
  MemoryAccountant memory;
  Trace trace;
  // The rank's GPU (streams, cuBLAS, allocator) when device is cuda; owned by whoever made the Runtime.
  CudaContext* cuda = nullptr;
  // The device's kernels when they are not the cpu's (core/ops/kernels.h); nullptr on cpu and meta.
  const Kernels* kernels = nullptr;
  // What attach_device made of a cuda (or cuda-sim) rank: synchronize() ends a measured step. nullptr on cpu and meta.
  AttachedDevice* attached = nullptr;

  bool is_meta() const { return device == DeviceKind::meta; }
  // Shorthands for allocation on this rank's device.
  Tensor empty(const Shape& s, Category c, const std::string& what = "tensor", DType t = DType::f32) {
    return Tensor::empty(s, memory, device, c, t, what);
  }
  Tensor zeros(const Shape& s, Category c, const std::string& what = "tensor", DType t = DType::f32) {
    return Tensor::zeros(s, memory, device, c, t, what);
  }
  // Host memory on this rank, whatever its device: cpu, or meta on meta. What a cuda rank keeps on the
  // host side: CPU offload's parts (core/parallel/offload.h), arrays handed to host code (TpKernels).
  DeviceKind host_device() const { return is_meta() ? DeviceKind::meta : DeviceKind::cpu; }
  Tensor host_empty(const Shape& s, Category c, const std::string& what, DType t = DType::f32) {
    return Tensor::empty(s, memory, host_device(), c, t, what);
  }
};

// The host's kernels for a while, on a cuda rank: what CPU offload's optimizer step runs on the parts kept
// in host memory (core/parallel/zero2.h), and what cuda-sim's kernel table runs (core/ops/sim_device.h).
// Within it rt.device is cpu and rt.kernels nullptr, so ops run their cpu kernels and rt.empty makes host
// tensors. With `on` false, or on a rank that is not cuda, nothing changes.
class HostKernels {
 public:
  explicit HostKernels(Runtime& rt, bool on = true)
      : rt_(rt), kernels_(rt.kernels), device_(rt.device), on_(on && rt.device == DeviceKind::cuda) {
    if (!on_) return;
    rt.kernels = nullptr;
    rt.device = DeviceKind::cpu;
  }
  ~HostKernels() {
    if (!on_) return;
    rt_.kernels = kernels_;
    rt_.device = device_;
  }
  HostKernels(const HostKernels&) = delete;
  HostKernels& operator=(const HostKernels&) = delete;

 private:
  Runtime& rt_;
  const Kernels* kernels_;
  DeviceKind device_;
  bool on_;
};

// Sets the compute threads this process uses (OpenMP; BLAS runs inside them). A rank must not oversubscribe: with N ranks on
// C cores, each should use about C/N threads.
void set_compute_threads(int n);
int compute_threads();

}  // namespace distlab
