#include "core/models/model.h"

#include "core/nn/qlora.h"
#include "core/util/error.h"

namespace distlab {

int64_t Model::num_parameters() {
  int64_t n = 0;
  for (auto* p : parameters()) n += parameter_count(*p);
  return n;
}

static void collect_buffers(Layer* l, std::vector<Buffer*>& out) {
  for (Buffer* b : l->buffers()) out.push_back(b);
  for (Layer* c : l->children()) collect_buffers(c, out);
}

std::vector<Buffer*> Model::buffers() {
  std::vector<Buffer*> out;
  for (Layer* l : layers()) collect_buffers(l, out);
  return out;
}

void Model::zero_grad() {
  for (auto* p : parameters()) p->grad = Tensor();
}

}  // namespace distlab

namespace distlab {

Tensor Model::forward_stage(Runtime&, const Batch&, const Tensor&, ForwardHook*) {
  throw ConfigError("this model cannot be split into pipeline stages", "parallel.pp > 1 splits GPT (model.name = \"gpt\")");
}

Tensor Model::backward_stage(Runtime&, const Tensor&, BackwardHook*) {
  throw ConfigError("this model cannot be split into pipeline stages", "parallel.pp > 1 splits GPT (model.name = \"gpt\")");
}

Shape Model::stage_input_shape(const Batch&) {
  throw ConfigError("this model cannot be split into pipeline stages", "parallel.pp > 1 splits GPT and the image models");
}

Shape Model::stage_output_shape(const Batch&) {
  throw ConfigError("this model cannot be split into pipeline stages", "parallel.pp > 1 splits GPT and the image models");
}

void Model::swap_saved(SavedState&) {
  throw ConfigError("this model cannot keep several micro-batches in flight", "parallel.pp > 1 splits GPT (model.name = \"gpt\")");
}

}  // namespace distlab
