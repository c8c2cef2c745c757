// The trainer's side of the device mesh (parallel.tp, parallel.pp, parallel.cp; core/parallel/mesh.h): the
// communication counted over every group. The whole model in and out of a split one (--init, --save) is
// trainer_weights.cpp; the loop itself trainer.cpp; the pipeline's schedule core/parallel/pipeline.h.
#include <map>

#include "core/train/trainer.h"

namespace distlab {

CommCounters Trainer::comm_totals() const {
  CommCounters t;
  for (const auto& [op, c] : comm_by_op()) t += c;
  return t;
}

std::map<std::string, CommCounters> Trainer::comm_by_op() const {
  std::map<std::string, CommCounters> all;
  std::vector<ProcessGroup*> groups;
  if (pg_) groups.push_back(pg_);
  if (mesh_)
    for (MeshAxis a : {MeshAxis::dp, MeshAxis::tp, MeshAxis::pp}) groups.push_back(&mesh_->group(a));
  if (ring_) {  // context parallel: the ring's blocks, and the strategy's reductions over dp × cp
    groups.push_back(&mesh_->group(MeshAxis::cp));
    groups.push_back(&mesh_->group(MeshAxis::dp_cp));
  }
  for (ProcessGroup* g : groups)
    for (const auto& [op, c] : g->counters()) all[op] += c;
  for (const auto* d : {device_group_.get(), tp_device_group_.get()})  // dist.backend = "nccl": collectives on the GPU
    if (d)
      for (const auto& [op, c] : d->get()->counters()) all[op] += c;
  return all;
}

}  // namespace distlab
