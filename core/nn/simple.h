// Layers without parameters: ReLU, GELU (tanh), Dropout, Flatten, MaxPool2d.
#pragma once
#include "core/nn/layer.h"

namespace distlab {

class ReLU : public Layer {
 public:
  std::string describe() const override { return "ReLU"; }
  Tensor forward(Runtime& rt, const Tensor& x) override;  // saves its output (x > 0 <=> out > 0)
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  void swap_saved(SavedState& s) override { s.swap(saved_out_); }

 private:
  Tensor saved_out_;
};

class GELU : public Layer {
 public:
  std::string describe() const override { return "GELU(tanh)"; }
  Tensor forward(Runtime& rt, const Tensor& x) override;
  // the forward computed elsewhere (Linear::forward_gelu's epilogue): x kept for backward, out returned
  Tensor adopt(const Tensor& x, const Tensor& out) {
    saved_x_ = x;
    return out;
  }
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  void swap_saved(SavedState& s) override { s.swap(saved_x_); }

 private:
  Tensor saved_x_;
};

// Inverted dropout. Each forward draws a fresh mask from (seed, call count), so runs are reproducible.
class Dropout : public Layer {
 public:
  Dropout(float p, uint64_t seed) : p_(p), seed_(seed) {}
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // identity in eval mode or when p == 0
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  uint64_t* rng_calls() override { return &calls_; }
  void swap_saved(SavedState& s) override { s.swap(mask_); }

 private:
  float p_;
  uint64_t seed_, calls_ = 0;
  Tensor mask_;
};

// (B, d1, d2, ...) -> (B, d1*d2*...), a view: no copy.
class Flatten : public Layer {
 public:
  std::string describe() const override { return "Flatten"; }
  Tensor forward(Runtime& rt, const Tensor& x) override;
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  void swap_saved(SavedState& s) override { s.swap(in_shape_); }

 private:
  Shape in_shape_;
};

class MaxPool2d : public Layer {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0) : k_(kernel), s_(stride ? stride : kernel) {}
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (B, C, H, W) -> (B, C, OH, OW)
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  void swap_saved(SavedState& s) override {
    s.swap(in_shape_);
    s.swap(argmax_);
  }

 private:
  int64_t k_, s_;
  Shape in_shape_;
  Tensor argmax_;  // i32 indices stored in an f32-sized buffer (same width)
};

}  // namespace distlab
