// The strategies' communication buffers: their copies and collectives, wherever the rank's tensors live:
//   - a cpu rank converts and copies on the host and hands its buffers to Gloo as they are;
//   - a cuda rank converts and copies on its device, and its collectives go
//       - through the group's device backend when it has one (dist.backend = "nccl": the buffers are
//         reduced and gathered where they are, core/comm/device_group.h),
//       - else through host copies: down, reduced or gathered by Gloo, back up (PyTorch's gloo backend
//         does the same with CUDA tensors).
// DDP's buckets, ZeRO's and FSDP's flat buffers all come through here: the one place that knows.
// Pointers may point inside a tensor (a bucket's stretch of a flat buffer). On the meta device every pointer
// is null (Tensor::f32_at keeps it so) and every copy does nothing; the collectives are still traced and counted.
// The collectives are "staged" because a cuda rank without a device backend stages them through host copies.
// Read next: sharded_strategy.h (what the ZeRO stages share), then zero1.h.
#pragma once
#include <cstdint>
#include <memory>

#include "core/comm/process_group.h"
#include "core/tensor/runtime.h"

namespace distlab {

// dst (n values of dt, on device dd) = src (n values of st, on device sd), converted. On one device the
// conversion runs there; across (a cuda rank's CPU-offload parts are host memory) the smaller of the two
// dtypes crosses the bus, so f32 -> bf16 narrows on the sending side and bf16 -> f32 widens on the receiving one.
void copy_across(Runtime& rt, const void* src, DType st, DeviceKind sd, void* dst, DType dt, DeviceKind dd, int64_t n);
// the same where both live on the rank's device (nothing when either pointer is null: the meta device)
void copy_values(Runtime& rt, const void* src, DType st, void* dst, DType dt, int64_t n);
void zero_values(Runtime& rt, void* p, int64_t bytes);

// ProcessGroup's collective of the same name on the rank's own buffers (nullptr on meta, as there)
void staged_all_reduce(Runtime& rt, ProcessGroup& pg, float* data, int64_t n, ReduceOp op, DType wire);
void staged_reduce_scatter(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, ReduceOp op, DType wire);
void staged_all_gather(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, DType wire);
// The same, asynchronous. Through host copies, the input is copied down now and the output up when the
// Work is waited for; through a device backend, wait() returns once the result is in place on the device.
std::shared_ptr<Work> staged_all_reduce_async(Runtime& rt, ProcessGroup& pg, float* data, int64_t n, ReduceOp op, DType wire);
std::shared_ptr<Work> staged_reduce_scatter_async(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, ReduceOp op,
                                                  DType wire);
std::shared_ptr<Work> staged_all_gather_async(Runtime& rt, ProcessGroup& pg, float* out, const float* in, int64_t n, DType wire);

}  // namespace distlab
