// What eager PyTorch would move through memory for the work of one of distlab's fused kernels.
//
// distlab's kernels do an operation's elementwise work in one pass: RMSNorm reads x and writes y. Eager
// PyTorch runs the same math as the chain of ATen ops the model's Python code calls, one kernel each,
// every intermediate written to memory and read back: torchtitan's RMSNorm is
//     (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight
// — seven kernels and nine times the bytes under bf16. torch.compile's job is to fuse such chains back into
// one kernel; torchtitan measures what that is worth (its docs/performance.md, Table 1: 5,762 → 6,667
// tokens/s/GPU on 8 H100s) and `bench/published.toml` checks this file against that gain.
//
// The chains are those of torchtitan's Llama as benchmarked (commit d4c86e3, January 2025: RMSNorm above,
// RoPE through view_as_complex on f32 copies, F.silu(w1(x)) * w3(x), cross_entropy on pred.float(),
// foreach AdamW); eager_chain() in eager.cpp derives each one's bytes per element, op by op. Kernels that
// eager PyTorch also runs as one (GEMMs, SDPA, LayerNorm, GELU, embedding, residual adds, the k/v repeat)
// keep their bytes. The model replaces bytes and launches only; FLOPs are the same math.
// Read next: core/perf/cost_model.cpp (compute_time uses this when log.kernels = "eager" or "compiled").
#pragma once
#include <array>
#include <string>
#include <vector>

#include "core/util/choice.h"

namespace distlab {

// log.kernels: what the modeled step runs — distlab's fused kernels, eager PyTorch's op chains, or
// torch.compile applied to each transformer block as torchtitan does (torchtitan/parallelisms/
// parallelize_llama.py, apply_compile at d4c86e3): the blocks' chains fused, and what lies outside the
// blocks eager — the loss (its compile is commented out there: "causes CUDA errors") and foreach AdamW.
// The final RMSNorm, outside the blocks too, is modeled fused: one norm of 2L + 1.
enum class ModeledKernels { fused, eager, compiled };
template <>
struct ChoiceTable<ModeledKernels> {
  static constexpr std::array names = {choice(ModeledKernels::fused, "fused"), choice(ModeledKernels::eager, "eager"),
                                       choice(ModeledKernels::compiled, "compiled")};
};

// The op families that have an eager chain here, as bits: which of them a modeled step runs op by op.
namespace eager_op {
constexpr unsigned rmsnorm = 1, rope = 2, swiglu = 4, loss = 8, adamw = 16, all = 31;
}
// The families log.kernels runs as eager chains, less those log.fused_ops names (a Triton kernel the model's
// code calls instead: torchtitan of April 2024 ran RMSNorm as its fused_rmsnorm, the rest eager). An
// unknown name in fused_ops is a ConfigError naming the key.
unsigned eager_ops_for(ModeledKernels kernels, const std::vector<std::string>& fused_ops);
std::string eager_op_names();  // "rmsnorm, rope, swiglu, loss, adamw"

// Which kernels a modeled step runs, for the cost model.
struct KernelSet {
  unsigned eager_ops = 0;    // eager_op bits: these families run as eager PyTorch's chains, the rest fused
  int activation_bytes = 4;  // 2 under bf16/fp16 autocast: eager's casts to f32 and back then cost bytes
};

struct KernelChain {
  double bytes = 0;  // read + written by the whole chain
  int launches = 1;  // kernels in the chain (each pays the profile's launch overhead)
};

// The chain eager PyTorch runs for distlab's kernel `name`, which recorded `fused_bytes` (already scaled to
// the activation size, as OpScope records them). A kernel without an eager chain, or whose family is not in
// `eager_ops`, comes back unchanged.
KernelChain eager_chain(const std::string& name, double fused_bytes, int activation_bytes, unsigned eager_ops = eager_op::all);

}  // namespace distlab
