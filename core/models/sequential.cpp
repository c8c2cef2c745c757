#include "core/models/sequential.h"

#include "core/nn/norm.h"
#include "core/util/error.h"

namespace distlab {

std::string Sequential::describe() const {
  std::string s;
  for (size_t i = 0; i < layers_.size(); i++) s += "  (" + std::to_string(i) + ") " + layers_[i]->describe() + "\n";
  return s;
}

std::vector<Parameter*> Sequential::parameters() {
  std::vector<Parameter*> ps;
  for (auto& l : layers_)
    for (auto* p : l->parameters()) ps.push_back(p);
  return ps;
}

std::vector<Buffer*> Sequential::buffers() {
  std::vector<Buffer*> bs;
  for (auto& l : layers_)
    for (auto* b : l->buffers()) bs.push_back(b);
  return bs;
}

std::vector<std::vector<Parameter*>> Sequential::units() {
  std::vector<std::vector<Parameter*>> u;
  for (auto& l : layers_)
    if (!l->parameters().empty()) u.push_back(l->parameters());
  return u;
}

Tensor Sequential::forward(Runtime& rt, const Batch& batch, ForwardHook* hook) {
  DL_ASSERT(batch.x.defined(), "an image model got a batch without images");
  Tensor h = batch.x;
  int unit = 0;
  for (auto& l : layers_) {
    const bool has_params = !l->parameters().empty();
    if (hook && has_params) hook->before_forward(unit);
    h = l->forward(rt, h);
    if (hook && has_params) hook->after_forward(unit);
    unit += has_params;
  }
  return h;
}

void Sequential::backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) {
  Tensor d = dlogits;
  int unit = int(units().size());
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& l = *layers_[i];
    if (!d.defined()) {  // the first layer with parameters skipped the data's gradient: nothing flows further
      DL_ASSERT(l.parameters().empty(), "a layer with parameters lies before the one that skipped its input gradient");
      continue;
    }
    const bool has_params = !l.parameters().empty();
    unit -= has_params;
    if (hook && has_params) hook->before_layer_backward(unit);
    d = l.backward(rt, d);
    if (hook && has_params) hook->after_layer_backward(unit, l.parameters());
  }
}

void Sequential::set_training(bool on) {
  for (auto& l : layers_) l->set_training(on);
}

void Sequential::init(uint64_t seed) {
  Rng rng(seed);
  for (auto& l : layers_) l->init(rng);
}

}  // namespace distlab

namespace distlab {

void Sequential::set_sync_batchnorm(ProcessGroup* pg) {
  for (auto& l : layers_)
    if (auto* bn = dynamic_cast<BatchNorm2d*>(l.get())) bn->set_sync_group(pg);
}

}  // namespace distlab
