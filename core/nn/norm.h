// nn.LayerNorm over the last dimension, and nn.BatchNorm2d (train: batch statistics and running averages;
// eval: running statistics).
#pragma once
#include "core/nn/layer.h"

namespace distlab {

class LayerNorm : public Layer {
 public:
  LayerNorm(Runtime& rt, const std::string& prefix, int64_t C, float eps = 1e-5f);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (..., C) -> (..., C)
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override { return {&weight, &bias}; }
  void init(Rng& rng) override;  // weight 1, bias 0
  void swap_saved(SavedState& s) override {
    s.swap(saved_x_);
    s.swap(mean_);
    s.swap(rstd_);
  }
  Parameter weight, bias;        // (C), (C)

 private:
  int64_t C_;
  float eps_;
  Tensor saved_x_, mean_, rstd_;
};

class ProcessGroup;

// With sync_group set it is SyncBatchNorm: the batch statistics (and backward's sums) cover every rank's
// micro-batch, so N ranks of B samples normalize exactly as one device with N·B samples.
class BatchNorm2d : public Layer {
 public:
  BatchNorm2d(Runtime& rt, const std::string& prefix, int64_t C, float eps = 1e-5f, float momentum = 0.1f);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (B, C, H, W) -> same
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override { return {&weight, &bias}; }
  std::vector<Buffer*> buffers() override { return {&running_mean, &running_var, &num_batches_tracked}; }
  void init(Rng& rng) override;  // weight 1, bias 0, running mean 0, var 1
  Parameter weight, bias;        // (C), (C)
  Buffer running_mean, running_var;  // (C); the variance kept is the unbiased one, as PyTorch
  Buffer num_batches_tracked;        // () — an integer count in PyTorch, kept here as a float scalar
  void set_sync_group(ProcessGroup* pg) { sync_ = pg; }
  void swap_saved(SavedState& s) override {
    s.swap(saved_x_);
    s.swap(mean_);
    s.swap(rstd_);
    s.swap(count_);
  }

 private:
  // global mean and biased variance (C) from every rank's local ones (Chan's parallel combination)
  double sync_statistics(Runtime& rt, float* mean, float* var, int64_t local_count);
  ProcessGroup* sync_ = nullptr;
  int64_t C_;
  float eps_, momentum_;
  double count_ = 0;  // values per channel behind the statistics (all ranks' under SyncBatchNorm)
  Tensor saved_x_, mean_, rstd_;
};

}  // namespace distlab
