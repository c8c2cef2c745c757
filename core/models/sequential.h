// A stack of layers applied in order, with the backward loop written out: the MLP and the CIFAR CNN.
#pragma once
#include "core/models/model.h"
#include "core/nn/layer.h"

namespace distlab {

class Sequential : public Model {
 public:
  std::string describe() const override;
  std::vector<Parameter*> parameters() override;
  std::vector<Buffer*> buffers() override;
  std::vector<std::vector<Parameter*>> units() override;  // one per layer that has parameters
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

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace distlab
