#include "core/ops/autocast.h"

#include <cstring>

namespace distlab {

static constexpr AutocastRule kTable[] = {
    {"matmul_forward", RunsIn::low, "GEMM on tensor cores; f32 accumulation keeps the long dot products exact enough"},
    {"matmul_backward", RunsIn::low, "two GEMMs (dX = dY·W, dW = dYᵀ·X), same as forward"},
    {"conv2d_forward", RunsIn::low, "im2col + GEMM"},
    {"conv2d_backward", RunsIn::low, "GEMMs"},
    {"attention_forward", RunsIn::low, "Q·Kᵀ and P·V are GEMMs; the softmax between them runs in f32 inside the kernel"},
    {"attention_backward", RunsIn::low, "GEMMs; the softmax's backward in f32 inside the kernel"},
    {"flash_attention_forward", RunsIn::low, "the tiles' Q·Kᵀ and P·V are GEMMs; the online softmax in f32 inside the kernel"},
    {"flash_attention_backward", RunsIn::low, "the tiles' GEMMs, the probabilities recomputed in f32 from lse"},
    {"flash_attention_block_forward", RunsIn::low, "ring attention's block (context parallel): flash's tiles against one rank's keys"},
    {"flash_attention_block_backward", RunsIn::low, "ring attention's block: flash's backward tiles from the whole row's lse"},
    {"attention_merge", RunsIn::fp32, "two blocks' outputs weighed by exp of their log-sum-exps"},
    {"attention_out_dot", RunsIn::fp32, "rowsum(dO * O) per head, a sum over the head's values"},
    {"softmax_crossentropy_forward", RunsIn::fp32, "exp/log of large logits and a sum over the vocabulary"},
    {"softmax_crossentropy_backward", RunsIn::fp32, "probabilities minus one-hot, from the f32 probabilities"},
    {"layernorm_forward", RunsIn::fp32, "mean and variance are sums over C values"},
    {"layernorm_backward", RunsIn::fp32, "sums over C and over rows for the weight's gradient"},
    {"batchnorm_stats", RunsIn::fp32, "sums over B·H·W values per channel"},
    {"batchnorm_apply", RunsIn::fp32, "uses the f32 statistics"},
    {"batchnorm_backward_reduce", RunsIn::fp32, "sums over B·H·W"},
    {"batchnorm_backward_apply", RunsIn::fp32, "uses the f32 sums"},
    {"grad_norm", RunsIn::fp32, "a sum of squares over every parameter (in double)"},
    {"sgd_step", RunsIn::fp32, "updates the f32 master weights"},
    {"adamw_step", RunsIn::fp32, "the master weights and both moments are f32"},
    {"relu_forward", RunsIn::input, "pointwise"},
    {"relu_backward", RunsIn::input, "pointwise"},
    {"gelu_forward", RunsIn::input, "pointwise"},
    {"gelu_backward", RunsIn::input, "pointwise"},
    {"dropout_forward", RunsIn::input, "pointwise"},
    {"dropout_backward", RunsIn::input, "pointwise"},
    {"add", RunsIn::input, "the residual stream's sum"},
    {"accumulate", RunsIn::input, "the residual's gradient"},
    {"maxpool2d_forward", RunsIn::input, "a max is exact in any dtype"},
    {"maxpool2d_backward", RunsIn::input, "routes gradients"},
    {"embedding_forward", RunsIn::input, "a row lookup (+ position): the weights' dtype"},
    {"embedding_backward", RunsIn::input, "scatter-add into the weights' gradient"},
};

std::span<const AutocastRule> autocast_table() { return kTable; }

RunsIn autocast_rule(const char* op) {
  for (const auto& r : kTable)
    if (std::strcmp(r.op, op) == 0) return r.runs_in;
  return RunsIn::input;
}

}  // namespace distlab
