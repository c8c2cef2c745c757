// The device mesh of 4D parallelism: world = dp × cp × tp × pp ranks, laid out as Megatron-LM and torchtitan
// lay them out — tensor-parallel ranks fastest-varying, then context-parallel, then data-parallel, then
// pipeline stages:
//
//   rank = tp_rank + tp · (cp_rank + cp · (dp_rank + dp · pp_rank))
//
//   world 8, dp 2 × tp 2 × pp 2:       pp stage 0            pp stage 1
//                                     dp 0     dp 1         dp 0     dp 1
//                         tp 0, 1:   [0, 1]   [2, 3]       [4, 5]   [6, 7]
//
// So a TP group is consecutive ranks — on one node, where its all-reduces (two per layer, every step) can
// use NVLink — a CP group (its ring passes every layer's keys and values) strides by tp, a DP group by
// tp·cp, and a PP group by tp·cp·dp: the stages of a pipeline sit on different nodes, where only
// activations cross (point to point, once per micro-batch). The course's chapter 8: TP inside a node, PP
// across nodes, DP over what is left. The ranks of a CP group hold the same weights and one batch's
// different tokens, so the gradients are reduced over the dp × cp group (MeshAxis::dp_cp; torchtitan's
// dp_shard_cp), which is the dp group when cp is 1.
// Read next: tensor_parallel.h (the layers a TP group runs), context_parallel.h (the ring a CP group runs).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/comm/process_group.h"

namespace distlab {

struct MeshShape {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int world() const { return dp * tp * pp * cp; }
};

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0, cp = 0;
  // the first replica of the weights (a dp and cp coordinate of 0): the rank that writes what replicas share
  bool first_replica() const { return dp == 0 && cp == 0; }
};

// dp_cp: the ranks that hold the same weights (dp × cp), over which gradients are reduced
enum class MeshAxis { dp, tp, pp, cp, dp_cp };
const char* axis_name(MeshAxis a);

MeshCoord coord_of(int rank, const MeshShape& s);
int rank_of(const MeshCoord& c, const MeshShape& s);
// The ranks of `rank`'s group along `axis`, in the axis's order (its member with coordinate 0 first).
std::vector<int> group_ranks(int rank, const MeshShape& s, MeshAxis axis);

// dp, tp and pp for `world` ranks, with `cp` (stated, ≥ 1): 0 means "what the others leave" (at most one
// may be 0; all 0: dp = world / cp). ConfigError naming the keys when the product is not the world, or a
// size is not positive.
MeshShape resolve_mesh(int world, int64_t dp, int64_t tp, int64_t pp, int64_t cp = 1);

// The mesh on this rank: its coordinate and one process group per axis (subgroups of `world`).
class Mesh {
 public:
  Mesh(ProcessGroup& world, const MeshShape& shape);
  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  ProcessGroup& group(MeshAxis a);
  std::string describe() const;  // "dp 2 × tp 2 × pp 2; this rank: dp 1, tp 0, pp 1"

 private:
  MeshShape shape_;
  MeshCoord coord_;
  std::unique_ptr<ProcessGroup> tp_, dp_, pp_, cp_, dp_cp_;  // cp_ and dp_cp_ only when cp > 1
};

}  // namespace distlab
