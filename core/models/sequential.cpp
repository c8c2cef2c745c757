#include "core/models/sequential.h"

#include "core/nn/norm.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
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

std::vector<Layer*> Sequential::layers() {
  std::vector<Layer*> v;
  for (auto& l : layers_) v.push_back(l.get());
  return v;
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
  if (whole_) {  // a pipeline stage: the whole model's draws, this stage's layers' share of them
    for (Parameter* p : parameters())
      if (!p->data.data()) return;  // meta: nothing to draw
    Runtime side(DeviceKind::cpu);  // f32, its own accountant: the whole model lives only for this call
    auto whole = whole_(side);
    whole->init(seed);
    std::map<std::string, Parameter*> params;
    std::map<std::string, Buffer*> bufs;
    for (Parameter* p : whole->parameters()) params[p->name] = p;
    for (Buffer* b : whole->buffers()) bufs[b->name] = b;
    for (Parameter* p : parameters())
      p->data.copy_from(params.at(p->name)->data);  // rounded to the stage's dtype, onto its device
    for (Buffer* b : buffers()) b->data.copy_from(bufs.at(b->name)->data);
    return;
  }
  Rng rng(seed);
  for (auto& l : layers_) l->init(rng);
}

void Sequential::keep_stage(int stage, int stages, const std::vector<int64_t>& units,
                            std::function<std::unique_ptr<Sequential>(Runtime&)> whole, const Shape& sample) {
  // the layers with parameters, and their sizes
  std::vector<size_t> unit_layer;
  std::vector<int64_t> size;
  for (size_t i = 0; i < layers_.size(); i++) {
    int64_t n = 0;
    for (Parameter* p : layers_[i]->parameters()) n += p->data.numel();
    if (n > 0) unit_layer.push_back(i), size.push_back(n);
  }
  const int n = int(unit_layer.size());
  if (n < stages)
    throw ConfigError(fmt::format("parallel.pp {}: the model has {} layers with parameters, fewer than the stages", stages, n),
                      "lower parallel.pp: every stage needs a layer with parameters");
  // first unit of each stage: explicit, or the split that minimises the largest stage's parameters
  std::vector<int> first(size_t(stages) + 1, n);
  if (!units.empty()) {
    int64_t sum = 0;
    for (int64_t u : units) sum += u;
    if (int(units.size()) != stages || sum != n || std::any_of(units.begin(), units.end(), [](int64_t u) { return u < 1; }))
      throw ConfigError(fmt::format("parallel.pp_layers has {} entries summing to {}: {} stages of the model's {} layers with parameters",
                                    units.size(), sum, stages, n),
                        "give every stage at least one layer with parameters, and each to some stage");
    first[0] = 0;
    for (int s = 1; s <= stages; s++) first[size_t(s)] = first[size_t(s - 1)] + int(units[size_t(s - 1)]);
  } else {
    // the linear partition: best[k][i] = the smallest largest-stage for units [0, i) in k stages, O(p·n²)
    std::vector<int64_t> prefix(size_t(n) + 1, 0);
    for (int u = 0; u < n; u++) prefix[size_t(u) + 1] = prefix[size_t(u)] + size[size_t(u)];
    const int64_t inf = INT64_MAX;
    std::vector<std::vector<int64_t>> best(size_t(stages) + 1, std::vector<int64_t>(size_t(n) + 1, inf));
    std::vector<std::vector<int>> from(size_t(stages) + 1, std::vector<int>(size_t(n) + 1, 0));
    best[0][0] = 0;
    for (int k = 1; k <= stages; k++)
      for (int i = k; i <= n; i++)
        for (int j = k - 1; j < i; j++) {
          if (best[size_t(k - 1)][size_t(j)] == inf) continue;
          const int64_t worst = std::max(best[size_t(k - 1)][size_t(j)], prefix[size_t(i)] - prefix[size_t(j)]);
          if (worst < best[size_t(k)][size_t(i)]) best[size_t(k)][size_t(i)] = worst, from[size_t(k)][size_t(i)] = j;
        }
    first[size_t(stages)] = n;
    for (int k = stages, i = n; k > 0; k--) i = first[size_t(k - 1)] = from[size_t(k)][size_t(i)];
  }
  // this stage's layers: from its first unit's layer (stage 0: from layer 0) to the next stage's first unit's
  const size_t begin = stage == 0 ? 0 : unit_layer[size_t(first[size_t(stage)])];
  const size_t end = stage == stages - 1 ? layers_.size() : unit_layer[size_t(first[size_t(stage) + 1])];
  // the shapes at the boundaries: a meta pass of one sample through the whole model
  Runtime meta(DeviceKind::meta);
  auto shapes = whole(meta);
  Shape in = sample;
  in.insert(in.begin(), 1);
  Tensor x = meta.empty(in, Category::activations, "sample");
  for (size_t i = 0; i < shapes->layers_.size(); i++) {
    if (i == begin) in_sample_ = Shape(x.shape().begin() + 1, x.shape().end());
    x = shapes->layers_[i]->forward(meta, x);
    if (i + 1 == end) out_sample_ = Shape(x.shape().begin() + 1, x.shape().end());
  }
  std::vector<std::unique_ptr<Layer>> kept;
  for (size_t i = begin; i < end; i++) kept.push_back(std::move(layers_[i]));
  layers_ = std::move(kept);
  stage_ = stage;
  stages_ = stages;
  whole_ = std::move(whole);
}

Shape Sequential::stage_input_shape(const Batch& b) {
  Shape s = in_sample_;
  s.insert(s.begin(), b.B);
  return s;
}

Shape Sequential::stage_output_shape(const Batch& b) {
  Shape s = out_sample_;
  s.insert(s.begin(), b.B);
  return s;
}

Tensor Sequential::forward_stage(Runtime& rt, const Batch& batch, const Tensor& input, ForwardHook* hook) {
  Batch b;
  b.B = batch.B;
  b.x = stage_ == 0 ? batch.x : input;
  return forward(rt, b, hook);
}

Tensor Sequential::backward_stage(Runtime& rt, const Tensor& dout, BackwardHook* hook) {
  Tensor d = dout;
  int unit = int(units().size());
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& l = *layers_[i];
    if (!d.defined()) break;  // the first layer with parameters skipped the data's gradient (stage 0)
    const bool has_params = !l.parameters().empty();
    unit -= has_params;
    if (hook && has_params) hook->before_layer_backward(unit);
    d = l.backward(rt, d);
    if (hook && has_params) hook->after_layer_backward(unit, l.parameters());
  }
  return stage_ == 0 ? Tensor() : d;
}

void Sequential::swap_saved(SavedState& s) {
  s.begin();
  for (auto& l : layers_) l->swap_saved(s);
}

}  // namespace distlab

namespace distlab {

void Sequential::set_sync_batchnorm(ProcessGroup* pg) {
  for (auto& l : layers_)
    if (auto* bn = dynamic_cast<BatchNorm2d*>(l.get())) bn->set_sync_group(pg);
}

}  // namespace distlab
