#include "core/parallel/gpt_parallel.h"

#include <fmt/format.h>

#include "core/parallel/llama_parallel.h"
#include "core/models/zoo.h"
#include "core/util/error.h"

namespace distlab {

std::unique_ptr<Layer> TensorParallelLayers::attention(Runtime& rt, const std::string& prefix, int64_t C, int64_t n_head, AttentionCore core) {
  return std::make_unique<ParallelSelfAttention>(rt, tp_, prefix, C, n_head, core, sp());
}
std::unique_ptr<Layer> TensorParallelLayers::mlp_up(Runtime& rt, const std::string& prefix, int64_t C, int64_t hidden) {
  return std::make_unique<ColumnParallelLinear>(rt, tp_, prefix, C, hidden, true, 1, sp());
}
std::unique_ptr<Layer> TensorParallelLayers::mlp_down(Runtime& rt, const std::string& prefix, int64_t hidden, int64_t C) {
  return std::make_unique<RowParallelLinear>(rt, tp_, prefix, hidden, C, true, sp());
}
std::unique_ptr<TokenEmbedding> TensorParallelLayers::embedding(Runtime& rt, const std::string& prefix, int64_t vocab, int64_t block, int64_t C) {
  return std::make_unique<VocabParallelEmbedding>(rt, tp_, prefix, vocab, block, C, sp());
}

void set_tp_kernels(GPT& gpt, TpKernels* k) {
  for (auto& b : gpt.blocks()) {
    auto* attn = dynamic_cast<ParallelSelfAttention*>(b->attn.get());
    auto* fc = dynamic_cast<ColumnParallelLinear*>(b->c_fc.get());
    auto* proj = dynamic_cast<RowParallelLinear*>(b->c_proj.get());
    DL_ASSERT(attn && fc && proj, "set_tp_kernels: a GPT whose blocks are not split (build it with TensorParallelLayers)");
    attn->c_attn.set_kernels(k);
    attn->c_proj.set_kernels(k);
    fc->set_kernels(k);
    proj->set_kernels(k);
  }
  auto* layers = dynamic_cast<TensorParallelLayers*>(&gpt.split_layers());
  DL_ASSERT(layers, "set_tp_kernels: a GPT not built from TensorParallelLayers");
  layers->set_kernels(k);
}

std::unique_ptr<Model> build_split_model(Runtime& rt, const ModelSpec& s, ProcessGroup* tp, int stage, int stages,
                                         const std::vector<int64_t>& layers) {
  if (stages > 1 && (s.name == "mlp" || s.name == "cifar_cnn")) return build_sequential_stage(rt, s, stage, stages, layers);
  if ((tp && tp->size() > 1) || stages > 1) {
    DL_ASSERT(tp, "build_split_model: a split model needs its (tensor-parallel) group, even of one rank");
    if (s.name == "gpt")
      return std::make_unique<GPT>(rt, s, stage, stages, layers, std::make_unique<TensorParallelLayers>(*tp, s.sequence_parallel));
    if (s.name == "llama")
      return std::make_unique<Llama>(rt, s, stage, stages, layers, std::make_unique<TensorParallelLlamaLayers>(*tp, s.sequence_parallel));
    throw ConfigError(fmt::format("parallel.tp {} with model.name {}: tensor parallel splits GPT's attention heads, MLP and vocabulary",
                                  tp->size(), s.name),
                      "use model.name = \"gpt\", or split the data instead (parallel.tp = 1)");
  }
  return build_model(rt, s);
}

}  // namespace distlab
