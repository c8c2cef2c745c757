// The table of CUDA kernels a cuda rank's Runtime points at (rt.kernels, core/ops/kernels.h): the cpu
// kernels forward each call here. A kernel missing from core/ops/cuda would fail to compile here.
#include "core/ops/cuda/ops.h"

namespace distlab::cuda {

const Kernels& kernel_table() {
  static const Kernels k = [] {
    Kernels t{};
    t.device = "cuda";
    t.relu_forward = &cuda::relu_forward;
    t.relu_backward = &cuda::relu_backward;
    t.gelu_forward = &cuda::gelu_forward;
    t.gelu_backward = &cuda::gelu_backward;
    t.gelu_forward_16 = &cuda::gelu_forward_16;
    t.gelu_backward_16 = &cuda::gelu_backward_16;
    t.add_16 = &cuda::add_16;
    t.accumulate_16 = &cuda::accumulate_16;
    t.dropout_forward = &cuda::dropout_forward;
    t.dropout_backward = &cuda::dropout_backward;
    t.add_forward = &cuda::add_forward;
    t.accumulate = &cuda::accumulate;
    t.maxpool2d_forward = &cuda::maxpool2d_forward;
    t.maxpool2d_backward = &cuda::maxpool2d_backward;
    t.matmul_forward = &cuda::matmul_forward;
    t.linear_forward_16 = &cuda::linear_forward_16;
    t.linear_backward_16 = &cuda::linear_backward_16;
    t.linear_gelu_forward_16 = &cuda::linear_gelu_forward_16;
    t.matmul_backward = &cuda::matmul_backward;
    t.bias_forward = &cuda::bias_forward;
    t.bias_backward = &cuda::bias_backward;
    t.gemm = &cuda::gemm;
    t.conv2d_forward = &cuda::conv2d_forward;
    t.conv2d_backward = &cuda::conv2d_backward;
    t.layernorm_forward = &cuda::layernorm_forward;
    t.layernorm_forward_16 = &cuda::layernorm_forward_16;
    t.layernorm_backward = &cuda::layernorm_backward;
    t.layernorm_backward_16 = &cuda::layernorm_backward_16;
    t.batchnorm_stats = &cuda::batchnorm_stats;
    t.batchnorm_apply = &cuda::batchnorm_apply;
    t.batchnorm_backward_reduce = &cuda::batchnorm_backward_reduce;
    t.batchnorm_backward_apply = &cuda::batchnorm_backward_apply;
    t.softmax_crossentropy_forward = &cuda::softmax_crossentropy_forward;
    t.softmax_crossentropy_backward = &cuda::softmax_crossentropy_backward;
    t.softmax_crossentropy_forward_16 = &cuda::softmax_crossentropy_forward_16;
    t.softmax_crossentropy_backward_16 = &cuda::softmax_crossentropy_backward_16;
    t.vocab_ce_max = &cuda::vocab_ce_max;
    t.vocab_ce_exp = &cuda::vocab_ce_exp;
    t.vocab_ce_finish = &cuda::vocab_ce_finish;
    t.attention_forward = &cuda::attention_forward;
    t.attention_backward = &cuda::attention_backward;
    t.flash_attention_forward = &cuda::flash_attention_forward;
    t.flash_attention_backward = &cuda::flash_attention_backward;
    t.flash_attention_forward_16 = &cuda::flash_attention_forward_16;
    t.flash_attention_backward_16 = &cuda::flash_attention_backward_16;
    t.rmsnorm_forward = &cuda::rmsnorm_forward;
    t.rmsnorm_backward = &cuda::rmsnorm_backward;
    t.rope_apply = &cuda::rope_apply;
    t.rmsnorm_forward_16 = &cuda::rmsnorm_forward_16;
    t.rmsnorm_backward_16 = &cuda::rmsnorm_backward_16;
    t.swiglu_forward_16 = &cuda::swiglu_forward_16;
    t.swiglu_backward_16 = &cuda::swiglu_backward_16;
    t.rope_repeat_kv_forward_16 = &cuda::rope_repeat_kv_forward_16;
    t.rope_repeat_kv_backward_16 = &cuda::rope_repeat_kv_backward_16;
    t.swiglu_forward = &cuda::swiglu_forward;
    t.swiglu_backward = &cuda::swiglu_backward;
    t.repeat_kv_forward = &cuda::repeat_kv_forward;
    t.repeat_kv_backward = &cuda::repeat_kv_backward;
    t.embedding_forward = &cuda::embedding_forward;
    t.embedding_forward_16 = &cuda::embedding_forward_16;
    t.embedding_backward = &cuda::embedding_backward;
    t.sgd_update = &cuda::sgd_update;
    t.adamw_update = &cuda::adamw_update;
    t.adamw_update_many = &cuda::adamw_update_many;
    t.sum_squares = &cuda::sum_squares;
    t.scale = &cuda::scale;
    t.all_finite = &cuda::all_finite;
    t.sum_squares_into = &cuda::sum_squares_into;
    t.flag_nonfinite = &cuda::flag_nonfinite;
    t.clip_factor = &cuda::clip_factor;
    t.dequantize_nf4 = &cuda::dequantize_nf4;
    return t;
  }();
  return k;
}

}  // namespace distlab::cuda
