// The trainer's side of the device mesh (parallel.tp, parallel.pp; core/parallel/mesh.h): the
// communication counted over every group, and the whole model moved in and out of a split one (--init,
// --save). The loop itself is trainer.cpp; the pipeline's schedule core/parallel/pipeline.h.
#include <fmt/format.h>

#include <map>
#include <set>

#include "core/ckpt/safetensors.h"
#include "core/models/zoo.h"
#include "core/parallel/tensor_parallel.h"
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
  for (ProcessGroup* g : groups)
    for (const auto& [op, c] : g->counters()) all[op] += c;
  for (const auto* d : {device_group_.get(), tp_device_group_.get()})  // dist.backend = "nccl": collectives on the GPU
    if (d)
      for (const auto& [op, c] : d->get()->counters()) all[op] += c;
  return all;
}

// --init under tensor or pipeline parallelism: the file holds the whole model; each rank takes its stage's
// parameters, and its slices of the split ones
// The whole model of --init and --save lives on the host (f32, its own accountant, only for the call):
// a cuda rank's split model reads and writes it through OnHost and Tensor::to_host/from_host.
static DeviceKind whole_model_device(DeviceKind d) { return d == DeviceKind::cuda ? DeviceKind::cpu : d; }

void Trainer::load_whole_model(const std::string& path) {
  Runtime side(whole_model_device(rt_.device));
  auto whole = build_model(side, spec_);
  load_model(*whole, path);
  ProcessGroup& tp = mesh_->group(MeshAxis::tp);
  load_split_params(model_->parameters(), whole->parameters(), tp.rank(), tp.size());
  std::map<std::string, Buffer*> bufs;
  for (Buffer* b : whole->buffers()) bufs[b->name] = b;
  for (Buffer* b : model_->buffers())
    if (b->data.data()) b->data.from_host(bufs.at(b->name)->data.data());  // the same dtype (f32 statistics)
  log_ << "loaded weights from " << path << " (this rank's part of them)\n";
}

// --save under tensor or pipeline parallelism: each stage's TP group gathers its slices (from the f32
// masters) into whole tensors, the stages' first ranks send theirs to rank 0, and rank 0 writes the whole
// model — the same file a one-rank run writes, loadable by PyTorch
void Trainer::save_whole_model(const std::string& path, DType dtype) {
  Runtime side(whole_model_device(rt_.device));
  auto whole = build_model(side, spec_);
  gather_split_params(mesh_->group(MeshAxis::tp), model_->parameters(), whole->parameters(), opt_.get());
  // every tensor of the whole model (parameters, then buffers) and whether this stage holds it
  std::vector<std::pair<std::string, Tensor*>> all;
  std::set<std::string> mine;
  for (Parameter* p : whole->parameters()) all.push_back({p->name, &p->data});
  for (Buffer* b : whole->buffers()) all.push_back({b->name, &b->data});
  for (Parameter* p : model_->parameters())
    if (p->tied.empty()) mine.insert(p->name);
  std::map<std::string, Tensor*> by_name(all.begin(), all.end());
  for (Buffer* b : model_->buffers()) {  // every rank's own BatchNorm statistics; rank 0's (and its stage's) are saved
    mine.insert(b->name);
    if (b->data.data()) b->data.to_host(by_name.at(b->name)->data());
  }
  if (pipeline_ && mesh_->coord().dp == 0 && mesh_->coord().tp == 0) {
    // the stages' first ranks send rank 0 what they hold, in the whole model's order
    const std::string key = fmt::format("save/{}/stage/", path);
    if (pipeline_->stage() > 0) {
      nlohmann::json names = nlohmann::json::array();
      for (const auto& [name, t] : all)
        if (mine.count(name)) names.push_back(name);
      pg_->store().set_string(key + std::to_string(pipeline_->stage()), names.dump());
      for (const auto& [name, t] : all)
        if (mine.count(name)) pg_->send(t->f32(), t->numel(), 0, 5);
    } else {
      for (int s = 1; s < pipeline_->stages(); s++) {
        const int from = rank_of(MeshCoord{0, 0, s}, mesh_->shape());
        for (const auto& n : nlohmann::json::parse(pg_->store().get_string(key + std::to_string(s)))) {
          Tensor* t = by_name.at(n.get<std::string>());
          pg_->recv(t->f32(), t->numel(), from, 5);
        }
      }
    }
  }
  if (is_rank0()) {
    save_model(*whole, path, dtype);
    log_ << "saved weights to " << path << " (" << dtype_name(dtype) << ", gathered from " << mesh_->shape().tp << " tensor-parallel rank(s) x "
         << mesh_->shape().pp << " stage(s))\n";
  }
}

}  // namespace distlab
