// PyTorch's FullyShardedDataParallel, in its own words, on ZeRO-3's machinery (zero3.h): FSDP is the
// same idea (ZeRO stage 3) as PyTorch ships it. What the names mean here:
//
//   FlatParameter            one flat vector per unit (a transformer block, a conv layer: the model's
//                            units()) and weight-decay group, padded to N (flat_param.h)
//   auto_wrap_policy         per unit (transformer_auto_wrap_policy's choice), or size-based:
//                            parallel.wrap_min_params merges consecutive units until a flat vector holds
//                            that many parameters — fewer, larger all-gathers, a larger working set
//   sharding_strategy
//     FULL_SHARD             parameters, gradients and optimizer state sharded; a unit's parameters are
//                            freed after its forward and gathered again for its backward (= ZeRO-3)
//     SHARD_GRAD_OP          gradients and optimizer state sharded; parameters gathered once per step and
//                            kept whole from a unit's forward to the end of its backward (≈ ZeRO-2 memory
//                            during the step, one all-gather instead of two)
//     NO_SHARD               nothing sharded: DistributedDataParallel (ddp.h) — make_strategy builds that
//   backward_prefetch        BACKWARD_PRE: the next unit's all-gather is issued before this unit's backward
//   forward_prefetch         the next unit's all-gather is issued before this unit's forward
//                            (parallel.prefetch turns both on or off, parallel.forward_prefetch = false
//                            leaves backward's alone; the order is the one recorded on the first step;
//                            parallel.prefetch_depth = k gathers the next k units, as FSDP2's
//                            set_modules_to_forward_prefetch with k modules)
//   MixedPrecision           param_dtype = [precision] mode (bf16/fp16 parameters gathered and computed in
//                            16 bits, f32 masters sharded in the optimizer); reduce_dtype =
//                            precision.reduce_dtype (f32 by default; bf16 halves the bytes of each reduce)
//   CPUOffload(params=True)  the parts, their gradients and the optimizer state in host memory (category
//                            host, not counted against the device); each gather first copies a part to
//                            the device, each reduced gradient part goes back, the step runs on the host's
//                            CPU — the cost model charges the copies at the profile's host link bandwidth
// Read next: mesh.h (dp × tp × pp: the groups tensor and pipeline parallelism run on).
#pragma once
#include "core/parallel/zero3.h"

namespace distlab {

// parallel.sharding: PyTorch's ShardingStrategy (FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, NO_SHARD = DDP)
enum class Sharding { full_shard, shard_grad_op, no_shard };
template <>
struct ChoiceTable<Sharding> {
  static constexpr std::array names = {choice(Sharding::full_shard, "full_shard"), choice(Sharding::shard_grad_op, "shard_grad_op"),
                                       choice(Sharding::no_shard, "no_shard")};
};

class FSDP : public ZeRO3 {
 public:
  // sharding: full_shard | shard_grad_op (no_shard is DDP: see make_strategy)
  FSDP(ProcessGroup& pg, Model& model, Runtime& rt, Sharding sharding, bool prefetch, bool offload, int64_t min_params = 0,
       bool forward_prefetch = true, int prefetch_depth = 1);
  std::string describe() const override;
  nlohmann::json report() const override;

 private:
  Sharding sharding_;
};

}  // namespace distlab
