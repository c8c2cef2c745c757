// The layout ZeRO-2 and ZeRO-3 share (PyTorch FSDP's FlatParameter is the same idea): each unit of the
// model (a layer with parameters, a transformer block: Model::units()) is flattened, per weight-decay
// group, into one f32 vector padded to a multiple of N ranks, and rank r owns elements [r·S/N, (r+1)·S/N).
//
//   unit u, decayed:    [ u.w0 | u.w1 | pad ]     rank r's part: S/N elements, a Parameter of its own
//   unit u, undecayed:  [ u.b0 | u.b1 | pad ]     (AdamW decays a whole part or none of it)
//
// Per unit rather than one vector for the whole model (ZeRO-1's layout, zero1.h) because stages 2 and 3
// communicate unit by unit during backward (and, in stage 3, forward): each unit is one reduce-scatter and
// one all-gather. Padding is zero, adds nothing to a sum or a norm, and never lands in a parameter.
// Read next: staged.h (where a buffer crosses between host and device, and a collective goes to Gloo or NCCL).
#pragma once
#include <vector>

#include "core/dist/process_group.h"
#include "core/models/model.h"
#include "core/optim/optimizer.h"
#include "core/parallel/strategy.h"

namespace distlab {

struct FlatShard {
  int unit = 0;
  std::vector<Parameter*> params;  // in model order
  std::vector<int64_t> offset;     // where each starts in the flat vector
  int64_t numel = 0;               // the parameters' elements
  int64_t padded = 0;              // numel rounded up to a multiple of N
  int64_t shard = 0;               // padded / N: what each rank owns
  Parameter local;                 // this rank's part: data as the strategy keeps it; grad (S/N) once reduced
};

// The layout alone: for each unit (a list of parameters) and weight-decay group, its flat vector's
// parameters, offsets and sizes padded to a multiple of n ranks; local.decay set, nothing allocated.
std::vector<FlatShard> flat_layout(const std::vector<std::vector<Parameter*>>& units, int64_t n);

class UnitShards {
 public:
  // `local_cat`, `local_dtype`: where and how each rank keeps its part of the weights — optim_state f32 for
  // ZeRO-2 (the master copy), params in the run's dtype for ZeRO-3 (the only copy between uses).
  // min_params > 0: PyTorch FSDP's size_based_auto_wrap_policy — consecutive units (from unit 1; unit 0,
  // GPT's root with the tied embedding, stays alone) merge into one flat vector until it holds at least
  // min_params parameters. Then "unit" below means such a group; group_of() maps the model's units to them.
  UnitShards(Runtime& rt, ProcessGroup& pg, Model& model, const std::string& who, Category local_cat, DType local_dtype,
             int64_t min_params = 0);
  int group_of(int model_unit) const { return group_of_[size_t(model_unit)]; }
  int first_unit_of(int group) const { return first_unit_[size_t(group)]; }  // the lowest model unit in it

  std::vector<FlatShard>& all() { return shards_; }
  const std::vector<FlatShard>& all() const { return shards_; }
  std::vector<FlatShard*> of_unit(int unit);
  int num_units() const { return num_units_; }
  std::vector<Parameter*> locals();

  // The flat f32 vector of the shard's weights or gradients (zero for a parameter without one), padding zero.
  // `where`: the flat's device, the rank's own by default (cpu: a host vector on a cuda rank, lab 04's).
  static void pack(Runtime& rt, const FlatShard& s, float* flat, bool grads, DeviceKind where);
  static void pack(Runtime& rt, const FlatShard& s, float* flat, bool grads) { pack(rt, s, flat, grads, rt.device); }
  // Weights from a flat f32 vector into each parameter's data (in its dtype).
  static void unpack(Runtime& rt, FlatShard& s, const float* flat, DeviceKind where);
  static void unpack(Runtime& rt, FlatShard& s, const float* flat) { unpack(rt, s, flat, rt.device); }
  // The parts live on the rank's device, or — CPU offload on a cuda rank (local_cat host) — in host memory,
  // where the optimizer steps them with the host's kernels (HostKernels, core/tensor/runtime.h).
  // local.data := this rank's part of the parameters' present values (they must be whole here).
  void load_local(FlatShard& s);
  // Average the shard's gradients over ranks: this rank's part into local.grad (the run's dtype, category
  // grads), the whole gradients released — a rank keeps only its part once the unit is reduced.
  void reduce_gradients(FlatShard& s, Category part_category = Category::grads);
  // The same, overlapped with the backward of the units before it (as DDP's buckets are): issue_reduce
  // starts the reduce-scatter and releases the whole gradients; finish_reduces waits for every one issued
  // and stores each part. The strategies keep one unit in flight: they finish the last before issuing.
  void issue_reduce(FlatShard& s, Category part_category = Category::grads);
  void finish_reduces();
  // Every rank's parts, whole, as a flat f32 vector (comm_buffers): from local.data, or from `master`
  // (the optimizer's f32 copy of local) when there is one. Async: wait() before reading `flat`. A part that
  // lives in host memory (offload) is first copied to the device: `part` is that copy.
  // wire: the type the values travel in — the parameters' (bf16 under mixed precision: half the bytes,
  // and exact, since that is what they are unpacked into), f32 for the master weights of a save.
  std::shared_ptr<Work> gather_async(const FlatShard& s, Tensor& flat, Tensor& part, DType wire, const Tensor* master = nullptr);

