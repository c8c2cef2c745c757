// Which ops run in 16 bits and which in f32 under mixed precision ([precision] mode = "bf16" | "fp16"):
// PyTorch's autocast lists, written down as one table (autocast.cpp). Read it with core/tensor/as_f32.h,
// which does the rounding, and core/optim/grad_scaler.h, which keeps fp16's gradients in range.
//
//   low    matmul, conv, attention: 16-bit inputs, products accumulated in f32, the result rounded to 16 bits
//          (tensor cores). The cost model times them at the profile's bf16/fp16 FLOP rate.
//   fp32   softmax + cross-entropy, layer/batch norm, the gradient norm, the optimizer step: sums over many
//          values and exp/log, where 8 or 11 bits of mantissa (or fp16's 65504 ceiling) would lose the
//          answer. They read 16-bit inputs, compute in f32 and round only what they hand on.
//   input  pointwise ops (relu, gelu, add, dropout, max-pool, embedding lookup): the result is computed in
//          f32 and stored in the input's dtype, as PyTorch runs ops that are on neither list.
//
// Everything an op saves for backward is stored in the dtype it was handed on in, so the memory report
// shows the activations halved; the statistics norms keep (mean, rstd: one value per row) stay f32.
#pragma once
#include <span>

namespace distlab {

enum class RunsIn { low, fp32, input };

struct AutocastRule {
  const char* op;    // the kernel's name, as in the trace ("matmul_forward")
  RunsIn runs_in;
  const char* why;
};

std::span<const AutocastRule> autocast_table();
// The rule for a kernel's name; RunsIn::input for a name the table doesn't list.
RunsIn autocast_rule(const char* op);

}  // namespace distlab
