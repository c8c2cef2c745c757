// A layer with explicit forward and backward. forward saves what backward needs (as activations, counted by
// the rank's accountant); backward consumes it, accumulates parameter gradients (+=, so accumulation over
// micro-batches and tied weights just work), and returns the gradient of its input.
#pragma once
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/runtime.h"
#include "core/util/rng.h"

namespace distlab {

// What a forward saved for its backward, moved out of the layers and back in: pipeline parallelism keeps
// one per micro-batch in flight (core/parallel/pipeline.h), as autograd keeps a graph per micro-batch.
// Layers visit their saved members in a fixed order; swapping twice restores both sides.
struct SavedState {
  std::vector<Tensor> tensors;
  std::vector<std::vector<int64_t>> ints;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::shared_ptr<void>> handles;  // what else a layer keeps (a device copy of its ids)
  void begin() { t_ = i_ = k_ = h_ = 0; }  // before each visit
  void swap(Tensor& x) { std::swap(slot(tensors, t_), x); }
  void swap(std::vector<int64_t>& v) { std::swap(slot(ints, i_), v); }
  void swap(std::vector<int32_t>& v) { std::swap(slot(tokens, k_), v); }
  template <class T>
  void swap(std::shared_ptr<T>& h) {
    std::shared_ptr<void>& s = slot(handles, h_);
    std::shared_ptr<void> mine = std::move(h);
    h = std::static_pointer_cast<T>(std::move(s));
    s = std::move(mine);
  }
  void swap(int64_t& v) {
    auto& s = slot(ints, i_);
    const int64_t mine = s.empty() ? 0 : s[0];
    s = {v};
    v = mine;
  }
  void swap(double& v) {  // kept as its bits
    int64_t bits;
    std::memcpy(&bits, &v, sizeof v);
    swap(bits);
    std::memcpy(&v, &bits, sizeof v);
  }
  int64_t bytes() const;  // the saved tensors' bytes (what a micro-batch in flight holds)

 private:
  template <class T>
  T& slot(std::vector<T>& v, size_t& at) {
    if (at == v.size()) v.emplace_back();
    return v[at++];
  }
  size_t t_ = 0, i_ = 0, k_ = 0, h_ = 0;
};

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
  // Exchanges what the last forward saved for backward with `s` (SavedState above).
  virtual void swap_saved(SavedState& s) {}
  // Op-level selective checkpointing (core/models/llama.h): the recompute already has this layer's output
  // (it was kept), so the layer takes back only the input its backward reads, without running forward.
  virtual void keep_input(Runtime& rt, const Tensor& x);
  // The layers inside this one (nn.Module's children): an attention's projections, an MLP's linears.
  // Model::layers() and this reach every Linear, as PEFT's target_modules matching walks named_modules().
  virtual std::vector<Layer*> children() { return {}; }

 protected:
  bool training_ = true;
  bool needs_input_grad_ = true;
};

// model.train() / model.eval(): the layer and every layer inside it (children(), all the way down: a split
// attention's column-parallel layer's Linear holds LoRA's dropout)
inline void set_training_tree(Layer& l, bool on) {
  l.set_training(on);
  for (Layer* c : l.children()) set_training_tree(*c, on);
}

// Where a backward accumulates p's gradient: p.grad, or — p frozen (LoRA's base) — a zeroed scratch tensor
// that is dropped (a norm's weight: C values; the layers whose frozen weight costs a GEMM skip it instead)
Tensor grad_or_scratch(Runtime& rt, Parameter& p);
// Creates a parameter tensor on the rank's device.
Parameter make_parameter(Runtime& rt, const std::string& name, const Shape& shape, bool decay = true);
// U(-bound, bound) and N(0, std) fills (no-ops on meta).
void init_uniform(Tensor& t, Rng& rng, float bound);
void init_normal(Tensor& t, Rng& rng, float std);
// Throws ShapeError naming the layer when x doesn't have the expected trailing dimensions.
void expect_shape(const std::string& layer, const Tensor& x, const Shape& trailing);

}  // namespace distlab