  // The global gradient norm and the overflow check over every rank's parts (what the step will read).
  double grad_norm();
  bool found_inf(ProcessGroup* over = nullptr);  // over: a group holding this one's ranks (default: this one)
  ProcessGroup& group() { return pg_; }
  // CPU offload on a cuda rank: the parts are host memory, stepped with the host's kernels.
  bool parts_on_host() const;

 private:
  // Where a part of category c lives: host memory for CPU offload's on a cuda rank, else the rank's device.
  DeviceKind part_device(Category c) const;
  Runtime& rt_;
  ProcessGroup& pg_;
  std::string who_;
  std::vector<FlatShard> shards_;
  int num_units_ = 0;                                // groups (model units when nothing merges)
  std::vector<int> group_of_, first_unit_;
  struct Reduce {
    FlatShard* s;
    Category part_category;
    Tensor flat, part;
    std::shared_ptr<Work> work;
  };
  std::vector<Reduce> in_flight_;
};

// The global L2 norm from each rank's sum of squares of its own parts: a double sent as two floats (its
// high and low parts) through an f32 all_gather, so the norm keeps double precision.
double norm_over_ranks(ProcessGroup& pg, double my_sum_of_squares);

// For a save from the master weights (ZeRO-1 and 2, whose parts ARE the f32 masters): every rank's part of
// each flat vector all-gathered in f32, and lent to the parameters as whole f32 tensors; their own (16-bit)
// data waits in `set_aside` until restore_params puts it back.
void lend_masters(Runtime& rt, ProcessGroup& pg, std::vector<FlatShard>& flats, std::vector<Tensor>& set_aside);
void restore_params(std::vector<FlatShard>& flats, std::vector<Tensor>& set_aside);

// A split model's gradient norm over flat vectors sharded across the data-parallel group `dp`: the squares
// of this rank's parts, each element counted as its parameter counts in model_parallel_grad_norm (split
// tensors on every TP rank, whole ones on TP rank 0, a tied copy never), summed over dp, then over the TP
// and PP groups (either may be nullptr).
double split_flats_norm(Runtime& rt, ProcessGroup& dp, const std::vector<FlatShard>& flats, ProcessGroup* tp, ProcessGroup* pp);

// For a checkpoint: what rank `rank` owns of each flat vector, as slices of the parameters in it.
std::vector<std::vector<Strategy::Slice>> flat_slices(const std::vector<FlatShard>& flats, int rank);

// What ZeRO-2 and ZeRO-3 (and FSDP) share: the optimizer steps this rank's parts, and the gradient norm,
// the overflow check and zero_grad read them.
class ShardedStrategy : public Strategy {
 public:
  std::vector<Parameter*> optimizer_parameters(Model&) override { return shards_.locals(); }
  double grad_norm(Runtime&, Model&) override { return shards_.grad_norm(); }
  double split_grad_norm(Runtime& rt, Model&, ProcessGroup* tp, ProcessGroup* pp) override {
    return split_flats_norm(rt, shards_.group(), shards_.all(), tp, pp);
  }
  // MAX over every rank's parts: over the whole world (pg) where the model is split too
  bool found_inf(Runtime&, Model&, ProcessGroup* pg) override { return shards_.found_inf(pg); }
  void zero_grad(Model& model) override {
    model.zero_grad();
    for (auto& s : shards_.all()) s.local.grad = Tensor();  // a skipped step leaves no part behind
  }
  std::vector<std::vector<Slice>> optimizer_slices(Model&) override { return flat_slices(shards_.all(), rank_); }
  bool replicates_optimizer() const override { return false; }

 protected:
  ShardedStrategy(Runtime& rt, ProcessGroup& pg, Model& model, const std::string& who, Category local_cat, DType local_dtype,
                  int64_t min_params = 0)
      : shards_(rt, pg, model, who, local_cat, local_dtype, min_params), rank_(pg.rank()) {}
  UnitShards shards_;
  int rank_;
};

}  // namespace distlab
