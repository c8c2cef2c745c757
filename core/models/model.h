// The model interface. Backward is the forward read in reverse, as explicit calls; after each unit's
// backward (a layer, or a transformer block) the model calls hook->after_layer_backward(unit, params) —
// and before it, hook->before_layer_backward(unit); around each unit's forward, before_forward(unit) and
// after_forward(unit). after_layer_backward is the one place a parallel strategy (DDP buckets, ZeRO/FSDP
// reduce-scatter) learns a unit's gradients are complete. Nothing else decides when gradients sync.
// Read next: core/parallel/strategy.h (the hooks' other side).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/data/batch.h"
#include "core/nn/layer.h"
#include "core/tensor/runtime.h"

namespace distlab {

class ProcessGroup;

struct BackwardHook {
  virtual ~BackwardHook() = default;
  // Called once per unit, in reverse order of the forward, right after the unit's gradients are final.
  virtual void after_layer_backward(int unit, const std::vector<Parameter*>& params) = 0;
  // Called once per unit, in the same order, right before the unit's backward reads its parameters
  // (ZeRO-3 and FSDP gather them again here).
  virtual void before_layer_backward(int unit) {}
};

struct ForwardHook {
  virtual ~ForwardHook() = default;
  // Called once per unit, in order, right before the unit's forward uses its parameters.
  virtual void before_forward(int unit) = 0;
  // Called once per unit when its forward is over: its parameters are not read again until its backward
  // (ZeRO-3 and FSDP may free them). A unit whose parameters serve twice (GPT's tied embedding, also the
  // lm_head) ends its forward after its last use.
  virtual void after_forward(int unit) {}
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string describe() const = 0;              // one line per layer
  virtual std::vector<Parameter*> parameters() = 0;      // PyTorch's order (model.named_parameters())
  // BatchNorm statistics, QLoRA's 4-bit constants: every layer's (layers(), then Layer::children()), in order
  virtual std::vector<Buffer*> buffers();
  // Units in forward order: the parameter groups that become ready together during backward.
  virtual std::vector<std::vector<Parameter*>> units() = 0;
  // logits (N, classes); `hook` (a parallel strategy) hears before each unit (units(), in order)
  virtual Tensor forward(Runtime& rt, const Batch& batch, ForwardHook* hook = nullptr) = 0;
  virtual void backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) = 0;
  virtual void set_training(bool on) = 0;
  virtual void init(uint64_t seed) = 0;  // deterministic: same seed, same weights
  // Turns every BatchNorm into SyncBatchNorm over `pg` (nullptr turns it back); models without BatchNorm
  // have nothing to do.
  virtual void set_sync_batchnorm(ProcessGroup* pg) {}
  // Every random stream's position (each Dropout's draws so far), in a fixed order: what a checkpoint
  // saves of the model besides its tensors.
  virtual std::vector<uint64_t*> rng_streams() { return {}; }
  // Tensor parallel (core/parallel/gpt_parallel.h): the group the model's layers are split over (nullptr: the model is whole).
  // Its logits are then this rank's columns [vocab_first(), vocab_first() + V/t) of the vocabulary, and
  // the loss must be the vocab-parallel one over this group.
  virtual ProcessGroup* tp_group() { return nullptr; }
  virtual int64_t vocab_first() const { return 0; }
  // Pipeline parallel (core/parallel/pipeline.h): a model built as one stage of several runs its units on
  // what the stage before sent (`input`; the first stage reads the batch's tokens) and returns what it
  // sends on (the last stage: the logits); backward_stage takes the gradient of that and returns the
  // gradient of `input` (undefined on the first stage). swap_saved exchanges what the forward saved for
  // the backward, so several micro-batches can be in flight. A whole model is its own only stage.
  virtual Tensor forward_stage(Runtime& rt, const Batch& batch, const Tensor& input, ForwardHook* hook);
  virtual Tensor backward_stage(Runtime& rt, const Tensor& dout, BackwardHook* hook);
  virtual void swap_saved(SavedState& s);
  // The shapes crossing a stage's boundaries for `batch`: what it receives, what it sends on.
  virtual Shape stage_input_shape(const Batch& batch);
  virtual Shape stage_output_shape(const Batch& batch);
  // The model's layers (nn.Module's top-level children; Layer::children() goes deeper): how LoRA finds the
  // Linears to adapt (core/nn/lora.h)
  virtual std::vector<Layer*> layers() { return {}; }
  int64_t num_parameters();  // a 4-bit weight counts its own shape (core/nn/qlora.h: parameter_count)
  void zero_grad();                      // releases gradients (set_to_none=True)
};

}  // namespace distlab
