// A layer with explicit forward and backward. forward saves what backward needs (as activations, counted by
// the rank's accountant); backward consumes it, accumulates parameter gradients (+=, so accumulation over
// micro-batches and tied weights just work), and returns the gradient of its input.
#pragma once
#include <string>
#include <vector>

#include "core/tensor/runtime.h"
#include "core/util/rng.h"

namespace distlab {

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string describe() const = 0;                          // "Linear(784 -> 256)"
  virtual Tensor forward(Runtime& rt, const Tensor& x) = 0;
  virtual Tensor backward(Runtime& rt, const Tensor& dout) = 0;      // returns dx; releases saved tensors
  virtual std::vector<Parameter*> parameters() { return {}; }
  virtual std::vector<Buffer*> buffers() { return {}; }
  virtual void init(Rng& rng) {}                                     // PyTorch's default initialization
  virtual void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }
  // The first layer of a model needn't compute the gradient of the data: backward then returns an empty
  // tensor (PyTorch skips it the same way, since the input doesn't require grad).
  void set_needs_input_grad(bool on) { needs_input_grad_ = on; }
  // A layer that draws random numbers (Dropout) counts its draws: the count is its RNG stream's state,
  // which a checkpoint saves so that a resumed run draws the masks the uninterrupted one would.
  virtual uint64_t* rng_calls() { return nullptr; }

 protected:
  bool training_ = true;
  bool needs_input_grad_ = true;
};

// Creates a parameter tensor on the rank's device.
Parameter make_parameter(Runtime& rt, const std::string& name, const Shape& shape, bool decay = true);
// U(-bound, bound) and N(0, std) fills (no-ops on meta).
void init_uniform(Tensor& t, Rng& rng, float bound);
void init_normal(Tensor& t, Rng& rng, float std);
// Throws ShapeError naming the layer when x doesn't have the expected trailing dimensions.
void expect_shape(const std::string& layer, const Tensor& x, const Shape& trailing);

}  // namespace distlab
