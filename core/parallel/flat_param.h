// The flat parameter (PyTorch FSDP's FlatParameter, DeepSpeed's flat partitions): the one layout ZeRO-1,
// ZeRO-2, ZeRO-3 and FSDP share. A list of parameters is flattened, per weight-decay group, into one f32
// vector padded to a multiple of N ranks, and rank r owns elements [r·S/N, (r+1)·S/N) of it:
//
//   unit u, decayed:    [ u.w0 | u.w1 | pad ]     rank r's part: S/N elements, a Parameter of its own
//   unit u, undecayed:  [ u.b0 | u.b1 | pad ]     (AdamW decays a whole part or none of it)
//
// ZeRO-1 flattens the whole model as one unit: it communicates once, after backward. ZeRO-2 and ZeRO-3
// flatten each unit of the model (Model::units(): a layer, a transformer block) on its own, because they
// communicate unit by unit during backward (and, in stage 3, forward): a unit is one reduce-scatter and one
// all-gather. FSDP's size-based wrap policy merges consecutive units into one flat vector: a "group" below.
// Padding is zero, adds nothing to a sum or a norm, and never lands in a parameter.
//
// This file is the layout and its views — pack a stretch of the flat vector out of the parameters, unpack
// one into them, keep this rank's part — and issues no reduce-scatter or all-gather: each stage's own file
// does (zero1.cpp, zero2.cpp, zero3.cpp). On the meta device (the planner's) every buffer is null and every
// view and copy does nothing, so the stages' code has no null checks.
// Read next: comm_buffers.h (where a buffer crosses between host and device, and a collective goes to Gloo or NCCL).
#pragma once
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/models/model.h"
#include "core/optim/optimizer.h"

namespace distlab {

struct FlatParam {
  int group = 0;                   // which of FlatParams' groups (a unit, or units wrapped together) it flattens
  std::vector<Parameter*> params;  // in model order
  std::vector<int64_t> offset;     // where each starts in the flat vector
  int64_t numel = 0;               // the parameters' elements
  int64_t padded = 0;              // numel rounded up to a multiple of N
  int64_t shard = 0;               // padded / N: what each rank owns
  Parameter local;                 // this rank's part: data as the strategy keeps it; grad (S/N) once reduced
};

// The layout alone: for each group (a list of parameters) and weight-decay group, its flat vector's
// parameters, offsets and sizes padded to a multiple of n ranks; local.decay set, nothing allocated.
std::vector<FlatParam> flat_layout(const std::vector<std::vector<Parameter*>>& groups, int64_t n);

// Elements [a, b) of the flat vector as f32 into `out` (b − a values on device `where`): the parameters'
// weights, or their gradients (zero for a parameter without one), and zero for the padding.
void pack(Runtime& rt, const FlatParam& f, int64_t a, int64_t b, float* out, bool grads, DeviceKind where);
// Elements [a, b) from `in` (f32 on `where`) into the parameters' data, in their dtype; the padding dropped.
void unpack(Runtime& rt, FlatParam& f, int64_t a, int64_t b, const float* in, DeviceKind where);
// the whole flat vector, on the rank's device
inline void pack(Runtime& rt, const FlatParam& f, float* out, bool grads) { pack(rt, f, 0, f.padded, out, grads, rt.device); }
inline void unpack(Runtime& rt, FlatParam& f, const float* in) { unpack(rt, f, 0, f.padded, in, rt.device); }

// One strategy's flat vectors, with this rank's part of each allocated.
class FlatParams {
 public:
  // Which parameters share a flat vector: the whole model (ZeRO-1), each unit of the model (ZeRO-2, 3), or
  // FSDP's size_based_auto_wrap_policy (min_params > 0): consecutive units (from unit 1; unit 0, GPT's
  // root with the tied embedding, stays alone) merge until a group holds at least min_params parameters.
  enum class Wrap { whole_model, per_unit };
  // `local_cat`, `local_dtype`: where and how each rank keeps its part of the weights — optim_state f32 for
  // ZeRO-1 and 2 (the master copy), params in the run's dtype for ZeRO-3 (the only copy between uses), host
  // under CPU offload (on a cuda rank that is host memory, stepped with the host's kernels).
  // `shard_frozen` (ZeRO-3, FSDP): the frozen parameters (LoRA's base) are sharded too, in flat vectors of
  // their own beside each group's trainable ones (FSDP's use_orig_params: frozen and trainable in one
  // unit), gathered and freed with them but never reduced or stepped. Otherwise they stay whole on every rank.
  FlatParams(Runtime& rt, ProcessGroup& pg, Model& model, const std::string& who, Wrap wrap, Category local_cat, DType local_dtype,
             int64_t min_params = 0, bool shard_frozen = false);
  int group_of(int unit) const { return group_of_[size_t(unit)]; }          // a model unit's group
  int first_unit_of(int group) const { return first_unit_[size_t(group)]; }  // the lowest model unit in it
  int num_groups() const { return int(first_unit_.size()); }

  std::vector<FlatParam>& all() { return flats_; }
  const std::vector<FlatParam>& all() const { return flats_; }
  std::vector<FlatParam*> of_group(int group);  // the trainable flat vectors: what is reduced and stepped
  // ... and the frozen ones (shard_frozen): everything a group's forward and backward read
  std::vector<FlatParam*> of_group_all(int group);
  std::vector<FlatParam>& frozen() { return frozen_; }
  std::vector<Parameter*> locals();
  ProcessGroup& group() { return pg_; }

  // local.data := this rank's part of the parameters' present values (they must be whole here).
  void load_local(FlatParam& f);
  // The reduced gradient part (`part`: S/N f32 on the rank's device) kept as local.grad, in the run's
  // dtype, as category `cat` (grads; host under CPU offload).
  void keep_grad_part(FlatParam& f, const Tensor& part, Category cat);
  // This rank's part as an all-gather sends it: f32 on the rank's device, from local.data or from `master`
  // (the optimizer's f32 copy of local) when there is one. A part in 16 bits or in host memory is first
  // copied into `up` (made here).
  const float* part_to_send(const FlatParam& f, Tensor& up, const Tensor* master = nullptr);

  // The global gradient norm and the overflow check over every rank's parts (what the step will read).
  double grad_norm();
  bool found_inf(ProcessGroup* over = nullptr);  // over: a group holding this one's ranks (default: this one)
  bool parts_on_host() const;                   // CPU offload on a cuda rank: the parts are host memory

 private:
  Runtime& rt_;
  ProcessGroup& pg_;
  std::string who_;
  std::vector<FlatParam> flats_;
  std::vector<FlatParam> frozen_;  // shard_frozen: the frozen parameters' flat vectors, by the same groups
  std::vector<int> group_of_, first_unit_;
};

// The global L2 norm from each rank's sum of squares of its own parts: a double sent as two floats (its
// high and low parts) through an f32 all_gather, so the norm keeps double precision.
double norm_over_ranks(ProcessGroup& pg, double my_sum_of_squares);

// A split model's gradient norm over flat vectors sharded across the data-parallel group `dp`: the squares
// of this rank's parts, each element counted as its parameter counts in model_parallel_grad_norm (split
// tensors on every TP rank, whole ones on TP rank 0, a tied copy never), summed over dp, then over the TP
// and PP groups (either may be nullptr).
double split_flats_norm(Runtime& rt, ProcessGroup& dp, const std::vector<FlatParam>& flats, ProcessGroup* tp, ProcessGroup* pp);

}  // namespace distlab
