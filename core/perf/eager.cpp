// Eager PyTorch's op chains for distlab's fused kernels: the bytes, op by op. See eager.h for why.
//
// Each chain is the list of ATen ops PyTorch runs for torchtitan's code, with the bytes each reads and writes
// (its tensor arguments and results; per-row values not counted): tests/eager_chains.py runs the same code
// under PyTorch's dispatcher and measures them, and the test "eager chains against PyTorch" compares.
// Units: bytes per element of the kernel's main tensor; a = the activations' bytes (2 under bf16/fp16,
// 4 in fp32), f32 temporaries 4. A cast between the activation dtype and f32 costs c = a + 4 (read one,
// write the other) and one launch; in fp32 x.float() and .type_as(x) return x itself: c = 0, no launch.
// Per-row values (a mean, an rsqrt, a log-sum-exp) are small beside (rows, C) and are not counted,
// but their kernels are launched. The fused side is what distlab's own kernel recorded (OpScope: 4 bytes
// per value scaled by a/4), also per element, so elements = fused_bytes / fused_per_element.
#include "core/perf/eager.h"

#include "core/util/error.h"

namespace distlab {

namespace {

struct Chain {
  double fused_per_element;  // what distlab's kernel moves per element
  double eager_per_element;  // what eager PyTorch's chain moves per element
  int launches;
};

struct Family {
  const char* name;
  unsigned bit;
};
constexpr Family kFamilies[] = {{"rmsnorm", eager_op::rmsnorm}, {"rope", eager_op::rope}, {"swiglu", eager_op::swiglu},
                                {"loss", eager_op::loss}, {"adamw", eager_op::adamw}};

// the family of one of distlab's kernels: rmsnorm_forward -> rmsnorm, softmax_crossentropy_backward -> loss
unsigned family_of(const std::string& name) {
  if (name.rfind("rmsnorm_", 0) == 0) return eager_op::rmsnorm;
  if (name.rfind("rope_", 0) == 0) return eager_op::rope;
  if (name.rfind("swiglu_", 0) == 0) return eager_op::swiglu;
  if (name.rfind("softmax_crossentropy_", 0) == 0) return eager_op::loss;
  if (name == "adamw_step") return eager_op::adamw;
  return 0;
}

bool chain_for(const std::string& name, double a, Chain& out) {
  const bool casts = a != 4;
  const double c = casts ? a + 4 : 0;  // one cast between the activation dtype and f32
  const int k = casts ? 1 : 0;
  if (name == "rmsnorm_forward") {
    // torchtitan's RMSNorm: (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight
    //   _to_copy c | pow r4 w4 | mean r4 | add, rsqrt (per row) | mul r4 w4 | _to_copy c | mul r a w a
    //                                                             fused: read x, write y = 2a
    out = {2 * a, 2 * c + 20 + 2 * a, 6 + 2 * k};
    return true;
  }
  if (name == "rmsnorm_backward") {
    // autograd back through the same chain, as PyTorch runs it:
    //   mul g·yt r 2a w a, mul g·w r a w a, sum (dweight) r a | _to_copy c | mul g·r r4 w4 | mul g·xf r8 w4,
    //   sum(-1) r4 | rsqrt's backward: pow, mul, mul (per row) | mean's backward: div, the row's grad
    //   spread over C w4 | pow's backward: xf.pow(1) r4 w4, ·2 r4 w4, ·g r8 w4 | add the two r8 w4 |
    //   _to_copy c                                                 fused: read dy and x, write dx = 3a
    out = {3 * a, 6 * a + 2 * c + 68, 14 + 2 * k};
    return true;
  }
  if (name == "rope_forward") {
    // apply_rotary_emb, per tensor (q or k): view_as_complex(x.float()) c | mul by freqs_cis r4 w4 (the
    // frequencies, broadcast over batch and heads, are small) | view_as_real(...).type_as(x) c
    //                                                                  fused: read x, write y = 2a
    out = {2 * a, 2 * c + 8, 1 + 2 * k};
    return true;
  }
  if (name == "rope_backward") {
    // _to_copy c | conj(freqs) cloned (small) | mul r4 w4 | _to_copy c     fused: 2a
    out = {2 * a, 2 * c + 8, 2 + 2 * k};
    return true;
  }
  if (name == "swiglu_forward") {
    // F.silu(w1(x)) * w3(x), per hidden element: silu r a w a | mul r 2a w a      fused: r 2a w a = 3a
    out = {3 * a, 5 * a, 2};
    return true;
  }
  if (name == "swiglu_backward") {
    // mul's backward: g·up r 2a w a, g·silu_out r 2a w a | silu_backward(d, gate) r 2a w a
    //                                                  fused: read dout, gate, up, write dgate, dup = 5a
    out = {5 * a, 9 * a, 3};
    return true;
  }
  if (name == "softmax_crossentropy_forward") {
    // torchtitan's loss: cross_entropy(pred.flatten(0, 1).float(), labels)
    //   _to_copy c | _log_softmax r4 w4 | nll_loss_forward (one value a row)
    //                                                              fused: read logits, write probs = 2a
    out = {2 * a, c + 8, 2 + k};
    return true;
  }
  if (name == "softmax_crossentropy_backward") {
    // ones_like (the seed) | nll_loss_backward: a zeroed (N, V) f32 w4 with −1/N scattered |
    // _log_softmax_backward_data r8 w4 | _to_copy c                 fused: read probs, write dlogits = 2a
    out = {2 * a, 16 + c, 3 + k};
    return true;
  }
  if (name == "adamw_step") {
    // torch.optim.AdamW(foreach=True), torchtitan's default; _multi_tensor_adamw of PyTorch 2.x, one
    // multi-tensor kernel per line, per f32 parameter:
    //   steps += 1 (scalars) | params *= 1 − lr·wd r4 w4 | exp_avgs.lerp_(grads) r8 w4 | exp_avg_sqs *= β2 r4 w4 |
    //   exp_avg_sqs.addcmul_(grads, grads) r12 w4 | sqrt r4 w4 | / bias_correction2_sqrt r4 w4 | + eps r4 w4 |
    //   params.addcdiv_(exp_avgs, denom) r12 w4                   fused: r p g m v, w p m v = 28
    out = {28, 84, 9};
    return true;
  }
  return false;
}

}  // namespace

std::string eager_op_names() {
  std::string s;
  for (const Family& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

unsigned eager_ops_for(ModeledKernels kernels, const std::vector<std::string>& fused_ops) {
  unsigned ops = kernels == ModeledKernels::eager ? eager_op::all : kernels == ModeledKernels::compiled ? eager_op::loss | eager_op::adamw : 0;
  for (const std::string& name : fused_ops) {
    unsigned bit = 0;
    for (const Family& f : kFamilies)
      if (name == f.name) bit = f.bit;
    if (!bit) throw ConfigError("log.fused_ops: '" + name + "' is no op family with an eager chain", "name some of: " + eager_op_names());
    ops &= ~bit;
  }
  return ops;
}

KernelChain eager_chain(const std::string& name, double fused_bytes, int activation_bytes, unsigned eager_ops) {
  Chain ch;
  if (!(family_of(name) & eager_ops) || !chain_for(name, double(activation_bytes), ch)) return {fused_bytes, 1};
  const double elements = fused_bytes / ch.fused_per_element;
  return {elements * ch.eager_per_element, ch.launches};
}

}  // namespace distlab
