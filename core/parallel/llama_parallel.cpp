#include "core/parallel/llama_parallel.h"

namespace distlab {

InputGather TensorParallelLlamaLayers::gather(const std::string& what) {
  if (!stream_.on()) return nullptr;
  return [this, what](Runtime& rt, const Tensor& rows) { return stream_.whole(rt, rows, what); };
}

InputGradSum TensorParallelLlamaLayers::input_grad_sum(const std::string& what) {
  return [this, what](Runtime& r, Tensor& dx) { stream_.sum(r, dx, "grad of " + what); };
}

std::unique_ptr<LlamaAttention> TensorParallelLlamaLayers::attention(Runtime& rt, const std::string& prefix, const ModelSpec& s,
                                                                     AttentionCore core) {
  ProcessGroup& tp = tp_;
  auto a = std::make_unique<LlamaAttention>(rt, prefix, s.n_embd, s.n_head, llama_kv_heads(s), s.rope_theta, core, tp.size(),
                                            std::make_unique<RowParallelLinear>(rt, tp, prefix + ".o_proj", s.n_embd, s.n_embd, false,
                                                                                stream_.sp()),
                                            input_grad_sum(prefix + "'s input"), gather(prefix + "'s input"));
  for (Linear* l : {&a->q_proj, &a->k_proj, &a->v_proj}) l->tp = tp_slice(tp, 0, 1);  // their heads: W's rows
  return a;
}

std::unique_ptr<LlamaMLP> TensorParallelLlamaLayers::mlp(Runtime& rt, const std::string& prefix, const ModelSpec& s) {
  ProcessGroup& tp = tp_;
  const int64_t I = llama_intermediate(s);
  auto m = std::make_unique<LlamaMLP>(rt, prefix, s.n_embd, I, tp.size(),
                                      std::make_unique<RowParallelLinear>(rt, tp, prefix + ".down_proj", I, s.n_embd, false, stream_.sp()),
                                      input_grad_sum(prefix + "'s input"), gather(prefix + "'s input"));
  for (Linear* l : {&m->gate_proj, &m->up_proj}) l->tp = tp_slice(tp, 0, 1);
  return m;
}

}  // namespace distlab
