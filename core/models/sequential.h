// A stack of layers applied in order, with the backward loop written out: the MLP and the CIFAR CNN.
#pragma once
#include <functional>

#include "core/models/model.h"
#include "core/nn/layer.h"

namespace distlab {

class Sequential : public Model {
 public:
  std::string describe() const override;
  std::vector<Parameter*> parameters() override;
  std::vector<Buffer*> buffers() override;
  std::vector<std::vector<Parameter*>> units() override;  // one per layer that has parameters
  std::vector<Layer*> layers() override;
  Tensor forward(Runtime& rt, const Batch& batch, ForwardHook* hook = nullptr) override;  // batch.x (B, ...) -> (B, classes)
  void backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) override;
  void set_training(bool on) override;
  void init(uint64_t seed) override;
  void set_sync_batchnorm(ProcessGroup* pg) override;
  std::vector<uint64_t*> rng_streams() override {
    std::vector<uint64_t*> v;
    for (auto& l : layers_)
      if (uint64_t* c = l->rng_calls()) v.push_back(c);
    return v;
  }
  void add(std::unique_ptr<Layer> layer) { layers_.push_back(std::move(layer)); }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  // Pipeline parallel (core/parallel/pipeline.h): keeps only stage `stage` of `stages` — consecutive layers,
  // the split between layers with parameters chosen to balance the stages' parameters (`units`: how many
  // layers with parameters each stage holds, explicit), a parameterless layer staying with the one before
  // it. `whole` builds the whole model again (init draws the whole model's weights and keeps this stage's,
  // so every split starts where one rank starts); `sample` is one input's shape, (C, H, W).
  void keep_stage(int stage, int stages, const std::vector<int64_t>& units, std::function<std::unique_ptr<Sequential>(Runtime&)> whole,
                  const Shape& sample);
  Tensor forward_stage(Runtime& rt, const Batch& batch, const Tensor& input, ForwardHook* hook) override;
  Tensor backward_stage(Runtime& rt, const Tensor& dout, BackwardHook* hook) override;
  void swap_saved(SavedState& s) override;
  Shape stage_input_shape(const Batch& b) override;
  Shape stage_output_shape(const Batch& b) override;

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
  int stage_ = 0, stages_ = 1;
  Shape in_sample_, out_sample_;  // per sample: what this stage receives and sends on
  std::function<std::unique_ptr<Sequential>(Runtime&)> whole_;
};

}  // namespace distlab
