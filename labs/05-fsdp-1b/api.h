// Lab 05: everything your fsdp.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your fsdp.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own beside the trainer, and decides WHEN: when each unit's parameters
// are gathered whole, when they go back to this rank's 1/N part, when its gradients are reduce-scattered.
// The trainer owns the data and the machinery — the shards, the all-gathers (asynchronous: they overlap
// compute), the reduce-scatters, the optimizer — and runs what you ask of it. It calls your four hooks
// around every unit's forward and backward, as PyTorch FSDP's pre/post forward and backward hooks.
#pragma once
#include <cstdint>
#include <vector>

namespace lab05 {

struct Options {
  bool reshard_after_forward = true;  // FULL_SHARD (true) or SHARD_GRAD_OP (false): free a unit after its forward?
  bool prefetch = true;               // gather the next unit while this one computes (backward_prefetch)
  bool sync = true;                   // false on accumulation micro-steps (no_sync): whole gradients add up, unreduced
};

// One rank's sharded model. A unit is a transformer block (or the embeddings, or the final LayerNorm); each
// rank holds 1/N of every unit's parameters, gradients and optimizer state between uses.
class Fsdp {
 public:
  virtual ~Fsdp() = default;
  virtual int num_units() const = 0;
  virtual int64_t numel(int unit) const = 0;  // the unit's parameters, whole
  // The root unit: the embeddings, whose forward encloses every other (its after_forward comes last: the
  // lm_head uses the tied embedding) and whose backward comes first. PyTorch FSDP's root instance.
  virtual int root() const = 0;
  // The order the previous step's forward (backward) reached the units in: before_forward (before_backward)
  // calls, the repeated ones once. Empty during the first step — PyTorch FSDP records its order the same way.
  virtual const std::vector<int>& forward_order() const = 0;
  virtual const std::vector<int>& backward_order() const = 0;

  virtual bool is_whole(int unit) = 0;
  // Starts all-gathering the unit's parameters and returns at once: the transfer overlaps whatever the
  // trainer computes next. Nothing happens when the unit is whole or already on its way.
  virtual void gather(int unit) = 0;
  // Returns when the unit's parameters are whole: waits for its gather (or gathers it now).
  virtual void wait(int unit) = 0;
  // Releases the whole parameters: the unit goes back to this rank's 1/N part. Refused while the unit's
  // forward or backward is running (between its before_ and after_ hooks).
  virtual void free(int unit) = 0;
  // After the unit's backward: its gradients averaged over ranks, this rank keeping its 1/N part, the whole
  // gradients released (asynchronous: overlaps the next unit's backward). Once per unit per step.
  virtual void reduce_scatter(int unit) = 0;
};

// Task 1 — forward: the unit's parameters must be whole when before_forward returns; after_forward decides
// whether they stay (FULL_SHARD frees them — except the root's, which backward needs first).
void before_forward(Fsdp& f, const Options& o, int unit);
void after_forward(Fsdp& f, const Options& o, int unit);
// Task 2 — backward: whole again before the unit's backward; after it, the gradients reduced and the
// parameters freed.
void before_backward(Fsdp& f, const Options& o, int unit);
void after_backward(Fsdp& f, const Options& o, int unit);
// Task 3 — prefetch (o.prefetch): in before_forward and before_backward, start the gather of the unit the
// trainer will need next, from the recorded order.

}  // namespace lab05

// The table the grader looks up in your plugin (defined at the bottom of fsdp.cpp).
constexpr int kLab05Abi = 1;
struct Lab05Plugin {
  int abi;  // kLab05Abi
  void (*before_forward)(lab05::Fsdp&, const lab05::Options&, int);
  void (*after_forward)(lab05::Fsdp&, const lab05::Options&, int);
  void (*before_backward)(lab05::Fsdp&, const lab05::Options&, int);
  void (*after_backward)(lab05::Fsdp&, const lab05::Options&, int);
};
extern "C" Lab05Plugin distlab_lab05;
